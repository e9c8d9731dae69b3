"""Shared fixtures and the suite's two rules.

1. **Which rows run a test** (tests/rows.py): a row runs a test when it is the first row with the test's values on
   the axes its outcome can depend on; the other rows deselect it, and the header says how many.
2. **No test can hang or leave a process behind** (tests/guard.py, whose hooks are registered here): a bound on
   every test, every process a test started killed when it ends, the launches' output shown when it fails.

`run_ranks` launches a Python script on N real Horovod ranks (Gloo) and returns their results.
"""

import json
import os
import pathlib
import sys
import textwrap
import time

import pytest

import rows
from guard import (pytest_configure, pytest_runtest_call, pytest_runtest_makereport,  # noqa: F401 (hooks)
                   pytest_sessionfinish)
from launch import horovodrun_cmd, run_and_collect

_TESTS = pathlib.Path(__file__).resolve().parent


def _axes(item):
    marks = list(item.iter_markers("depends_on"))
    if marks:
        return marks[0].args  # the closest: a test's own mark before its module's
    return rows.default_axes(pathlib.Path(str(item.fspath)).resolve().relative_to(_TESTS).as_posix())


def pytest_collection_modifyitems(config, items):
    for item in items:  # an unknown axis is an error on every row, not only where the rule is evaluated
        item.stash[_ROWS] = rows.rows_for(_axes(item))
    here = rows.running_stack()
    if here is None or os.environ.get("HVD_SCHED_ALL_ROWS") == "1":
        return
    kept, left = [], []
    for item in items:
        (kept if here in item.stash[_ROWS] else left).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept
        config.stash[_LEFT] = (here, len(kept), len(left))


_ROWS = pytest.StashKey()
_LEFT = pytest.StashKey()


# --- where CI's time goes: how busy the machine's cores were during each test ----------------------------------------

def _cpu_jiffies():
    """(busy, all) jiffies of every core together since boot (/proc/stat's first line), or None."""
    try:
        fields = [int(value) for value in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With HVD_SCHED_CPU_LOG set (scripts/test.sh's multi-rank phase): one line per test (setup, call and
    teardown) with its seconds and the share of the machine's cores it kept busy, for the phase's summary."""
    log = os.environ.get("HVD_SCHED_CPU_LOG")
    before, started = (_cpu_jiffies(), time.monotonic()) if log else (None, None)
    yield
    after = _cpu_jiffies() if before else None
    if after:
        busy, total = after[0] - before[0], after[1] - before[1]
        with open(log, "a") as out:
            out.write(json.dumps({"test": item.nodeid, "seconds": round(time.monotonic() - started, 2),
                                  "busy": round(busy / total, 3) if total else None}) + "\n")


def pytest_report_collectionfinish(config):
    if _LEFT in config.stash:
        here, kept, left = config.stash[_LEFT]
        return (f"rows rule (tests/rows.py): row {here} runs {kept} of the tests; {left} run on other rows only "
                f"(HVD_SCHED_ALL_ROWS=1 runs them here too)")
    return None


# --- fixtures ------------------------------------------------------------------------------------------------------

@pytest.fixture
def run_ranks(tmp_path):
    """run_ranks(source, np=2, timeout=240, env=None) -> list of each rank's `emit(...)` result, by rank.

    `source` is the text of a Python script; it runs under real `horovodrun -np N --gloo` and must call
    `rankutil.emit(result)` once per rank. A failing rank fails the test with every rank's stdout and stderr.
    """
    counter = {"n": 0}

    def run(source, np=2, timeout=240, env=None, args=()):
        counter["n"] += 1
        work = tmp_path / f"job{counter['n']}"
        work.mkdir()
        script = work / "rank_script.py"
        script.write_text(textwrap.dedent(source))
        results, _ = run_and_collect(horovodrun_cmd(np, script, args), work, np, timeout, env)
        return results

    return run


@pytest.fixture
def run_single(tmp_path):
    """run_single(source, timeout=240) -> the `emit(result, rank=0)` result of a plain (non-Horovod) process."""
    counter = {"n": 0}

    def run(source, timeout=240, env=None, args=()):
        counter["n"] += 1
        work = tmp_path / f"single{counter['n']}"
        work.mkdir()
        script = work / "single_script.py"
        script.write_text(textwrap.dedent(source))
        results, _ = run_and_collect([sys.executable, str(script), *map(str, args)], work, 1, timeout, env)
        return results[0]

    return run
