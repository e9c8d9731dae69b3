"""Shared fixtures: `run_ranks` launches a Python script on N real Horovod ranks (Gloo) and returns their results."""

import pathlib
import sys
import textwrap

import pytest

from launch import horovodrun_cmd, run_and_collect


_TESTS = pathlib.Path(__file__).resolve().parent
# Files whose tests never touch Keras (numpy, PyYAML, the command line); test_compat.py checks the running stack.
_KERAS_INDEPENDENT = ("unit/", "test_cli.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        relative = pathlib.Path(str(item.fspath)).resolve().relative_to(_TESTS).as_posix()
        if relative.startswith(_KERAS_INDEPENDENT) and not relative.endswith("test_compat.py"):
            item.add_marker(pytest.mark.keras_independent)


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
