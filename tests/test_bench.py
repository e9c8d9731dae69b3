"""`bench/overhead.py --quick`, `bench/scale.py --quick` and `bench/large_batch.py --quick` run and report (the benchmarks are not tests:
no timing or accuracy is asserted, only that the scripts finish and their outputs have the documented form)."""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
OVERHEAD_VARIANTS = {"baseline", "horovod_callbacks", "keras_schedule", "hvd_sched_optimizer", "hvd_sched_callback",
                     "baseline_spe16", "hvd_sched_optimizer_spe16"}
OVERHEAD_NOT_APPLICABLE = {"horovod_callbacks_spe16", "hvd_sched_callback_spe16"}
VERDICTS = {"confirmed", "refuted", "undecided"}


def _run_script(name, *args, timeout):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    completed = subprocess.run([sys.executable, str(ROOT / "bench" / name), *map(str, args)], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=timeout, check=False)
    assert completed.returncode == 0, f"{name} exited {completed.returncode}\n--- stdout ---\n" \
                                      f"{completed.stdout[-5000:]}\n--- stderr ---\n{completed.stderr[-5000:]}"
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.multirank
def test_overhead_quick_reports_ratios_and_equal_communication(tmp_path):
    out = tmp_path / "overhead.json"
    last = _run_script("overhead.py", "--quick", "--out", out, "--raw-dir", tmp_path / "raw", timeout=240)
    assert set(last) == {"ranks1", "ranks2"}
    for ranks, ratios in last.items():
        assert set(ratios) == OVERHEAD_VARIANTS, ranks
        assert ratios["baseline"] == 1.0 and ratios["baseline_spe16"] == 1.0
        assert all(isinstance(r, float) and math.isfinite(r) and r > 0 for r in ratios.values()), ratios
    report = json.loads(out.read_text())
    for ranks in ("ranks1", "ranks2"):
        assert set(report[ranks]) == OVERHEAD_VARIANTS | OVERHEAD_NOT_APPLICABLE
        for name in OVERHEAD_NOT_APPLICABLE:
            assert "Python" in report[ranks][name]["not_applicable"]
        for name in OVERHEAD_VARIANTS:
            row = report[ranks][name]
            assert row["median_ms"] > 0 and row["min_ms"] > 0 and row["min_ms"] <= row["median_ms"]
            assert row["reference"] == ("baseline_spe16" if name.endswith("_spe16") else "baseline")
            for key in ("ratio_median", "ratio_min", "ratio_paired_median"):  # every ratio has its interval
                low, high = row[key + "_ci95"]
                assert 0 < low <= high, (ranks, name, key)
        for name in ("hvd_sched_optimizer", "hvd_sched_optimizer_spe16"):
            assert report[ranks][name]["target"] == 1.02 and report[ranks][name]["verdict"] in VERDICTS
        assert len(report["seconds_per_step"][ranks]["baseline_spe16"]) == report["settings"]["rounds"]
    assert report["steps_per_execution"]["hvd_sched_optimizer_spe16"] == 16
    raw = list((tmp_path / "raw").glob("*_overhead.json"))
    assert len(raw) == 1 and json.loads(raw[0].read_text())["seconds_per_step"] == report["seconds_per_step"]
    # The wrapper leaves Horovod's communication alone: same collectives and bytes per step as the baseline.
    timeline = report["timeline"]
    assert timeline["identical"] is True
    assert timeline["baseline"]["ops_per_step"]["ALLREDUCE"] == 4  # kernel and bias of two Dense layers
    assert timeline["baseline"]["allreduce_bytes_per_step"] == 4 * (32 * 64 + 64 + 64 * 2 + 2)
    # Every scheduled variant ends a round at BASE_LR * GAMMA ** 2 (the same schedule shape).
    for ranks, lrs in report["final_lr"].items():
        assert lrs["baseline"] == lrs["baseline_spe16"] == pytest.approx(0.05), ranks
        for name in OVERHEAD_VARIANTS - {"baseline", "baseline_spe16"}:
            assert lrs[name] == pytest.approx(0.05 * 0.01, rel=1e-5), (ranks, name)
    assert isinstance(report["horovod_momentum_correction_true"]["runs"], bool)


@pytest.mark.slow
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
