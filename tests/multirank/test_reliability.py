"""Failure behaviour under real `horovodrun -np 2 --gloo`: a killed rank, a NaN loss, ranks that disagree.

Every job is bounded by a timeout; a hang fails the test.
"""

import os
import pathlib
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from launch import RankFailure, horovodrun_cmd, rank_env, run_and_collect

pytestmark = pytest.mark.multirank

JOB = pathlib.Path(__file__).with_name("reliability_job.py")


def _job(work, *args, timeout=180, expect_ok=True):
    work.mkdir(parents=True, exist_ok=True)
    if expect_ok:
        results, proc = run_and_collect(horovodrun_cmd(2, JOB, args), work, 2, timeout, None)
        return results, proc
    with pytest.raises(RankFailure) as info:
        run_and_collect(horovodrun_cmd(2, JOB, args), work, 2, timeout, None)
    return None, str(info.value)


def _latest(ckpt):
    from hvd_sched.keras.checkpoint import latest_checkpoint  # TF import only in tests that need it

    return latest_checkpoint(str(ckpt))


def test_killed_rank_ends_the_job_and_the_last_checkpoint_resumes_exactly(tmp_path):
    """Rank 1 holds before iteration 35 (mid epoch 4, after the checkpoint of epoch 3) and is killed there: an
    event the job signals, not a timing guess, so a loaded machine can neither miss the window nor finish first."""
    ckpt = tmp_path / "ckpt"
    work = tmp_path / "killed"
    work.mkdir()
    cmd = horovodrun_cmd(2, JOB, ["--ckpt", ckpt, "--epochs", "6", "--hold-rank1-at", "35"])
    with open(work / "stdout.txt", "w") as out, open(work / "stderr.txt", "w") as err:
        proc = subprocess.Popen(cmd, env=rank_env(work), cwd=str(work), stdout=out, stderr=err,
                                start_new_session=True)
        try:
            deadline = time.time() + 180
            while not (work / "held").exists():
                assert proc.poll() is None, (work / "stderr.txt").read_text()[-5000:]
                if time.time() > deadline:
                    pytest.fail("rank 1 did not reach iteration 35 within 180 s")
                time.sleep(0.05)
            killed_at = time.time()
            os.kill(int((work / "pid1").read_text()), signal.SIGKILL)
            returncode = proc.wait(timeout=90)  # a hang fails here
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert returncode != 0
    assert time.time() - killed_at < 90
    meta = _latest(ckpt)
    # Rank 1 at iteration 35 means both ranks finished iteration 34, after rank 0 saved epoch 3 (0-based 2).
    assert meta is not None and meta["epoch"] == 2 and meta["iteration"] == 30
    assert not [p for p in ckpt.iterdir() if p.name.startswith(".tmp-")]

    resumed, _ = _job(tmp_path / "resume", "--ckpt", ckpt, "--epochs", "6", "--resume")
    full, _ = _job(tmp_path / "full", "--ckpt", tmp_path / "ckpt_full", "--epochs", "6")
    assert resumed[0]["start"] == meta["epoch"] + 1
    assert resumed[0]["iterations"] == full[0]["iterations"] == 60
    for r in (0, 1):
        for a, b in zip(resumed[r]["weights"], full[0]["weights"]):
            np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-6, rtol=0)


def test_nan_loss_stops_every_rank_and_keeps_the_last_good_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    _, message = _job(tmp_path / "nan", "--ckpt", ckpt, "--epochs", "5", "--diverge-at", "20", timeout=120,
                      expect_ok=False)
    assert "NonFiniteLossError" in message
    # The LR is 1e8 from iteration 20 (epoch 2): the weights grow ~1e8-fold per update until the loss of
    # iteration 23 overflows float32 (deterministic: fixed data, op determinism). The whole number, not a prefix.
    assert re.search(r"loss is (inf|nan) at iteration 23 on rank [01] ", message), message[-3000:]
    assert "learning rate in force 1e+08" in message
    assert "the latest checkpoint is still" in message and "(epoch 1)" in message
    meta = _latest(ckpt)
    assert meta["epoch"] == 1 and meta["iteration"] == 20


def test_ranks_with_different_schedules_fail_before_training(tmp_path):
    _, message = _job(tmp_path / "mismatch", "--ckpt", tmp_path / "ckpt", "--rank1-base-lr", "0.1", timeout=120,
                      expect_ok=False)
    assert "RankMismatchError" in message
    assert "schedule.base_lr: rank 0 = 0.2, rank 1 = 0.1" in message
    assert not (tmp_path / "ckpt" / "latest").exists()  # no step was taken, nothing saved
