"""The suite's own guard (tests/guard.py), run for real: an inner pytest with the guard's hooks, on tests that hang on
purpose, must fail them by name, show their stack and their launches' output, go on, and leave no process behind,
also where the hang is outside Python (the backstop) and where pytest itself is stopped by SIGTERM (a CI bound).

Every process the inner tests start carries a marker in its command line; none may be left once the inner pytest
has ended (`pgrep -f`, which also sees SIGSTOPped processes and orphans).
"""

import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

TESTS = pathlib.Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from guard import pytest_configure, pytest_runtest_call, pytest_runtest_makereport, pytest_sessionfinish
"""

# A "launcher" that starts a "rank" in a session of its own and exits (the rank is orphaned, as horovodrun's ranks
# are when horovodrun is killed alone), and a SIGSTOPped process: the two kinds a fault test leaves.
START = """
import os, signal, subprocess, sys, time
import launch

def start_like_a_launcher(marker, tmp_path):
    log = tmp_path / "rank0.txt"
    log.write_text("rank 0: epoch 3, still training\\n")
    launch.register_output(log)
    subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                      "'import time; time.sleep(600)', sys.argv[1]], start_new_session=True)", marker])
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker],
                               start_new_session=True)
    os.kill(stopped.pid, signal.SIGSTOP)
    deadline = time.time() + 30
    while time.time() < deadline and len(subprocess.run(["pgrep", "-f", marker], capture_output=True,
                                                        text=True).stdout.split()) < 2:
        time.sleep(0.05)
"""


def _inner(tmp_path, test_source, env=None, timeout=120, on_start=None):
    """Run an inner pytest on `test_source` with the guard; returns (returncode, output, marker)."""
    marker = f"hvd-sched-guard-{uuid.uuid4().hex}"
    folder = tmp_path / "inner"
    folder.mkdir()
    (folder / "conftest.py").write_text(CONFTEST)
    (folder / "pytest.ini").write_text("[pytest]\ntimeout_method = signal\n")
    (folder / "test_inner.py").write_text(START + textwrap.dedent(test_source).replace("MARKER", marker))
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-rA",
               "--rootdir", str(folder), "-c", str(folder / "pytest.ini"), str(folder)]
    proc = subprocess.Popen(command, cwd=folder, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        if on_start:
            on_start(proc, marker)
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, output, marker


def _left(marker):
    """The pids of processes still carrying the marker (a moment's grace for the last reaps)."""
    deadline = time.time() + 5
    while True:
        pids = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
        if not pids or time.time() > deadline:
            return pids
        time.sleep(0.1)


def test_a_test_that_never_returns_fails_by_name_and_leaves_nothing_running(tmp_path):
    returncode, output, marker = _inner(tmp_path, """
        import pytest

        @pytest.mark.timeout(3)
        def test_never_returns(tmp_path):
            start_like_a_launcher("MARKER", tmp_path)
            time.sleep(600)

        def test_the_run_goes_on():
            pass
        """)
    assert returncode == 1, output
    assert "FAILED test_inner.py::test_never_returns" in output and "Timeout" in output
    assert "1 failed, 1 passed" in output
    assert re.search(r"def test_never_returns.*\n>\s+time\.sleep\(600\)\nE\s+Failed: Timeout", output, re.DOTALL)
    assert "Stack of Thread" in output  # pytest-timeout's dump of the other threads
    assert "rank 0: epoch 3, still training" in output  # its launch's output
    assert _left(marker) == []


def test_a_hang_outside_python_is_ended_by_the_backstop_naming_the_test(tmp_path):
    # SIGALRM blocked: pytest-timeout's signal can never interrupt the call, as in a hang inside C code.
    returncode, output, marker = _inner(tmp_path, """
        import pytest

        @pytest.mark.timeout(2)
        def test_blocked_outside_python(tmp_path):
            start_like_a_launcher("MARKER", tmp_path)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(600)
        """, env={"HVD_SCHED_TEST_BACKSTOP_S": "2"})
    assert returncode == 3, output
    assert "guard backstop: test_inner.py::test_blocked_outside_python did not return within its 2 s bound" in output
    assert "in test_blocked_outside_python" in output  # faulthandler's stack of the main thread
    assert "rank 0: epoch 3, still training" in output
    assert _left(marker) == []


def test_sigterm_to_pytest_kills_what_its_tests_started(tmp_path):
    def stop_once_started(proc, marker):
        deadline = time.time() + 60
        while time.time() < deadline and len(_pids(marker)) < 2:
            time.sleep(0.05)
        assert len(_pids(marker)) >= 2, "the inner test never started its processes"
        proc.send_signal(signal.SIGTERM)  # what `timeout` sends at .ci/run's bound

    returncode, output, marker = _inner(tmp_path, """
        def test_long(tmp_path):
            start_like_a_launcher("MARKER", tmp_path)
            time.sleep(600)
        """, on_start=stop_once_started)
    assert returncode != 0 and "KeyboardInterrupt" in output and "pytest got signal 15" in output, output
    assert _left(marker) == []


def _pids(marker):
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()


@pytest.mark.parametrize("axes, expected", [
    ((), ["tf2.15"]),
    (("python", "numpy"), ["tf2.15", "tf2.21"]),
    (("python", "numpy", "tensorflow", "keras"), ["tf2.15", "tf2.21", "keras3"]),
    (("keras_major",), ["tf2.15", "keras3"]),
    (("python", "horovod"), ["tf2.15", "tf2.21"]),
])
def test_the_rows_rule_runs_each_combination_of_a_tests_axes_once(axes, expected):
    import rows

    assert rows.STACKS == ["tf2.15", "tf2.21", "keras3"]  # the expectations below are for these rows
    assert rows.rows_for(axes) == expected


def test_an_unknown_axis_is_refused_by_name():
    import rows

    with pytest.raises(ValueError, match=r"unknown axis \['keras_version'\]"):
        rows.rows_for(("keras_version",))
