"""Shared fixtures and the suite's two rules.

1. **Which rows run a test** (tests/rows.py): a row runs a test when it is the first row with the test's values on
   the axes its outcome can depend on; the other rows deselect it, and the header says how many.
2. **No test can hang or leave a process behind** (tests/guard.py, whose hooks are registered here): a bound on
   every test, every process a test started killed when it ends, the launches' output shown when it fails.

`run_ranks` launches a Python script on N real Horovod ranks (Gloo) and returns their results.
"""

import os
import pathlib
import sys
import textwrap

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
