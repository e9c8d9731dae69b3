"""Gradient accumulation, exact (issue 24): k micro-batches per update, on 1 process and 2 real Gloo ranks, every
path a user writes (ITER_SIZE, hvd_sched's DistributedOptimizer(backward_passes_per_step=k), Horovod's own Keras 2
wrapper, Keras 3's gradient_accumulation_steps, build_optimizer), against the numpy re-derivation of Detectron's
Caffe2 update on the full 32-row batch of each iteration: the schedule, its momentum corrections, the logged LR
and a resume all count updates, never micro-batches.

One horovodrun job per rank count trains every variant in turn (tests/multirank/accumulation_job.py), so the 2 x
~3 s of TensorFlow start-up is paid once per job, not once per variant.
"""

import json
import pathlib

import numpy as np
import pytest

from launch import horovodrun_cmd, run_and_collect
from rankutil import make_regression
from reference import caffe2_group, detectron_corrections, detectron_lr, mlp_grads, train_caffe2_sgd
from stackutil import KERAS_MAJOR
import rows

# One Keras 2 row and the Keras 3 row (tests/rows.py):
# Keras 3 counts iterations and accumulates natively (gradient_accumulation_steps).
pytestmark = [pytest.mark.multirank, pytest.mark.depends_on(*rows.KERAS_PATH)]

JOB = pathlib.Path(__file__).with_name("accumulation_job.py")
GLOBAL, UPDATES, EPOCHS = 32, 4, 4
N_ITERS = UPDATES * EPOCHS
SOLVER = {"BASE_LR": 0.1, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 8, 12], "MAX_ITER": N_ITERS,
          "WARM_UP_ITERS": 3, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "constant"}
# The Keras-version path: Horovod's own wrapper on Keras 2, Keras 3's own accumulation argument on Keras 3.
NATIVE = "horovod" if KERAS_MAJOR == 2 else "keras3"
SINGLE = ["iter_size:1", "iter_size:2", "iter_size:4", "iter_size:1:nesterov", "iter_size:4:nesterov", "build:1",
          "build:2", f"{NATIVE}:2"] + (["iter_size:2:xla"] if KERAS_MAJOR == 2 else [])
RANKS = ["iter_size:1", "iter_size:2", "iter_size:4", "bpps:2", "summed:2", "options:2", f"{NATIVE}:2",
         f"{NATIVE}:4", "iter_size:2:nesterov", "build:2", "iter_size:2:resume", "iter_size:1:timeline",
         "iter_size:2:timeline"] + (["iter_size:2:xla", "legacy:2"] if KERAS_MAJOR == 2 else [])


def _run(tmp_path_factory, np_, specs):
    out = tmp_path_factory.mktemp(f"accumulation{np_}")
    script = out / "accumulation_job.py"
    script.write_text(JOB.read_text())
    results, _ = run_and_collect(horovodrun_cmd(np_, script, specs), out, np_, 600,
                                 {"HOROVOD_TIMELINE": "DYNAMIC"})
    return results, out


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return _run(tmp_path_factory, 1, SINGLE)[0][0]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return _run(tmp_path_factory, 2, RANKS)


def _reference(result, spec, ranks=1):
    """Detectron's Caffe2 MomentumSGD over the full 32-row batch of every iteration, from the run's initial weights."""
    x, y = make_regression(n=GLOBAL * UPDATES, seed=3)
    batches = [(x[i * GLOBAL:(i + 1) * GLOBAL], y[i * GLOBAL:(i + 1) * GLOBAL]) for i in range(UPDATES)] * EPOCHS
    build = spec.startswith("build")
    groups = [caffe2_group(name) for name in result["names"]] if build else ["weight"] * 4
    # Sums instead of averages: over the k micro-batches, and (op=Sum) over the 2 ranks.
    summed = _k(spec) * ranks if spec.startswith("summed") else 1
    grad_fn = (lambda p, x, y: [summed * g for g in mlp_grads(p, x, y)]) if summed > 1 else mlp_grads
    return train_caffe2_sgd([np.array(w) for w in result["initial"]], batches,
                            [detectron_lr(it, SOLVER) for it in range(N_ITERS)], detectron_corrections(N_ITERS, SOLVER),
                            0.9, grad_fn, groups, nesterov="nesterov" in spec,
                            weight_decay=0.01 if build else 0.0)


def _assert_close(weights, expected, what):
    """Each tensor within 1e-5 of the expected one, relative to its norm."""
    for w, want in zip(weights, expected):
        w, want = np.array(w, np.float64), np.array(want, np.float64)
        error = np.linalg.norm(w - want) / np.linalg.norm(want)
        assert error <= 1e-5, f"{what}: relative error {error:.2e}"


def _k(spec):
    return int(spec.split(":")[1])


@pytest.mark.parametrize("spec", SINGLE)
def test_one_process_equals_caffe2_on_the_full_batch(single, spec):
    result = single[spec]
    _assert_close(result["weights"], _reference(result, spec), spec)
    # The reference run, k = 1, and the accumulating ones: the same model after the same 16 updates.
    if spec.startswith("iter_size") and "nesterov" not in spec:
        _assert_close(result["weights"], single["iter_size:1"]["weights"], f"{spec} vs iter_size:1")


@pytest.mark.parametrize("spec", RANKS)
def test_two_ranks_are_identical_and_equal_caffe2_on_the_full_batch(ranks, single, spec):
    results, _ = ranks
    r0, r1 = results[0][spec], results[1][spec]
    for w0, w1 in zip(r0["weights"], r1["weights"]):
        np.testing.assert_array_equal(np.array(w0), np.array(w1))
    _assert_close(r0["weights"], _reference(r0, spec, ranks=2), spec)
    if spec.startswith(("iter_size", "bpps", "options", "legacy", NATIVE)) and "nesterov" not in spec:
        _assert_close(r0["weights"], single["iter_size:1"]["weights"], f"{spec} vs one process at k = 1")


@pytest.mark.parametrize("spec", RANKS)
def test_the_logged_learning_rate_is_the_updates_not_the_micro_batches(ranks, spec):
    """LearningRateLogger: micro-batch m of update m // k logs that update's LR; each epoch the LR of its last
    update; iterations counts updates on Keras 3 and micro-batches on Keras 2 (Horovod's helper advances it)."""
    result = ranks[0][0][spec]
    k = _k(spec)
    lrs = [float(detectron_lr(it, SOLVER)) for it in range(N_ITERS)]
    assert result["batch_lr"] == [lrs[m // k] for m in range(N_ITERS * k)]
    assert result["epoch_lr"] == [lrs[(epoch + 1) * UPDATES - 1] for epoch in range(EPOCHS)]
    counted = N_ITERS * (k if KERAS_MAJOR == 2 and k > 1 else 1)
    assert result["raw_iterations"] == counted
    if "resume" in spec:
        # EpochCheckpoint's meta counts updates; the resumed run's first update is a correction (STEPS 8).
        assert result["checkpoint_iteration"] == 2 * UPDATES == SOLVER["STEPS"][1]
        assert 2 * UPDATES in detectron_corrections(N_ITERS, SOLVER)


def _gradient_allreduces(path):
    """The ALLREDUCEs of the first Dense kernel's gradient (float32 [5, 8]: no other tensor has that shape) in a
    Horovod timeline, and every ALLREDUCE."""
    text = path.read_text().strip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    ends = [e for e in events if e.get("ph") == "E" and "shape" in (e.get("args") or {})]
    kernel = [e for e in ends if e["args"].get("dtype") == "float32" and json.loads(e["args"]["shape"]) == [5, 8]]
    return len(kernel), len(ends)


def test_accumulation_communicates_once_per_update(ranks):
    """A Horovod timeline: the gradient allreduce runs once per update (16), not once per micro-batch (32), and
    k = 2 sends exactly the collectives of k = 1."""
    _, out = ranks
    kernel1, all1 = _gradient_allreduces(out / "accumulation_job.py.iter_size:1:timeline.json")
    kernel2, all2 = _gradient_allreduces(out / "accumulation_job.py.iter_size:2:timeline.json")
    assert kernel1 == kernel2 == N_ITERS
    assert all1 == all2
