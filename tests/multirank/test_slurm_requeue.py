"""examples/slurm/train.sbatch stopped the ways Slurm stops a job, on a real one-node Slurm (tests/slurmutil.py),
and coming back by itself: each job must end on the iteration, the validation figures and the variables (weights,
momentum slots, iteration), bit for bit, of the run never stopped.

- `scontrol requeue JOB` mid-run (a preemption with PreemptMode=REQUEUE requeues the same way, by Slurm's
  source): SIGTERM to the tasks, which save and exit 143; Slurm runs the script again itself
  (SLURM_RESTART_COUNT=1), and `--resume` continues.
- `scancel --signal=USR1 JOB` mid-run: the signal that the script's `#SBATCH --signal=USR1@90` asks Slurm to send
  before the time limit, to the same processes (the step's tasks, not the batch shell); the tasks save and exit
  138, and the script requeues the job itself.
- A real 1-minute `--time` limit: Slurm sends that SIGUSR1 at its first time-limit check while the job runs
  (checks are 30 s apart; 90 s of warning on a 1-minute job means at once); the test suspends the job over the
  checks until one falls inside its few seconds of training. The job requeues itself and finishes (marked slow).

Every stop is driven by what the job reports (the `latest` checkpoint's meta.json, written every 20 iterations;
the job's state in `scontrol show job`) and, for the time limit, by when slurmctld says it checks; not by sleeps.
Slurm keeps a requeued job pending for AuthInfo's cred_expire + 1 s (121 s by default, Reason=BeginTime); the
tests start it 2 s after the requeue with `scontrol update JobId=... StartTime=now`, as an operator can. The tests
skip, with the reason, where Slurm, munge, PMIx or a Horovod built with MPI is missing.
"""

import datetime
import json
import pathlib
import re
import subprocess
import sys
import time

import pytest

from launch import (STOPPED, assert_same_final_checkpoint, horovodrun_cmd, latest_meta, mpi_env, mpi_missing, rank_env,
                    run_command)
from slurmutil import ENDED, SlurmCluster

pytestmark = pytest.mark.multirank


# Slurm and the job script are the same on every row: these run on the default row (tests/rows.py); the resume
# they end with is checked on a Keras 2 and the Keras 3 row by tests/multirank/test_preemption.py.

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_keras.py"
SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"
DEMO = ROOT / "examples" / "configs" / "digits_warmup_steps.yaml"
# 89 iterations per epoch at batch 8 on 2 ranks: 356 in all, a few seconds of training; a stop is asked once the
# newest checkpoint is at iteration 100 or later (inside epoch 2).
KNOBS = {"EPOCHS": "4", "BATCH_SIZE": "8", "CHECKPOINT_PERIOD": "20"}
TOTAL, ASK_AT = 356, 100
FINAL = re.compile(r"rank (\d): final val accuracy ([0-9.]+) \(360 samples, iteration (\d+)\)")
RESUMED = re.compile(r"rank (\d): resumed from (\S+) .*\(iteration (\d+)\)")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = SlurmCluster.missing() or mpi_missing()
    if reason:
        pytest.skip(reason)
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        reason = cluster.pmix_missing()
        if reason:
            pytest.skip(reason)
        # slurmctld logs its time-limit checks at debug2 (test_a_job_that_reaches_its_time_limit_... reads them)
        assert _scontrol(cluster, "setdebug", "debug2").returncode == 0
        yield cluster


def _reference(tmp_path_factory, epochs):
    """The run never stopped, under horovodrun --gloo (Gloo and Open MPI sum 2 ranks' gradients to the same bits:
    tests/multirank/test_preemption.py); its OUT folder, final lines and epochs."""
    work = tmp_path_factory.mktemp("reference")
    out = work / "out"
    args = ["--config", DEMO, "--epochs", epochs, "--batch-size", KNOBS["BATCH_SIZE"], "--out", out]
    proc = run_command(horovodrun_cmd(2, SCRIPT, args), work, timeout=240)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return out, sorted(FINAL.findall(proc.stdout)), int(epochs)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _reference(tmp_path_factory, KNOBS["EPOCHS"])


def _slurm_env(slurm, extra=None):
    env = rank_env(ROOT, {**mpi_env(), **slurm.env, **(extra or {})})
    env.pop("HVD_SCHED_TEST_OUT", None)
    return env


def _scontrol(slurm, *args):
    return subprocess.run(["scontrol", *args], env=_slurm_env(slurm), capture_output=True, text=True, timeout=30)


def _submit(slurm, tmp_path, *options, **knobs):
    """sbatch the example script (its env knobs: KNOBS, then `knobs`); returns (job id, OUT, the job's log)."""
    out, log = tmp_path / "out", tmp_path / "slurm.out"
    env = _slurm_env(slurm, {"PYTHON": sys.executable, "OUT": str(out), **KNOBS, **knobs})
    proc = subprocess.run(["sbatch", "--parsable", "--chdir", str(ROOT), "-o", str(log), *options, str(SBATCH)],
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0], out, log


def _follow(slurm, job, out, log, act=None, rerun=(), timeout=300):
    """Watch `job` until it ends; returns its last `scontrol show job`. `act(info, meta)` is called at each poll
    with the job's state and its newest checkpoint's metadata. A requeued job waiting for its BeginTime is started
    at once, with `rerun` (more `scontrol update` fields) applied."""
    deadline = time.monotonic() + timeout
    held_since = None
    while time.monotonic() < deadline:
        info = slurm.job(job)
        if info["JobState"] in ENDED:
            return info
        if info["JobState"] == "PENDING" and info.get("Reason") == "BeginTime":
            held_since = held_since or time.monotonic()
            # Not in the second of the requeue: slurmd refuses a launch credential no newer than the revocation
            # of the last one ("Job credential revoked", in whole seconds), and the job would end FAILED.
            if time.monotonic() - held_since >= 2:
                proc = _scontrol(slurm, "update", f"JobId={job}", "StartTime=now", *rerun)
                assert proc.returncode == 0, proc.stderr
                held_since = None
        if act is not None:
            act(info, latest_meta(out))
        time.sleep(0.1)
    pytest.fail(f"job {job} did not end within {timeout} s: {slurm.job(job)}\n"
                f"{log.read_text()[-6000:] if log.exists() else ''}")


def _assert_same_run(out, reference, log_text):
    """The job's final lines, summary and final checkpoint are those of the run never stopped, bit for bit."""
    reference_out, reference_finals, epochs = reference
    total = 89 * epochs
    finals = sorted(FINAL.findall(log_text))
    assert finals == reference_finals and [f[2] for f in finals] == [str(total)] * 2, log_text[-3000:]
    ours = json.loads((out / "summary.json").read_text())
    theirs = json.loads((reference_out / "summary.json").read_text())
    assert ours["iterations"] == theirs["iterations"] == total
    assert ours["final_val_accuracy"] == theirs["final_val_accuracy"]
    by_epoch = {entry["epoch"]: entry for entry in theirs["epoch_log"]}
    assert ours["epoch_log"], "the resumed run reported no epoch"
    for entry in ours["epoch_log"]:  # the epochs the last run trained: validated on the same weights
        assert (entry["val_loss"], entry["val_accuracy"]) == (by_epoch[entry["epoch"]]["val_loss"],
                                                              by_epoch[entry["epoch"]]["val_accuracy"])
    assert_same_final_checkpoint(out, reference_out, epochs, 89)


def _check_stop(log_text, name, asked_at, total=TOTAL):
    """Rank 0 reported one stop for `name` at an iteration >= `asked_at`, saved it and exited 128 + signal; both
    ranks of the next run resumed from that checkpoint, at that iteration. Returns the iteration."""
    stops = STOPPED.findall(log_text)
    assert len(stops) == 1, log_text[-6000:]
    signal_name, iteration, _, _, path, _, status = stops[0]
    iteration = int(iteration)
    assert signal_name == name and int(status) == {"SIGTERM": 143, "SIGUSR1": 138}[name]
    assert asked_at <= iteration < total
    resumed = sorted(RESUMED.findall(log_text))
    assert [(rank, pathlib.Path(where).name, int(at)) for rank, where, at in resumed] == \
        [(rank, pathlib.Path(path).name, iteration) for rank in "01"], log_text[-6000:]
    return iteration


def _asker(slurm, *command):
    """An `act` for `_follow`: runs `command` (scontrol or scancel, with the job's id) once, when the newest
    checkpoint is at ASK_AT or later while the job runs for the first time; `asked["iteration"]` is the iteration
    seen then."""
    asked = {}

    def act(info, meta):
        if not asked and info["JobState"] == "RUNNING" and info.get("Restarts") == "0" and meta is not None \
                and meta["iteration"] >= ASK_AT:
            asked["iteration"] = meta["iteration"]
            proc = subprocess.run(command, env=_slurm_env(slurm), capture_output=True, text=True, timeout=30)
            assert proc.returncode == 0, f"{' '.join(command)}: {proc.stderr}"

    return act, asked


@pytest.mark.timeout(600)  # measured 40-80 s on 2 cores (its fixtures' runs included)
def test_a_job_requeued_by_scontrol_comes_back_and_ends_as_if_never_stopped(slurm, reference, tmp_path):
    job, out, log = _submit(slurm, tmp_path)
    act, asked = _asker(slurm, "scontrol", "requeue", job)
    info = _follow(slurm, job, out, log, act)
    text = log.read_text()  # both runs: --open-mode=append
    assert asked, f"the job ended before iteration {ASK_AT}:\n{text[-6000:]}"
    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("COMPLETED", "1", "0:0"), \
        f"{info}\n{text[-6000:]}"
    _check_stop(text, "SIGTERM", asked["iteration"])
    assert f"hvd_sched: job {job} (restart 0)" in text and f"hvd_sched: job {job} (restart 1)" in text
    # Slurm requeued it, not the script. The shell's own line after srun is there only if the ranks exited within
    # KillWait (5 s here) of the SIGTERM: after that Slurm kills the shell too, and nothing depends on it.
    assert "requeueing it" not in text
    if "Exited with exit code 143" in text:
        assert f"hvd_sched: job {job} stopped by SIGTERM: not requeued from here" in text
    _assert_same_run(out, reference, text)


@pytest.mark.timeout(600)  # measured 40-80 s on 2 cores (its fixtures' runs included)
def test_sigusr1_from_scancel_makes_the_job_requeue_itself_and_end_as_if_never_stopped(slurm, reference, tmp_path):
    """`scancel --signal=USR1 JOB`: what `#SBATCH --signal=USR1@90` has Slurm send before the time limit, to the
    same processes (the step's tasks), on demand."""
    job, out, log = _submit(slurm, tmp_path)
    act, asked = _asker(slurm, "scancel", "--signal=USR1", job)
    info = _follow(slurm, job, out, log, act)
    text = log.read_text()
    assert asked, f"the job ended before iteration {ASK_AT}:\n{text[-6000:]}"
    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("COMPLETED", "1", "0:0"), \
        f"{info}\n{text[-6000:]}"
    _check_stop(text, "SIGUSR1", asked["iteration"])
    assert f"hvd_sched: job {job} stopped by SIGUSR1 (time limit near): requeueing it (restart 1 of at most 3)" \
        in text
    _assert_same_run(out, reference, text)


# --- the real time limit -----------------------------------------------------------------------------------------

# 12 epochs (1,068 iterations, 5-10 s of training here): lined up 1.5 s before a time-limit check, the job is still
# training when the check comes, whatever the load (4 epochs could end first: seen in CI, 2026-12-04).
LONG_EPOCHS = "12"


@pytest.fixture(scope="module")
def long_reference(tmp_path_factory):
    return _reference(tmp_path_factory, LONG_EPOCHS)


_CHECK = re.compile(r"^\[([0-9T:.-]+)\] debug2: Testing job time limits", re.MULTILINE)


def _time_limit_checks(slurm):
    """When slurmctld checked time limits (and sent `--signal` warnings), from its log at debug2: every 30 s."""
    text = (slurm.folder / "log" / "slurmctld.log").read_text(errors="replace")
    return [datetime.datetime.fromisoformat(stamp).timestamp() for stamp in _CHECK.findall(text)]


def _next_check(slurm, after, timeout=45):
    """The first time-limit check after `after` (waits for it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        later = [t for t in _time_limit_checks(slurm) if t > after]
        if later:
            return later[0]
        time.sleep(0.1)
    pytest.fail(f"slurmctld logged no time-limit check in {timeout} s (scontrol setdebug debug2)")


def _line_up_with_the_next_check(slurm, job):
    """An `act` for `_follow` that makes Slurm's next time-limit check fall inside the first run's training: while
    Python starts, the job is suspended over any check (`scontrol suspend`: SIGSTOP, and the time limit's clock
    stops; a suspended job is not checked); once it trains, it is suspended until 1.5 s before the next check.
    Returns (act, record): record["iteration"], the iteration seen training; record["resumed"], when it was let
    run into the check; record["saved"], every checkpoint's metadata seen, by iteration."""
    record = {"saved": {}}

    def pause_until(moment):
        assert _scontrol(slurm, "suspend", job).returncode == 0
        time.sleep(max(moment - time.time(), 0))
        assert _scontrol(slurm, "resume", job).returncode == 0

    def act(info, meta):
        if meta is not None:  # the stop's checkpoint is replaced by later ones: keep them all
            record["saved"][meta["iteration"]] = meta
        if "resumed" in record or info["JobState"] != "RUNNING" or info.get("Restarts") != "0":
            return
        last = _time_limit_checks(slurm)[-1]
        due = last + 30  # the next check (30 s after the last, 31 when slurmctld's whole seconds slip)
        if meta is None:  # not training yet
            if due - time.time() < 2.5:
                assert _scontrol(slurm, "suspend", job).returncode == 0
                _next_check(slurm, last)
                assert _scontrol(slurm, "resume", job).returncode == 0
            return
        record["iteration"] = meta["iteration"]
        if due - time.time() > 2.5:
            pause_until(due - 1.5)
        record["resumed"] = time.time()

    return act, record


@pytest.mark.timeout(600)  # measured 40-80 s on 2 cores (its fixtures' runs included)
@pytest.mark.slow
def test_a_job_that_reaches_its_time_limit_requeues_itself_and_ends_as_if_never_stopped(slurm, long_reference,
                                                                                        tmp_path):
    """`sbatch --time=1` (1 minute): the script's `--signal=USR1@90` is due at once, and Slurm sends it at its first
    time-limit check while the job runs. Those checks are 30 s apart and the job trains for a few seconds, so the
    test lines one up with the training (`_line_up_with_the_next_check`; slurmctld's log at debug2 says when the
    checks are). The warning itself comes from Slurm: the ranks save and exit 138, the script requeues the job,
    and the test gives the rerun 10 minutes (else it is warned at its first check too, and again: a 1-minute job
    that needs longer never ends; MAX_REQUEUES stops it)."""
    if not _time_limit_checks(slurm):
        _next_check(slurm, 0)
    job, out, log = _submit(slurm, tmp_path, "--time=1", EPOCHS=LONG_EPOCHS)
    act, record = _line_up_with_the_next_check(slurm, job)
    info = _follow(slurm, job, out, log, act, rerun=("TimeLimit=10",))
    text = log.read_text()
    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("COMPLETED", "1", "0:0"), \
        f"{info}\n{text[-6000:]}"
    assert f"hvd_sched: job {job} stopped by SIGUSR1 (time limit near): requeueing it (restart 1 of at most 3)" \
        in text, text[-6000:]
    assert "resumed" in record, f"the job never trained before a time-limit check: {record}\n{text[-6000:]}"
    iteration = _check_stop(text, "SIGUSR1", record["iteration"], total=89 * int(LONG_EPOCHS))
    # Sent by that check: saved within seconds of it (before it, by a validation's length, when the warning came
    # during an epoch's validation and that epoch's checkpoint is the stop's).
    warned = _next_check(slurm, record["resumed"] - 0.5)
    saved = record["saved"][iteration]
    assert warned - 2 <= saved["time"] <= warned + 5, (warned, saved)
    _assert_same_run(out, long_reference, text)
