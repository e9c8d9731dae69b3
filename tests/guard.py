"""No test can hang or leave a process behind (imported by tests/conftest.py, which registers these hooks).

- pytest-timeout bounds every test (pytest.ini's default, longer `timeout` marks where a test needs them); its
  signal method fails the test with every thread's stack, and the run goes on.
- This process is a child subreaper, so whatever a test starts stays its descendant even after the launcher between
  them dies (ranks, slurmstepd, an sshd's sessions). Every process that appeared during a test's call is killed
  when the call ends (passed, failed or timed out; a SIGSTOPped one too); what is left at the end of the session is
  killed then. A fixture's daemons (launch.KEPT) are spared until then; what a fixture made outside the process
  tree (network namespaces: launch.CLEANUPS) is removed by its teardown, or by the guard where no teardown runs.
- A test that fails shows the tail of the output files its launches registered (launch.register_output).
- A call that does not come back to Python within its bound + BACKSTOP_S (a hang inside C code, which the signal
  cannot interrupt) dumps every thread's stack and those outputs, kills the descendants and ends pytest with
  status 3, naming the test.
- SIGTERM to pytest (.ci/run's bound, a user's kill) kills the descendants first, then ends the run as Ctrl-C does.
"""

import ctypes
import faulthandler
import os
import pathlib
import signal
import sys
import threading
import time

import pytest

import launch

#: Seconds past a test's timeout before the backstop ends pytest (the signal method normally fires first).
BACKSTOP_S = float(os.environ.get("HVD_SCHED_TEST_BACKSTOP_S", "60"))


def pytest_configure(config):
    _become_subreaper()
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum, frame):
    """A bound above this pytest ends it: first every process its tests started, which would outlive it
    otherwise, then the run, as Ctrl-C does (pytest prints where it was)."""
    kill_all(descendants())
    launch.run_cleanups()
    raise KeyboardInterrupt(f"pytest got signal {signum}")


def _become_subreaper():
    """Orphans of this process's descendants are re-parented to it, not to init, so they can be found and killed."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def descendants(root=None):
    """Every live descendant pid of `root` (default: this process), from /proc."""
    root = os.getpid() if root is None else root
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = pathlib.Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def kill_all(pids):
    """SIGKILL each pid (a stopped process dies of SIGKILL too), then reap, for up to 10 s, those that are this
    process's children (its own, or orphans re-parented to this subreaper)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    waiting = set(pids)
    while waiting and time.monotonic() < deadline:
        for pid in list(waiting):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            except ChildProcessError:
                pass  # not our child (its parent reaps it) or already reaped
            waiting.discard(pid)
        if waiting:
            time.sleep(0.05)


def _timeout_of(item):
    mark = item.get_closest_marker("timeout")
    if mark and mark.args:
        return float(mark.args[0])
    try:
        return float(item.config.getini("timeout") or 0)
    except ValueError:  # pytest-timeout is not installed (a bare venv): no bound to back up
        return 0.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    before = set(descendants())
    launch.OUTPUTS.clear()
    bound = _timeout_of(item)
    backstop = None
    if bound > 0:
        backstop = threading.Timer(bound + BACKSTOP_S, _backstop, args=(item, bound))
        backstop.daemon = True
        backstop.start()
    try:
        yield
    finally:
        if backstop is not None:
            backstop.cancel()
        kill_all([pid for pid in descendants() if pid not in before and pid not in launch.KEPT])


def _backstop(item, bound):
    capture = item.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:  # write where the user sees it, not into the test's capture (lost at os._exit)
        capture.suspend_global_capture(in_=True)
        out, err = capture.read_global_capture()
        sys.stderr.write(out + err)
    sys.stderr.write(f"\n\nguard backstop: {item.nodeid} did not return within its {bound:.0f} s bound + "
                     f"{BACKSTOP_S:.0f} s (blocked outside Python, where the timeout's signal cannot reach); "
                     "every thread's stack:\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    _write_outputs(sys.stderr)
    kill_all(descendants())
    launch.run_cleanups()
    sys.stderr.flush()
    os._exit(3)


def _write_outputs(stream):
    for path in list(launch.OUTPUTS):
        try:
            stream.write(f"--- {path} (last 6000 characters) ---\n{pathlib.Path(path).read_text()[-6000:]}\n")
        except OSError:
            pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for path in list(launch.OUTPUTS):
            try:
                report.sections.append((f"output of the test's launch: {path}", pathlib.Path(path).read_text()[-6000:]))
            except OSError:
                pass


@pytest.hookimpl(trylast=True)  # after pytest-xdist has shut its workers down (they are descendants too)
def pytest_sessionfinish(session, exitstatus):
    left = descendants()
    if left:
        kill_all(left)
    launch.run_cleanups()
