"""Elastic Horovod on one machine: `horovodrun --min-np 1 --max-np 2` with a host discovery script that drops a
slot during training. The survivor must keep its iteration, follow the new world size with its LR (linear scaling:
half the LR at 1 rank) and rescale its momentum slots by new_lr/old_lr = 0.5 at the reset. The job waits after
iteration 25 until Horovod notifies it of the change, so the drop lands mid-training whatever the load. The job
carries a TrainingCheckpoint (stop signals, a period): an elastic reset is not a stop.
"""

import json
import pathlib
import sys

import numpy as np
import pytest

from launch import rank_env, run_dropping_when_held
import rows

# One Keras 2 row and the Keras 3 row (tests/rows.py):
# ElasticLRScaler rescales Keras 2's and Keras 3's slots by different paths.
pytestmark = [pytest.mark.multirank, pytest.mark.depends_on(*rows.KERAS_PATH)]

JOB = pathlib.Path(__file__).with_name("elastic_job.py")


def test_dropped_slot_rescales_lr_and_slots_and_keeps_the_iteration(tmp_path):
    drop = tmp_path / "DROP"
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\nif [ -f {drop} ]; then echo localhost:1; else echo localhost:2; fi\n")
    discover.chmod(0o755)
    horovodrun = pathlib.Path(sys.executable).with_name("horovodrun")
    cmd = [str(horovodrun), "--gloo", "--network-interface", "lo", "-np", "2", "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", str(discover), sys.executable, str(JOB)]
    returncode, dropped_at, stdout, stderr = run_dropping_when_held(
        cmd, tmp_path, rank_env(tmp_path), drop, hold_at=25, reach_timeout=120, finish_timeout=150)
    output = stdout + stderr
    assert returncode == 0, output[-8000:]
    survivors = [json.loads(p.read_text()) for p in tmp_path.glob("elastic*.json")]
    assert len(survivors) == 1, output[-8000:]
    record = survivors[0]
    assert record["start_size"] == 2 and record["final_size"] == 1
    [reset] = record["resets"]
    assert reset["world_size"] == 1 and reset["old_scale"] == 1.0 and reset["scale"] == 0.5
    assert reset["slot_factor"] == 0.5
    np.testing.assert_allclose(reset["slots_after"], 0.5 * reset["slots_before"], rtol=1e-6)
    assert dropped_at == 25 and reset["iteration"] > dropped_at
    assert "world size is now 1 at iteration" in output

    batches = record["batches"]
    its = [b["it"] for b in batches]
    assert its == sorted(set(its)) and its[0] == 0  # the schedule position only moves forward
    assert len(set(range(its[-1] + 1)) - set(its)) <= 1  # the batch whose end raised the reset is not logged
    for b in batches:
        want = b["lr_table"] if b["it"] < reset["iteration"] else float(np.float32(b["lr_table"]) * np.float32(0.5))
        assert b["lr_used"] == want, b
        assert b["size"] == (2 if b["it"] < reset["iteration"] else 1)
    assert record["final_iteration"] >= 80
    # The job's TrainingCheckpoint (stop signals handled, a period of 10): the reset stopped nothing, and the
    # survivor's last checkpoint is its final state.
    assert record["checkpoint"]["iteration"] == record["final_iteration"] and record["checkpoint"]["signal"] is None
    assert "every rank stopped" not in output
