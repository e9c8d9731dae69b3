"""The GPU defaults (issue 19) under real `horovodrun -np 2 --gloo` (tests/multirank/gpu_defaults_job.py): 2 ranks x
half batch against one process on the full batch and the numpy references of tests/reference.py.

- whole-step XLA with Horovod's collectives: the clear ValueError on both ranks, no weight changed, no hang;
- Keras 2's per-variable XLA update (jit_compile set on the optimizer Horovod rebuilt): ranks identical, 1e-5 from
  one process and from the numpy Caffe2 reference (float32);
- mixed_float16 (LossScaleOptimizer; Keras 2 with the XLA update too): ranks identical; 1e-3 from the numpy
  reference fed each rank's float16 gradients averaged (`sharded_grad_fn`), as Horovod averages them; the single
  process 1e-3 from the reference on full-batch float16 gradients (seen up to 1.2e-5; the bound of
  tests/keras/test_gpu_defaults.py, whose module docstring explains it: the reference's float64 update can move a
  weight across a float16 rounding boundary of the forward pass, and the runs then drift apart, up to 2.3e-4 seen
  there). Between the two, and against float64, 5e-3: a rank's float16 forward/backward pass over 8 rows rounds
  differently from one over 16 (float16 keeps 11 significant bits, ~5e-4 relative per gradient). A missed
  correction moves the weights by 0.36 to 0.68;
- and every step of both runs from their own weights: the reference's step on the same float16 gradients to 1e-6
  (where a correction is exact or not; see `momentum_step_residuals`);
- a step skipped for an overflow in one rank's half only: both ranks skip it and take its correction later.
"""

import pathlib
import sys

import numpy as np
import pytest

from launch import horovodrun_cmd, run_and_collect
import rows

# One Keras 2 row and the Keras 3 row (tests/rows.py):
# Keras 3: its loss scaling and hvd_sched's skip agreement across ranks.
pytestmark = [pytest.mark.multirank, pytest.mark.depends_on(*rows.KERAS_PATH)]

JOB = pathlib.Path(__file__).with_name("gpu_defaults_job.py").read_text()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Both runs once for the module (each launch imports TensorFlow on every rank)."""
    work = tmp_path_factory.mktemp("gpu_defaults_ranks")
    results = {}
    for mode, np_ in (("ranks", 2), ("single", 1)):
        folder = work / mode
        folder.mkdir()
        script = folder / "gpu_defaults_job.py"
        script.write_text(JOB)
        cmd = (horovodrun_cmd(np_, script, [mode]) if mode == "ranks" else
               [sys.executable, str(script), mode, str(work / "ranks" / "rank0.json")])
        results[mode], _ = run_and_collect(cmd, folder, np_, 300, None)
    return results["ranks"], results["single"][0]


def _diff(a, b):
    return max(float(np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64)).max()) for p, q in zip(a, b))


def _assert_ranks_identical(ranks, phase):
    for w0, w1 in zip(ranks[0][phase]["weights"], ranks[1][phase]["weights"]):
        np.testing.assert_array_equal(np.array(w0), np.array(w1))


def _assert_steps(single, phase, skipped=None):
    """Every step of the ranks' and of the single process's run, from their own weights, is the reference's step
    on the same float16 gradients (`momentum_step_residuals`, computed by the single job): 1e-6; a skipped step
    leaves the weights exactly in place."""
    for who, residuals in single[phase]["residuals"].items():
        print(phase, who, "max one-step residual", max(residuals))
        assert max(residuals) < 1e-6, (who, residuals)
        if skipped is not None:
            assert residuals[skipped] == 0.0, (who, residuals[skipped])


def test_whole_step_xla_with_horovod_stops_on_every_rank(jobs):
    ranks, _ = jobs
    for rank in ranks:
        step = rank["xla_step"]
        assert step["jit_compile"] is True
        assert step["error"] is not None and "jit_compile=False" in step["error"], step["error"]
        assert "hvd_sched: the whole train step is XLA-compiled" in step["error"], step["error"]
        assert step["unchanged"] and step["iterations"] == 0


def test_per_variable_xla_update_two_ranks(jobs):
    ranks, single = jobs
    if "xla_update" not in single:
        pytest.skip("Keras 3 optimizers have no per-variable XLA update (no jit_compile, no _update_step_xla)")
    _assert_ranks_identical(ranks, "xla_update")
    for result in (*ranks, single):
        assert result["xla_update"]["traces"] > 0 and result["xla_update"]["iterations"] == 30
        assert result["xla_update"]["class"] == "ScheduledSGD"
    assert ranks[0]["xla_update"]["lr"] == ranks[0]["lr_expected"]
    diffs = {"ranks_vs_single": _diff(ranks[0]["xla_update"]["weights"], single["xla_update"]["weights"]),
             "ranks_vs_reference": _diff(ranks[0]["xla_update"]["weights"], single["xla_update"]["reference"]),
             "single_vs_reference": _diff(single["xla_update"]["weights"], single["xla_update"]["reference"])}
    print("xla_update", diffs)
    assert max(diffs.values()) < 1e-5, diffs


def test_mixed_float16_two_ranks(jobs):
    ranks, single = jobs
    _assert_ranks_identical(ranks, "mixed")
    for result in (*ranks, single):
        assert "LossScaleOptimizer" in result["mixed"]["class"] and result["mixed"]["iterations"] == 30
    assert ranks[0]["mixed"]["lr"] == ranks[1]["mixed"]["lr"] == ranks[0]["lr_expected"]
    reference = single["mixed"]["reference"]
    got, one = ranks[0]["mixed"]["weights"], single["mixed"]["weights"]
    diffs = {"ranks_vs_reference_two_ranks_float16": _diff(got, reference["two_ranks"]),
             "single_vs_reference_full_batch_float16": _diff(one, reference["full_batch"]),
             "ranks_vs_single": _diff(got, one), "ranks_vs_reference_float64": _diff(got, reference["float64"])}
    print("mixed", diffs, "without corrections", _diff(got, reference["no_corrections"]))
    _assert_steps(single, "mixed")
    assert diffs["ranks_vs_reference_two_ranks_float16"] < 1e-3, diffs
    assert diffs["single_vs_reference_full_batch_float16"] < 1e-3, diffs
    assert diffs["ranks_vs_single"] < 5e-3 and diffs["ranks_vs_reference_float64"] < 5e-3, diffs
    assert _diff(got, reference["no_corrections"]) > 1e-2  # the bounds above would catch a missed correction


def test_mixed_float16_step_skipped_for_one_rank_is_skipped_by_both(jobs):
    """Global batch 10 overflows in rank 1's half only: both ranks skip it (the LossScaleOptimizer sees the averaged,
    non-finite gradients), stay identical, and take the 0.1 correction of iteration 10 at their next applied step
    (Keras 2 counts the skipped step in `iterations`, Keras 3 does not)."""
    ranks, single = jobs
    _assert_ranks_identical(ranks, "mixed_skip")
    keras2 = "xla_update" in single
    for result in (*ranks, single):
        skip = result["mixed_skip"]
        assert skip["loss_scale"] == 2.0 ** 14  # one skip, on every rank
        assert skip["iterations_after"][9:11] == ([10, 11] if keras2 else [10, 10])
        assert skip["iterations"] == (30 if keras2 else 29)
    reference = single["mixed_skip"]["reference"]
    got, one = ranks[0]["mixed_skip"]["weights"], single["mixed_skip"]["weights"]
    assert reference["two_ranks"][1] == ranks[0]["mixed_skip"]["iterations"]
    diffs = {"ranks_vs_reference_two_ranks_float16": _diff(got, reference["two_ranks"][0]),
             "single_vs_reference_full_batch_float16": _diff(one, reference["full_batch"][0]),
             "ranks_vs_single": _diff(got, one)}
    print("mixed_skip", diffs, "correction lost", _diff(got, reference["correction_lost"][0]))
    _assert_steps(single, "mixed_skip", skipped=10)
    assert diffs["ranks_vs_reference_two_ranks_float16"] < 1e-3, diffs
    assert diffs["single_vs_reference_full_batch_float16"] < 1e-3, diffs
    assert diffs["ranks_vs_single"] < 5e-3, diffs
    assert _diff(got, reference["correction_lost"][0]) > 1e-2
