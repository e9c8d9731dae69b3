"""`bench/overhead.py --quick`, `bench/apply_loop.py --quick`, `bench/conv_net.py --quick`, `bench/accumulation.py
--quick`, `bench/preemption.py --quick`, `bench/scale.py --quick` and `bench/large_batch.py --quick` run and report
(the benchmarks are not tests: no timing or accuracy is asserted, only that the scripts finish and their outputs
have the documented form). Each runs under this test's Python, so every row of the support matrix checks its own
form (Keras 2 rows: the XLA rows; Keras 3: the floor rows)."""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

from hvd_sched._compat import keras_major  # no TensorFlow import

ROOT = pathlib.Path(__file__).resolve().parent.parent

KERAS_MAJOR = keras_major()
if KERAS_MAJOR == 2:
    OVERHEAD_VARIANTS = {"baseline", "horovod_callbacks", "keras_schedule", "hvd_sched_optimizer",
                         "hvd_sched_callback", "baseline_spe16", "hvd_sched_optimizer_spe16", "baseline_xla",
                         "hvd_sched_optimizer_xla", "baseline_xla_spe16", "hvd_sched_optimizer_xla_spe16"}
    OVERHEAD_NOT_APPLICABLE = {"horovod_callbacks_spe16", "hvd_sched_callback_spe16"}
    OVERHEAD_EXTRA_ROWS = set()
    OVERHEAD_TARGETS = {"hvd_sched_optimizer", "hvd_sched_optimizer_spe16", "hvd_sched_optimizer_xla",
                        "hvd_sched_optimizer_xla_spe16"}
    TIMELINE_VARIANTS = ["baseline", "hvd_sched_optimizer", "hvd_sched_optimizer_xla"]
    CONSTANT_LR = {"baseline", "baseline_spe16", "baseline_xla", "baseline_xla_spe16"}
else:
    OVERHEAD_VARIANTS = {"baseline", "keras_schedule", "hvd_sched_optimizer", "hvd_sched_callback", "floor",
                         "baseline_spe16", "hvd_sched_optimizer_spe16", "floor_spe16"}
    OVERHEAD_NOT_APPLICABLE = {"horovod_callbacks", "horovod_callbacks_spe16", "hvd_sched_callback_spe16",
                               "baseline_xla", "hvd_sched_optimizer_xla"}
    OVERHEAD_EXTRA_ROWS = {"distributed_vs_floor", "distributed_vs_floor_spe16"}
    OVERHEAD_TARGETS = {"hvd_sched_optimizer", "hvd_sched_optimizer_spe16"} | OVERHEAD_EXTRA_ROWS
    TIMELINE_VARIANTS = ["floor", "baseline", "hvd_sched_optimizer"]
    CONSTANT_LR = {"baseline", "baseline_spe16", "floor", "floor_spe16"}
VERDICTS = {"confirmed", "refuted", "undecided"}
RATIO_KEYS = ("ratio_median", "ratio_min", "ratio_paired_median", "extra_us", "extra_us_paired")


def _run_script(name, *args, timeout):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    completed = subprocess.run([sys.executable, str(ROOT / "bench" / name), *map(str, args)], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=timeout, check=False)
    assert completed.returncode == 0, f"{name} exited {completed.returncode}\n--- stdout ---\n" \
                                      f"{completed.stdout[-5000:]}\n--- stderr ---\n{completed.stderr[-5000:]}"
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _check_row(row, where):
    """A compared row: times, every statistic with an interval that contains it, the target's verdict."""
    assert row["median_ms"] > 0 and row["min_ms"] > 0 and row["min_ms"] <= row["median_ms"], where
    for key in RATIO_KEYS:  # every statistic has its interval
        low, high = row[key + "_ci95"]
        assert low <= row[key] <= high, (where, key)
        if not key.startswith("extra_us"):
            assert 0 < low, (where, key)
    if "target" in row:
        assert row["target"] == 1.02 and row["verdict"] in VERDICTS, where


def _check_machine(machine):
    for key in ("nproc", "cpu", "python", "tensorflow", "keras", "horovod", "stack_row", "git"):
        assert machine[key], key
    assert len(machine["git"]["commit"]) == 40


@pytest.mark.timeout(600)  # measured 40-80 s on 2 cores (its fixtures' runs included)
@pytest.mark.slow
@pytest.mark.multirank
def test_overhead_quick_reports_ratios_and_equal_communication(tmp_path):
    out = tmp_path / "overhead.json"
    last = _run_script("overhead.py", "--quick", "--out", out, "--raw-dir", tmp_path / "raw", timeout=400)
    assert set(last) == {"ranks1", "ranks2"}
    for ranks, ratios in last.items():
        assert set(ratios) == OVERHEAD_VARIANTS | OVERHEAD_EXTRA_ROWS, ranks
        assert all(ratios[name] == 1.0 for name in CONSTANT_LR), ratios
        assert all(isinstance(r, float) and math.isfinite(r) and r > 0 for r in ratios.values()), ratios
    report = json.loads(out.read_text())
    _check_machine(report["machine"])
    assert report["keras_major"] == KERAS_MAJOR
    for ranks in ("ranks1", "ranks2"):
        assert set(report[ranks]) == set(report["cpu"][ranks]) == \
            OVERHEAD_VARIANTS | OVERHEAD_NOT_APPLICABLE | OVERHEAD_EXTRA_ROWS
        for name in OVERHEAD_VARIANTS | OVERHEAD_EXTRA_ROWS:  # the same rows in process CPU time
            _check_row(report["cpu"][ranks][name], ("cpu", ranks, name))
        for name in OVERHEAD_NOT_APPLICABLE:
            reason = report[ranks][name]["not_applicable"]
            keras3_only = KERAS_MAJOR == 3 and name.startswith("horovod")
            assert ("XLA" if "xla" in name else "Keras 3" if keras3_only else "Python") in reason, name
        for name in OVERHEAD_VARIANTS | OVERHEAD_EXTRA_ROWS:
            row = report[ranks][name]
            _check_row(row, (ranks, name))
            assert ("target" in row) == (name in OVERHEAD_TARGETS), (ranks, name)
        for name in OVERHEAD_VARIANTS:
            reference = ("floor" if name.startswith("floor") else "baseline") + ("_xla" if "_xla" in name else "") \
                + ("_spe16" if name.endswith("_spe16") else "")
            assert report[ranks][name]["reference"] == reference, (ranks, name)
        for name in OVERHEAD_EXTRA_ROWS:  # Keras 3: hvd_sched's DistributedOptimizer against the floor
            assert report[ranks][name]["reference"] == name.replace("distributed_vs_", ""), name
            assert ("note" in report[ranks][name]) == (ranks == "ranks1"), name  # no collective at size 1
        assert len(report["seconds_per_step"][ranks]["baseline_spe16"]) == report["settings"]["rounds"]
        assert len(report["cpu_seconds_per_step"][ranks]["baseline_spe16"]) == report["settings"]["rounds"]
    assert report["steps_per_execution"]["hvd_sched_optimizer_spe16"] == 16
    assert all(report["jit_compile_optimizer"][name] == ("_xla" in name) for name in OVERHEAD_VARIANTS)
    raw = list((tmp_path / "raw").glob("*_overhead_*.json"))
    assert len(raw) == 1 and json.loads(raw[0].read_text())["seconds_per_step"] == report["seconds_per_step"]
    assert raw[0].with_suffix(".md").read_text().count("| hvd_sched_optimizer (/ baseline) |") == 4  # wall, CPU
    # The wrapper leaves Horovod's communication alone: same collectives and bytes per step as the baseline.
    timeline = report["timeline"]
    assert timeline["identical"] is True and timeline["compared"] == TIMELINE_VARIANTS
    for variant in TIMELINE_VARIANTS:
        assert timeline[variant]["ops_per_step"]["ALLREDUCE"] == 4  # kernel and bias of two Dense layers
        assert timeline[variant]["allreduce_bytes_per_step"] == 4 * (32 * 64 + 64 + 64 * 2 + 2)
    # Every scheduled variant ends a round at BASE_LR * GAMMA ** 2 (the same schedule shape).
    for ranks, lrs in report["final_lr"].items():
        assert set(lrs) == OVERHEAD_VARIANTS, ranks
        for name in OVERHEAD_VARIANTS:
            expected = 0.05 if name in CONSTANT_LR else 0.05 * 0.01
            assert lrs[name] == pytest.approx(expected, rel=1e-5), (ranks, name)
    check = report["horovod_momentum_correction_true"]
    assert isinstance(check["runs"], bool) if KERAS_MAJOR == 2 else check is None


@pytest.mark.slow
def test_apply_loop_quick_reports_the_optimizer_alone(tmp_path):
    out = tmp_path / "apply_loop.json"
    last = _run_script("apply_loop.py", "--quick", "--out", out, "--raw-dir", tmp_path / "raw", timeout=300)
    variants = {"baseline", "baseline_copy", "keras_schedule", "hvd_sched_lr_only", "hvd_sched_no_correction",
                "hvd_sched_optimizer"}
    xla = {"baseline_xla", "hvd_sched_optimizer_xla"}
    extra = {"baseline_xla_vs_baseline"} if KERAS_MAJOR == 2 else set()
    assert set(last) == variants | extra | (xla if KERAS_MAJOR == 2 else set())
    assert last["baseline"] == 1.0 and all(math.isfinite(r) and r > 0 for r in last.values())
    report = json.loads(out.read_text())
    _check_machine(report["machine"])
    summary = report["summary"]  # process CPU time; the same rows in wall time in summary_wall
    assert set(summary) == set(report["summary_wall"])
    for name in last:
        _check_row(summary[name], name)
        _check_row(report["summary_wall"][name], ("wall", name))
        assert ("target" in summary[name]) == name.startswith("hvd_sched_optimizer"), name
        assert summary[name]["verdict"] == "undecided" if "target" in summary[name] else True  # 4 rounds
    if KERAS_MAJOR == 2:
        assert summary["hvd_sched_optimizer_xla"]["reference"] == "baseline_xla"
    else:
        assert all("per-variable XLA" in summary[name]["not_applicable"] for name in xla)
    assert "noise" in summary["baseline_copy"]["note"]
    # Each loop traced once, ran every step, and the scheduled ones end at the schedule's last LR.
    checks = report["checks"]
    assert checks["passed"] is True and set(report["tracing_count"].values()) == {1}
    assert set(checks["iterations"].values()) == {report["settings"]["steps"]} == {200}
    assert [it for it, _ in report["momentum_corrections"]] == [100, 150]
    ops = report["graph_ops_per_step"]
    assert ops["hvd_sched_optimizer"]["loop_body"] > ops["baseline"]["loop_body"] > 0
    assert len(report["seconds_per_step"]["baseline"]) == report["settings"]["rounds"] == 4
    assert len(report["cpu_seconds_per_step"]["baseline"]) == 4
    raw = list((tmp_path / "raw").glob("*_apply_loop_*.json"))
    assert len(raw) == 1 and raw[0].with_suffix(".md").exists()


@pytest.mark.slow
@pytest.mark.multirank
def test_conv_net_quick_reports_a_realistic_step(tmp_path):
    out = tmp_path / "conv_net.json"
    last = _run_script("conv_net.py", "--quick", "--out", out, timeout=400)
    assert set(last) == {"ranks1", "ranks2"}
    report = json.loads(out.read_text())
    _check_machine(report["machine"])
    for ranks in ("ranks1", "ranks2"):
        assert last[ranks]["baseline"] == 1.0
        for name in ("baseline", "hvd_sched_optimizer"):
            _check_row(report[ranks][name], (ranks, name))
            _check_row(report["cpu"][ranks][name], ("cpu", ranks, name))
        assert report[ranks]["hvd_sched_optimizer"]["target"] == 1.02
        raw = report[f"raw_{ranks}"]
        assert raw["weights"] == 24346 and raw["size"] == int(ranks[-1])
        assert raw["final_lr"]["baseline"] == pytest.approx(0.05)
        assert raw["final_lr"]["hvd_sched_optimizer"] == pytest.approx(0.0005, rel=1e-5)
        assert {it for it, _ in raw["momentum_corrections"]} >= {3, 4}  # the two decays (and the short warmup)


@pytest.mark.timeout(600)  # measured 40-80 s on 2 cores (its fixtures' runs included)
@pytest.mark.slow
@pytest.mark.multirank
def test_accumulation_quick_reports_the_cost_per_update(tmp_path):
    out = tmp_path / "accumulation.json"
    last = _run_script("accumulation.py", "--quick", "--out", out, "--raw-dir", tmp_path / "raw", timeout=400)
    rows = {"mlp_k2", "conv_k2"}
    assert last.keys() == {"ranks1", "ranks2"} and all(set(ratios) == rows for ratios in last.values()), last
    report = json.loads(out.read_text())
    _check_machine(report["machine"])
    assert report["keras_major"] == KERAS_MAJOR
    assert report["settings"]["micro_batch"] == {"mlp_k1": 64, "mlp_k2": 32, "conv_k1": 64, "conv_k2": 32}
    for ranks in ("ranks1", "ranks2"):
        for name in rows:  # k = 2 against k = 1, per update, in wall and CPU time; no target
            for row in (report[ranks][name], report["cpu"][ranks][name]):
                _check_row(row, (ranks, name))
                assert row["reference"] == name.replace("_k2", "_k1") and row["verdict"] == "no target"
                assert "target" not in row
            assert last[ranks][name] == report[ranks][name]["ratio_median"]
        raw = report[f"raw_{ranks}"]
        assert raw["size"] == int(ranks[-1])
        # Each variant's last round: 2 epochs of 4 (mlp) or 2 (conv) updates, k micro-batches (Keras' steps) each.
        assert raw["iteration_count"] == raw["updates_per_round"] == {"mlp_k1": 8, "mlp_k2": 8, "conv_k1": 4,
                                                                       "conv_k2": 4}
        assert raw["micro_batch_counter"] == raw["steps_per_round"] == {"mlp_k1": 8, "mlp_k2": 16, "conv_k1": 4,
                                                                         "conv_k2": 8}
        assert all(len(times) == 2 for times in raw["seconds_per_update"].values())
        assert all(len(times) == 2 for times in raw["cpu_seconds_per_update"].values())
    sums = report["raw_ranks2"]["weights_sha256"]  # one dict per rank
    assert len(sums) == 2 and sums[0] == sums[1] and set(sums[0]) == {"mlp_k1", "mlp_k2", "conv_k1", "conv_k2"}
    # One reduction per update: the same allreduces and bytes per update at k = 2 as at k = 1, half per micro-batch.
    weights = {"mlp": 32 * 64 + 64 + 64 * 2 + 2, "conv": 24346}
    tensors = {"mlp": 4, "conv": 11}  # kernels and biases; conv: 3 kernels, 3 x BN gamma and beta, Dense 2
    for name, row in report["timeline"]["variants"].items():
        model, k = name.split("_k")
        assert row["ops_per_update"]["ALLREDUCE"] == tensors[model], name
        assert row["allreduce_bytes_per_update"] == 4 * weights[model], name
        assert row["allreduce_bytes_per_micro_batch"] == 4 * weights[model] / int(k), name
    for name in rows:
        comparison = report["timeline"]["comparison"][name]
        assert comparison["same_per_update"] is True and comparison["bytes_per_micro_batch_ratio"] == 0.5, name
    assert report["checks"]["passed"] is True and all(report["checks"]["each"].values())
    raw = list((tmp_path / "raw").glob("*_accumulation_*.json"))
    assert len(raw) == 1 and json.loads(raw[0].read_text())["checks"] == report["checks"]
    table = raw[0].with_suffix(".md").read_text()
    assert table.count("| mlp_k2 (/ mlp_k1) |") == 4 and "median ms/update" in table  # 1 and 2 ranks, wall and CPU


@pytest.mark.timeout(600)  # measured 40-80 s on 2 cores (its fixtures' runs included)
@pytest.mark.slow
@pytest.mark.multirank
def test_preemption_quick_reports_step_cost_save_and_stop_times(tmp_path):
    out = tmp_path / "preemption.json"
    last = _run_script("preemption.py", "--quick", "--out", out, "--raw-dir", tmp_path / "raw", timeout=300)
    variants = {"baseline", "checkpoint_no_signals", "heartbeat", "checkpoint_default", "checkpoint_agree_every_step"}
    assert set(last) == {"ranks1", "ranks2", "save_median_s", "stop_median_s"}
    assert all(set(last[ranks]) == variants and last[ranks]["baseline"] == 1.0 for ranks in ("ranks1", "ranks2"))
    report = json.loads(out.read_text())
    _check_machine(report["machine"])
    steps = report["settings"]["steps_per_fit"]
    assert steps == 20 and report["settings"]["variants"]["checkpoint_agree_every_step"] == {"agree_every": 1e-9}
    for ranks in ("ranks1", "ranks2"):
        for name, row in (*report[ranks].items(), *report["cpu"][ranks].items()):  # wall and CPU time, no target
            _check_row(row, (ranks, name))
            assert row["reference"] == "baseline" and row["verdict"] == "no target" and "target" not in row
        assert len(report["seconds_per_step"][ranks]["checkpoint_default"]) == report["settings"]["rounds"] == 2
        # Agreements per fit: none without signals; one per iteration at agree_every=1e-9; a few by default;
        # one at train begin and one at each of the 2 epoch ends wherever signals are handled.
        agreements = report["agreements"][ranks]
        assert agreements["checkpoint_no_signals"]["calls"] == 0 and "baseline" in agreements
        assert agreements["checkpoint_agree_every_step"]["at_batch_end"] == steps
        assert agreements["checkpoint_agree_every_step"]["calls"] == 1 + steps + 2
        assert 1 <= agreements["checkpoint_default"]["at_batch_end"] <= steps
        assert agreements["checkpoint_default"]["at_epoch_end"] == 2
        checks = report["checks"][ranks]
        assert all(checks["epoch_checkpoints"].values()) and checks["handlers_restored"] is True
    saves = report["saves"]
    assert saves["demo_mlp"]["parameters"] == 64 * 64 + 64 + 64 * 10 + 10
    assert "ResNet-50 skipped" in saves["large"]["model"]  # --quick: the Dense stand-in
    for key, reps in (("demo_mlp", 3), ("large", 2)):
        row = saves[key]
        assert row["reps"] == reps and len(row["seconds"]) == reps + 1, key
        assert 0 < row["min_s"] <= row["median_s"] <= row["max_s"] and row["size_mb"] > 0 and row["mb_per_s"] > 0
        assert last["save_median_s"][key] == row["median_s"]
    assert set(report["budget_gb"]) == {"horovodrun", "slurm_killwait", "kubernetes_termination_grace"}
    # The demo stopped by SIGTERM under horovodrun: rank 0 saved where every rank stopped, then they exited (143).
    (run,) = report["stop"]["runs"]
    assert run["stopped_at_iteration"] >= 50 and run["checkpoint"]["iteration"] == run["stopped_at_iteration"]
    assert run["checkpoint"]["latest"] == run["checkpoint"]["path"]
    assert run["checkpoint"]["signal"] == "SIGTERM" or run["stopped_at_epoch_end"]
    assert set(run["signal_to_rank_exit_s"]) == {"0", "1"} and set(run["rank_status_reported"].values()) == {143}
    assert 0 < run["signal_to_stop_line_s"] < run["signal_to_last_rank_exit_s"]
    summary = report["stop"]["summary"]
    assert summary["all_saved_where_stopped"] is True
    assert summary["grace"]["horovodrun"]["grace_s"] == 5.0
    assert last["stop_median_s"] == summary["signal_to_horovodrun_exit_s"]["median"]
    raw = list((tmp_path / "raw").glob("*_preemption_*.json"))
    assert len(raw) == 1 and json.loads(raw[0].read_text())["stop"] == report["stop"]
    assert raw[0].with_suffix(".md").read_text().count("| checkpoint_default (/ baseline) |") == 4  # wall, CPU


@pytest.mark.slow
@pytest.mark.skipif(keras_major() != 2, reason="large_batch.py needs Keras 2's BatchNormalization(virtual_batch_size)")
def test_large_batch_quick_writes_table_and_plot(tmp_path):
    last = _run_script("large_batch.py", "--quick", "--out-dir", tmp_path, timeout=180)
    assert len(last) == 7 and "baseline n=32" in last
    for name, row in last.items():
        assert 0 <= row["mean"] <= 100 and math.isfinite(row["mean"]), name
        assert row["std"] == 0.0, name  # one seed
    assert (tmp_path / "large_batch.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((tmp_path / "large_batch.json").read_text())
    assert set(report["table"]) == set(last)
    runs = report["runs"]["k=8 gradual warmup, correction"]
    assert len(runs) == 1 and len(runs[0]["val_error"]) == report["settings"]["epochs"] == 2


@pytest.mark.slow
def test_scale_quick_reports_ratios_against_the_smallest_size(tmp_path):
    out = tmp_path / "scale.json"
    last = _run_script("scale.py", "--quick", "--out", out, timeout=300)
    assert set(last) == {"steps_with_decay", "cosine_decay"}
    report = json.loads(out.read_text())
    assert report["settings"]["sizes"]["steps_with_decay"] == [10 ** 4, 10 ** 9]
    top = report["settings"]["sizes"]["cosine_decay"][-1]  # the largest MAX_ITER from_detectron accepts
    assert 10 ** 8 < top < 10 ** 9 and report["notes"]["cosine_decay"]["largest_valid_max_iter"] == top
    for policy, rows in last.items():
        assert rows["10000"] == {"fit_s": 1.0, "show_s": 1.0, "peak_rss_mb_delta": 0.0}, policy
        for size, row in report["summary"][policy].items():
            assert row["show_rc"] == ["0"], (policy, size)
            assert row["graphdef_bytes"] > 0 and row["peak_rss_mb"] > 0
            low, high = row["fit_s_ratio"]["ci95"]
            assert 0 < low <= high
        assert set(list(report["summary"][policy].values())[-1]["verdicts"].values()) <= VERDICTS
    assert (tmp_path / "scale.md").read_text().count("| 1e4 |") == 2
