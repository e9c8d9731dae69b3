"""hvd_sched.supervise with stand-in launchers: real processes (a launcher that, like Open MPI's prterun, exits
only at its third SIGTERM, or exits 0 and leaves a rank running), real signals, no Horovod. What the real launchers
do across hosts of their own is tests/multirank/test_nodes.py's."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = pathlib.Path(__file__).resolve().parents[2]

# A stand-in launcher: starts one "rank" (its own process group, as prterun's ranks) that writes what it is told
# to, and handles SIGTERM as prterun does (the third one ends it) or exits at once, as told by its arguments.
LAUNCHER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    mode, folder = sys.argv[1], sys.argv[2]
    terms = []
    rank = None
    def on_term(signum, frame):
        terms.append(signum)
        open(os.path.join(folder, "launcher.signals"), "a").write(f"{signum}\\n")
        if signum == signal.SIGTERM and len([s for s in terms if s == signal.SIGTERM]) >= 3:
            if rank is not None:
                os.killpg(rank.pid, signal.SIGKILL)
            os._exit(1)
        if signum == signal.SIGUSR1 and rank is not None:
            rank.send_signal(signal.SIGUSR1)
    for signum in (signal.SIGTERM, signal.SIGUSR1):  # before the rank starts: a signal may come at once
        signal.signal(signum, on_term)
    rank = subprocess.Popen([sys.executable, "-c", RANK, mode, folder], preexec_fn=os.setpgrp)
    open(os.path.join(folder, "rank.pid"), "w").write(str(rank.pid))
    if mode == "prte_lost":  # prterun after its daemon's connection failed: it kills the ranks and exits 0
        os.killpg(rank.pid, signal.SIGKILL)
        sys.stderr.write("----\\nPRTE has lost communication with a remote daemon.\\n\\n  HNP daemon   : "
                         "[prterun-vm-1@0,0] on node vm\\n  Remote daemon: [prterun-vm-1@0,2] on node node2\\n\\n")
        sys.exit(0)
    if mode in ("orphan_lost", "orphan_hung"):
        sys.exit(0)  # prterun after a daemon it lost: "success", its rank still running
    while rank.poll() is None:
        time.sleep(0.05)
    sys.exit(rank.returncode if mode != "hang_after_rank" else (time.sleep(600) or 0))
""")
RANK = textwrap.dedent("""
    import os, signal, sys, time
    mode, folder = sys.argv[1], sys.argv[2]
    note = os.path.join(folder, "ckpt", "peer_lost.txt")
    def lost():
        open(note, "w").write("hvd_sched: rank 1 (host node2, pid 42) has not answered for 10.0 s\\n")
        os._exit(75)
    signal.signal(signal.SIGUSR1, lambda *a: os._exit(138))
    open(os.path.join(folder, "rank.ready"), "w").close()
    if mode == "ok":
        time.sleep(1.5)
        sys.exit(0)
    if mode in ("hang_after_rank", "orphan_lost"):
        time.sleep(3)
        lost()
    time.sleep(600)  # "orphan_hung", "wait": a rank left in a collective
""")


def _launcher(tmp_path):
    script = tmp_path / "launcher.py"
    script.write_text(f"RANK = {RANK!r}\n" + LAUNCHER)
    (tmp_path / "ckpt").mkdir(exist_ok=True)
    return [sys.executable, str(script)]


def _supervise(tmp_path, mode, *options, timeout=90):
    cmd = [sys.executable, "-m", "hvd_sched.supervise", "--checkpoint-dir", str(tmp_path / "ckpt"), *options, "--",
           *_launcher(tmp_path), mode, str(tmp_path)]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _finish(proc, timeout=90):
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def no_leftovers(tmp_path):
    yield
    pid_file = tmp_path / "rank.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        alive = _alive(pid)
        if alive:
            os.kill(pid, signal.SIGKILL)
        assert not alive, f"the stand-in rank {pid} was left running"


def test_a_launcher_that_waits_after_a_lost_node_gets_three_sigterms_and_the_note_is_printed_last(tmp_path,
                                                                                                 no_leftovers):
    code, out, err = _finish(_supervise(tmp_path, "hang_after_rank", "--grace", "1"))
    assert code == 75, err
    assert (tmp_path / "launcher.signals").read_text().split() == [str(int(signal.SIGTERM))] * 3, err
    assert "sending it SIGTERM three times" in err
    # The last thing the user reads: the note, naming the lost rank and its host.
    assert err.rstrip().splitlines()[-1].startswith("hvd_sched: rank 1 (host node2, pid 42) has not answered"), err


def test_ranks_left_by_a_launcher_that_exited_0_are_waited_for_and_the_job_is_not_a_success(tmp_path, no_leftovers):
    code, out, err = _finish(_supervise(tmp_path, "orphan_lost", "--grace", "1"))
    assert code == 75, err
    assert "exited with status 0" in err and "left 1 process(es) running" in err, err
    assert err.rstrip().splitlines()[-1].startswith("hvd_sched: rank 1 (host node2"), err


def test_a_launcher_that_exits_0_after_losing_its_daemon_is_not_a_success(tmp_path, no_leftovers):
    code, out, err = _finish(_supervise(tmp_path, "prte_lost"))
    assert code == 75, err
    assert "PRTE has lost communication" in err and "python lost its daemon on node2 (its own message above): the job did not finish" in err, err


def test_ranks_that_never_end_are_ended_after_orphan_wait_and_named(tmp_path, no_leftovers):
    code, out, err = _finish(_supervise(tmp_path, "orphan_hung", "--orphan-wait", "1"))
    assert code == 1, err
    rank = (tmp_path / "rank.pid").read_text()
    assert f"ending {rank} (" in err and "still running 1 s after" in err, err


def test_a_healthy_job_is_never_stopped_and_an_old_note_does_not_count(tmp_path, no_leftovers):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "peer_lost.txt").write_text("from an earlier run\n")
    code, out, err = _finish(_supervise(tmp_path, "ok", "--grace", "0"))
    assert code == 0, err
    assert not (tmp_path / "launcher.signals").exists(), err
    assert "peer_lost" not in err and "earlier run" not in err, err


def test_signals_are_passed_to_the_launcher_once_and_its_status_is_kept(tmp_path, no_leftovers):
    proc = _supervise(tmp_path, "wait")
    deadline = time.monotonic() + 30
    while not (tmp_path / "rank.ready").exists() and time.monotonic() < deadline:  # its handler is installed
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    code, out, err = _finish(proc)
    assert code == 138, err  # the rank's 138, passed on by the launcher, kept by supervise
    assert (tmp_path / "launcher.signals").read_text().split() == [str(int(signal.SIGUSR1))], err


@pytest.mark.parametrize("args,message", [
    ([], "no command: give the launcher's command line after --"),
    (["--grace", "-1", "--", "true"], "--grace must be a finite number of seconds >= 0, got '-1'"),
    (["--orphan-wait", "soon", "--", "true"], "--orphan-wait must be a number of seconds, got 'soon'"),
])
def test_bad_arguments_exit_2_naming_the_field(tmp_path, args, message):
    result = subprocess.run([sys.executable, "-m", "hvd_sched.supervise", "--checkpoint-dir", str(tmp_path), *args],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_a_command_that_cannot_start_exits_2(tmp_path):
    result = subprocess.run([sys.executable, "-m", "hvd_sched.supervise", "--checkpoint-dir", str(tmp_path), "--",
                             str(tmp_path / "no-such-launcher")], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "cannot start" in result.stderr, result.stderr
