"""hvd_sched._compat: the stack check (pure, fed version strings) and, on the running row, the real import.

The pure checks run on every row; the subprocess checks use this row's real TensorFlow and Horovod (the
Keras 3 and import-order errors exist only on TensorFlow >= 2.16 and are skipped on the default row).
"""

import os
import re
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow", reason="hvd_sched._compat checks a TensorFlow stack")

from hvd_sched import _compat  # noqa: E402  (imports Horovod: after the skip above)

ROOT = pathlib.Path(__file__).resolve().parents[2]
TF2_15 = dict(python="3.11.9", numpy="1.26.4", tensorflow="2.15.1", tf_keras=None, horovod="0.28.1",
              horovod_tf="2.15.1", legacy_keras=None)
TF2_20 = dict(python="3.12.1", numpy="2.1.3", tensorflow="2.20.0", tf_keras="2.20.1", horovod="0.28.1",
              horovod_tf="2.20.0", legacy_keras="1")


def _stack(base, **changes):
    return dict(base, **changes)


@pytest.mark.parametrize("stack", [TF2_15, TF2_20, _stack(TF2_15, legacy_keras="1"),
                                   _stack(TF2_20, legacy_keras="true"), _stack(TF2_20, numpy="1.26.4")])
def test_supported_rows_have_no_problems(stack):
    assert _compat.stack_problems(**stack) == []


@pytest.mark.parametrize("stack, match", [
    (_stack(TF2_20, legacy_keras=None), r"makes tf.keras Keras 3 \(TF_USE_LEGACY_KERAS is unset\).*export "
                                        r"TF_USE_LEGACY_KERAS=1"),
    (_stack(TF2_20, legacy_keras="0"), r"TF_USE_LEGACY_KERAS is ='0'"),
    (_stack(TF2_20, tf_keras=None), r"tf-keras is not installed.*tf-keras~=2\.20\.0"),
    (_stack(TF2_20, tf_keras="2.17.0"), r"tf-keras 2\.17\.0 does not match TensorFlow 2\.20\.0"),
    (_stack(TF2_15, numpy="2.0.2"), r"numpy 2\.0\.2 with TensorFlow 2\.15\.1.*numpy<2"),
    (_stack(TF2_15, horovod=None, horovod_tf=None), r"Horovod is not installed"),
    (_stack(TF2_20, horovod_tf="2.15.1"), r"Horovod 0\.28\.1 was built against TensorFlow 2\.15\.1, not the "
                                          r"installed 2\.20\.0"),
    (_stack(TF2_15, tensorflow="2.13.1", horovod_tf="2.13.1"), r"older than every supported row"),
    (_stack(TF2_15, tensorflow=None), r"TensorFlow is not installed"),
])
def test_unsupported_stacks_are_named(stack, match):
    problems = _compat.stack_problems(**stack)
    assert len(problems) == 1, problems
    assert re.search(match, problems[0]), problems[0]


def test_keras_3_without_tf_keras_reports_both():
    problems = _compat.stack_problems(**_stack(TF2_20, legacy_keras=None, tf_keras=None))
    assert [p.split(" ")[0] for p in problems] == ["TensorFlow", "tf-keras"]


@pytest.mark.parametrize("python, command", [
    ("3.11.9", "bash scripts/install.sh .venv"),
    ("3.12.1", "HVD_SCHED_STACK=tf2.20 bash scripts/install.sh .venv-tf2.20"),
    ("3.13.0", "bash scripts/install.sh .venv"),
])
def test_message_says_found_supported_and_the_install_command(python, command):
    found = _stack(TF2_20, python=python, legacy_keras=None)
    message = _compat._message(_compat.stack_problems(**found), found)
    assert message.startswith("hvd_sched.keras cannot run on this stack:\n  - TensorFlow 2.20.0 makes tf.keras")
    assert f"Found: python={python}, numpy=2.1.3, tensorflow=2.20.0, tf_keras=2.20.1" in message
    assert "tf2.15: Python 3.11, TensorFlow 2.15.1 (Keras 2 built in), numpy<2, Horovod 0.28.1" in message
    assert "tf2.20: Python 3.12, TensorFlow 2.20.0 + tf-keras 2.20.1" in message
    assert message.endswith(f"Install a supported stack from a checkout of hvd_sched: {command}")


def test_error_is_an_import_error():
    assert issubclass(_compat.UnsupportedStackError, ImportError)


def test_supported_stacks_equal_versions_env():
    rows = subprocess.run(["bash", str(ROOT / "scripts" / "stack.sh"), "--list"], capture_output=True, text=True,
                          check=True).stdout.split()
    assert rows == list(_compat.SUPPORTED_STACKS)
    for name, (python, tensorflow, tf_keras, numpy, _horovod) in _compat.SUPPORTED_STACKS.items():
        pins = dict(line.split("=", 1) for line in subprocess.run(
            ["bash", str(ROOT / "scripts" / "stack.sh"), name], capture_output=True, text=True,
            check=True).stdout.splitlines())
        assert (pins["PYTHON_VERSION"], pins["TENSORFLOW_VERSION"], pins["TF_KERAS_VERSION"] or None,
                pins["NUMPY_SPEC"]) == (python, tensorflow, tf_keras, numpy), name


def test_this_row_is_supported_and_horovod_sees_its_keras():
    found = _compat.check_stack()
    assert found["horovod_tf"] == found["tensorflow"]
    import tensorflow as tf
    import horovod.tensorflow.keras  # noqa: F401

    keras = sys.modules["keras"]
    # What Horovod's Keras layer imports as `keras` is the Keras that tf.keras is (Keras 2 on every row).
    assert keras.__version__.startswith("2."), keras.__version__
    assert tf.keras.optimizers.SGD.__module__.split(".")[0] == keras.__name__.split(".")[0]


def _run(code, **env_changes):
    env = {key: value for key, value in os.environ.items() if key not in env_changes}
    env.update({key: value for key, value in env_changes.items() if value is not None})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=env)


_NEWER_ROW = pytest.mark.skipif(_compat._major_minor(_compat.installed_stack()["tensorflow"]) < (2, 16),
                                reason="Keras 3 as tf.keras exists only on TensorFlow >= 2.16")


@_NEWER_ROW
def test_keras_3_is_a_clear_error_at_import():
    completed = _run("import hvd_sched.keras", TF_USE_LEGACY_KERAS=None)
    assert completed.returncode != 0
    last = completed.stderr.strip().splitlines()
    assert any(line.startswith("hvd_sched._compat.UnsupportedStackError: hvd_sched.keras cannot run") for line in last)
    assert "TF_USE_LEGACY_KERAS is unset" in completed.stderr
    assert "horovod" not in "".join(line for line in last if line.startswith('  File "'))  # not from inside Horovod


@_NEWER_ROW
def test_horovod_imported_first_is_a_clear_error():
    completed = _run("import horovod.tensorflow.keras, hvd_sched.keras", TF_USE_LEGACY_KERAS="1")
    assert completed.returncode != 0
    assert "Import hvd_sched.keras first." in completed.stderr


def test_import_hvd_sched_keras_works_here():
    legacy = "1" if os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True") else None
    completed = _run("import sys, hvd_sched.keras; print(sys.modules['keras'].__version__)", TF_USE_LEGACY_KERAS=legacy)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.strip().splitlines()[-1].startswith("2.")
