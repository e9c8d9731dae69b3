"""``bench/lr_at_speed.py --quick`` runs and ends with its JSON line (the full benchmark is not a test)."""

import json
import os
import pathlib
import subprocess
import sys

_ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_quick_benchmark_reports_json():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])))
    completed = subprocess.run([sys.executable, str(_ROOT / "bench" / "lr_at_speed.py"), "--quick"],
                               capture_output=True, text=True, timeout=120, cwd=_ROOT, env=env, check=True)
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert set(result) == {"n", "policy", "vectorised_s", "vectorised_first_s", "python_loop_s", "ratio",
                           "bit_identical"}
    assert result["n"] == 100_000 and result["policy"] == "cosine_decay"
    assert result["bit_identical"] is True
    assert 0 <= result["vectorised_s"] <= result["vectorised_first_s"]
    assert result["python_loop_s"] > 0 and result["ratio"] > 0
