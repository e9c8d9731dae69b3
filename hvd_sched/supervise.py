"""Run a launcher (`mpirun`, `horovodrun`, `srun`) so that it ends when a node is lost, and says which one.

    python -m hvd_sched.supervise --checkpoint-dir OUT/ckpt -- mpirun -np 4 -H node1:2,node2:2 python train.py ...

Why: `TrainingCheckpoint(peer_timeout=...)` ends every surviving rank with status 75 when another rank's host dies,
freezes or is cut off, and writes what it saw to `OUT/ckpt/peer_lost.txt`. The ranks are then gone, but Open MPI's
`mpirun` (prterun, PRRTE 3.0.x; also under `horovodrun --mpi` and a Kubernetes MPIJob) waits for its daemon on the
lost host, which never answers: a frozen host's kernel still acknowledges its TCP keepalives, and once the kill
command is queued for a dead one, only the kernel's retransmission limit (about 15 min) ends that wait. The job
would hold its allocation until the time limit. Where prted's processes are killed and its host's kernel lives on,
prterun instead exits at once with status 0 ("A daemon failed to report back"), leaving the ranks on the
launcher's own host running: a job script reads success.

What this does, as the launcher's parent (Linux):
- runs the command in a process group of its own (given the terminal when it has one), and becomes the
  subreaper of everything it starts, so that ranks orphaned by a launcher that exited are still its own;
- passes on the signals it gets (SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2) to the launcher, once each: a
  Kubernetes SIGTERM, the MPIJob launcher's trap, `kill`; the stop signals keep their meaning (hvd_sched's ranks
  agree on one iteration and save);
- once `peer_lost.txt` is written (a new one: one left by an earlier run is not counted), gives the launcher
  `--grace` seconds to end by itself (horovodrun --gloo does, within a second), then sends it SIGTERM three times,
  a second apart (prterun exits at its third, killing its local ranks), and SIGKILL `--kill-after` seconds later
  if it is still there;
- once the launcher has exited, waits up to `--orphan-wait` seconds for any process it left behind (a rank whose
  launcher exited is ended by its own heartbeat, within its peer_timeout; the signals it gets meanwhile go to
  them), then ends them (SIGTERM, then SIGKILL 5 s later) and names them;
- copies the launcher's output through as it comes, and notes prterun's own report of a lost daemon ("PRTE has
  lost communication with a remote daemon", "A daemon failed to report back"): prterun may exit 0 after it,
  although the job did not finish;
- exits 75 (EX_TEMPFAIL, as the ranks) when a node was lost (a new `peer_lost.txt`, or prterun's lost daemon once
  the job had started: a checkpoint of this run saved), and prints `peer_lost.txt` last: the lost rank and its host are the last thing the user reads, not
  the survivor that the launcher names. Otherwise it exits with the launcher's status (128 + N for a signal), or 1
  where the launcher exited 0 but left processes running.

What it does not do: it never kills a job that is only slow (it acts on the note, which the heartbeat writes only
for a peer silent for peer_timeout), and it starts nothing again: requeueing on 75 is the job script's (or the
scheduler's) decision. Exit status 2: bad arguments, or a command that cannot be started. It imports only the
standard library, not TensorFlow or Horovod.
"""

import argparse
import ctypes
import os
import signal
import re
import subprocess
import sys
import threading
import time

__all__ = ["main", "PEER_LOST_STATUS", "supervise"]

PEER_LOST_STATUS = 75
"""The exit status for a lost node: `hvd_sched.keras.PEER_LOST_STATUS`'s value (not imported from there: that would
import TensorFlow)."""
NOTE = "peer_lost.txt"
"""The note the ranks write in the checkpoint folder: `hvd_sched.keras.checkpoint.PEER_LOST_NOTE`."""
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_CHILD_SUBREAPER = 36
_POLL = 0.25


def _say(message):
    print(f"hvd_sched.supervise: {message}", file=sys.stderr, flush=True)


def _positive(name):
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number of seconds, got {text!r}") from None
        if not value >= 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{name} must be a finite number of seconds >= 0, got {text!r}")
        return value
    return parse


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m hvd_sched.supervise",
        description="Run a launcher so that it ends when TrainingCheckpoint(peer_timeout=...) reports a lost node "
                    "(peer_lost.txt in the checkpoint folder), then exit 75 naming the lost rank and host.")
    parser.add_argument("--checkpoint-dir", required=True,
                        help="the TrainingCheckpoint folder (the demo's OUT/ckpt), where peer_lost.txt is written")
    parser.add_argument("--grace", type=_positive("--grace"), default=10.0,
                        help="seconds the launcher gets to end by itself after peer_lost.txt appears (default 10)")
    parser.add_argument("--kill-after", type=_positive("--kill-after"), default=10.0,
                        help="seconds after the third SIGTERM before SIGKILL (default 10)")
    parser.add_argument("--orphan-wait", type=_positive("--orphan-wait"), default=90.0,
                        help="seconds to wait, once the launcher has exited, for processes it left running (ranks "
                             "end themselves within their peer_timeout; default 90, the default peer_timeout of "
                             "60 s and some)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- then the launcher's command line, e.g. -- mpirun -np 4 python train.py ...")
    return parser


def _stamp(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _listing(folder):
    """The checkpoint folder's entries and their stamps (peer_lost.txt aside): changed once a checkpoint is saved."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return ()
    return tuple((name, _stamp(os.path.join(folder, name))) for name in names if name != NOTE)


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError as exc:
        return f"(unreadable: {exc})"


def _children_of(pid):
    """Every live process whose parent chain leads to `pid` (read from /proc)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses; the last ')' ends it.
        fields = stat[stat.rfind(b")") + 2:].split()
        if fields and fields[0] != b"Z":
            parents[int(entry)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for child, its_parent in parents.items():
            if its_parent == parent:
                found.append(child)
                frontier.append(child)
    return sorted(found)


def _describe(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            words = handle.read().split(b"\0")
        return f"{pid} ({' '.join(w.decode(errors='replace') for w in words if w)[:120]})"
    except OSError:
        return str(pid)


def _reap(child, status):
    """Collect every exited child (orphans re-parented to this subreaper too); returns the launcher's wait status
    once it has exited, else `status`."""
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == child:
            status = code


# What Open MPI's prterun (PRRTE 3.0.x) prints when a daemon's connection fails; it may then exit 0.
_LOST_DAEMON = re.compile(rb"Remote daemon: \S+ on node (\S+)|Remote host: +(\S+)")
_LOST_DAEMON_HEADER = {"lost": b"PRTE has lost communication with a remote daemon",
                       "unreported": b"A daemon failed to report back after being spawned"}


def _copy(source, sink, lost_daemons):
    """Copy the launcher's output to this process's as it comes, noting the hosts of daemons prterun lost."""
    sink = getattr(sink, "buffer", sink)
    seen_header = False
    tail = b""
    while True:
        try:
            chunk = os.read(source.fileno(), 65536)
        except OSError:
            break
        if not chunk:
            break
        try:
            sink.write(chunk)
            sink.flush()
        except (OSError, ValueError):
            pass
        lines = (tail + chunk).split(b"\n")
        tail = lines.pop()[-4096:]
        for line in lines:
            for kind, header in _LOST_DAEMON_HEADER.items():
                if header in line:
                    seen_header = kind
            if seen_header:
                match = _LOST_DAEMON.search(line)
                if match:
                    lost_daemons.append((seen_header, (match.group(1) or match.group(2)).decode(errors="replace")))
                    seen_header = False


def _exit_code(wait_status):
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def _signal_all(pids, signum):
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def supervise(command, checkpoint_dir, grace=10.0, kill_after=10.0, orphan_wait=90.0):
    """Run `command` (a list) as described in this module's docstring; returns the exit status."""
    note = os.path.join(checkpoint_dir, NOTE)
    stale = _stamp(note)
    checkpoints_before = _listing(checkpoint_dir)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: orphans are not this process's to wait for; the rest holds
    terminal = None
    if sys.stdin is not None and sys.stdin.isatty():
        try:
            if os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp():
                terminal = sys.stdin.fileno()
        except OSError:
            terminal = None
    pending = []
    previous = {signum: signal.signal(signum, lambda signum, frame: pending.append(signum)) for signum in FORWARDED}
    try:
        group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": lambda: os.setpgid(0, 0)}
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **group)
    except OSError as exc:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _say(f"cannot start {command[0]!r}: {exc}")
        return 2
    if terminal is not None:
        # The launcher reads the terminal (mpirun forwards stdin to rank 0) and gets its Ctrl-C directly, once.
        old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(terminal, child.pid)
        except OSError:
            terminal = None
        signal.signal(signal.SIGTTOU, old)
    name = os.path.basename(command[0])
    lost_daemons = []
    copiers = [threading.Thread(target=_copy, args=(child.stdout, sys.stdout, lost_daemons), daemon=True),
               threading.Thread(target=_copy, args=(child.stderr, sys.stderr, lost_daemons), daemon=True)]
    for copier in copiers:
        copier.start()
    status = None
    lost_at = None
    terms_sent = 0
    killed = False
    try:
        while status is None:
            while pending:
                _signal_all([child.pid], pending.pop(0))
            status = _reap(child.pid, None)
            if status is not None:
                break
            now = time.monotonic()
            if lost_at is None and _stamp(note) not in (None, stale):
                lost_at = now
                _say(f"{note} was written (a rank lost a peer); {name} gets {grace:g} s to end by itself")
            if lost_at is not None:
                due = lost_at + grace
                if terms_sent < 3 and now >= due + terms_sent:
                    if terms_sent == 0:
                        _say(f"{name} (pid {child.pid}) is still running {grace:g} s after the note: sending it "
                             f"SIGTERM three times (Open MPI's prterun exits at the third)")
                    os.kill(child.pid, signal.SIGTERM)
                    terms_sent += 1
                elif terms_sent == 3 and not killed and now >= due + 2 + kill_after:
                    _say(f"{name} (pid {child.pid}) is still running: SIGKILL to its process group")
                    os.killpg(child.pid, signal.SIGKILL)
                    killed = True
            time.sleep(_POLL)
        code = _exit_code(status)
        child.returncode = code  # reaped here, not by Popen
        for copier in copiers:  # the launcher's last words, before this process's own (a process it left may
            copier.join(0.2)    # hold the pipes open: its output keeps coming through)
        _say(f"{name} exited with status {code}")
        lost = sorted({host for header, host in lost_daemons
                       if header == "lost" or _listing(checkpoint_dir) != checkpoints_before})
        if lost:
            # prterun after a daemon's connection failed mid-job (its host's processes killed, the kernel alive): it
            # ended the job, with status 0 or 255, and the ranks did not finish. (A daemon that failed to report
            # back before any checkpoint of this run was written is a start-up failure: its own status stands.)
            _say(f"{name} lost its daemon on {', '.join(lost)} (its own message above): the job did not finish; "
                 f"exit status {PEER_LOST_STATUS} (a node was lost: requeue or relaunch with --resume)")
            code = PEER_LOST_STATUS
        left = _children_of(os.getpid())
        if left:
            _say(f"{name} left {len(left)} process(es) running: {', '.join(_describe(pid) for pid in left)}; "
                 f"waiting up to {orphan_wait:g} s for them to end")
            deadline = time.monotonic() + orphan_wait
            while left and time.monotonic() < deadline:
                while pending:  # a stop signal now is for the ranks left: their launcher is gone
                    _signal_all(left, pending.pop(0))
                time.sleep(_POLL)
                _reap(child.pid, status)
                left = _children_of(os.getpid())
            if left:
                _say(f"ending {', '.join(_describe(pid) for pid in left)}: still running {orphan_wait:g} s after "
                     f"{name} exited")
                _signal_all(left, signal.SIGTERM)
                deadline = time.monotonic() + 5
                while left and time.monotonic() < deadline:
                    time.sleep(_POLL)
                    _reap(child.pid, status)
                    left = _children_of(os.getpid())
                _signal_all(left, signal.SIGKILL)
                time.sleep(_POLL)
                _reap(child.pid, status)
                if code == 0:
                    code = 1  # "success" with ranks still running (prterun after a lost daemon): not a success
        for copier in copiers:
            copier.join(2)
        if _stamp(note) not in (None, stale):
            _say(f"a node was lost (exit status {PEER_LOST_STATUS}: requeue or relaunch with --resume). From "
                 f"{note}:\n{_read(note)}")
            return PEER_LOST_STATUS
        return code
    finally:
        if status is None:  # an error in this loop: the launcher must not outlive it
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if terminal is not None:
            old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            try:
                os.tcsetpgrp(terminal, os.getpgrp())
            except OSError:
                pass
            signal.signal(signal.SIGTTOU, old)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command: give the launcher's command line after --, e.g. -- mpirun -np 2 python train.py")
    return supervise(command, args.checkpoint_dir, args.grace, args.kill_after, args.orphan_wait)


if __name__ == "__main__":
    sys.exit(main())
