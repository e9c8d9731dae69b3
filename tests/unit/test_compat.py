"""hvd_sched._compat: the stack check (pure, fed version strings) and, on the running row, the real import.

The pure checks run on every row; the subprocess checks use this row's real TensorFlow and Horovod (Keras 3 and
the import order matter only on TensorFlow >= 2.16 and are skipped on the default row; both newer rows have
keras 3.15.1 installed, so the Keras 3 checks run on tf2.21 with TF_USE_LEGACY_KERAS unset as well as on keras3).
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
TF2_15 = dict(python="3.11.9", numpy="1.26.4", tensorflow="2.15.1", tf_keras=None, keras="2.15.0", horovod="0.28.1",
              horovod_tf="2.15.1", legacy_keras=None)
TF2_20 = dict(python="3.12.1", numpy="2.1.3", tensorflow="2.20.0", tf_keras="2.20.1", keras="3.15.1", horovod="0.28.1",
              horovod_tf="2.20.0", legacy_keras="1")
TF2_21 = dict(python="3.13.0", numpy="2.3.5", tensorflow="2.21.0", tf_keras="2.21.0", keras="3.15.1", horovod="0.28.1",
              horovod_tf="2.21.0", legacy_keras="1")
KERAS3 = dict(TF2_20, tf_keras=None, legacy_keras=None)


def _stack(base, **changes):
    return dict(base, **changes)


@pytest.mark.parametrize("stack", [TF2_15, TF2_20, TF2_21, _stack(TF2_21, legacy_keras=None, tf_keras=None),
                                   _stack(TF2_21, python="3.10.13"), _stack(TF2_15, legacy_keras="1"),
                                   _stack(TF2_20, legacy_keras="true"), _stack(TF2_20, numpy="1.26.4"),
                                   KERAS3, _stack(KERAS3, legacy_keras="0"), _stack(KERAS3, legacy_keras="false"),
                                   _stack(KERAS3, tf_keras="2.20.1"), _stack(KERAS3, tensorflow="2.21.0",
                                                                               horovod_tf="2.21.0")])
def test_supported_rows_have_no_problems(stack):
    assert _compat.stack_problems(**stack) == []


@pytest.mark.parametrize("stack, match", [
    # Keras 3 is supported now (the keras3 row); refused when Keras 3 is asked for and no Keras 3 is installed.
    (_stack(TF2_20, legacy_keras=None, keras=None),
     r"makes tf.keras Keras 3 \(TF_USE_LEGACY_KERAS is unset\) but the keras package is not installed.*export "
     r"TF_USE_LEGACY_KERAS=1"),
    (_stack(TF2_20, legacy_keras="0", keras="2.15.0"), r"TF_USE_LEGACY_KERAS is ='0'\) but keras 2\.15\.0 is "
                                                       r"installed: pip install 'keras>=3,<4'"),
    (_stack(KERAS3, keras="4.0.1"), r"keras 4\.0\.1 is installed"),
    (_stack(KERAS3, horovod_tf="2.15.1"), r"Horovod 0\.28\.1 was built against TensorFlow 2\.15\.1"),
    (_stack(KERAS3, numpy="1.26.4", tensorflow="2.17.1", horovod_tf="2.17.1", keras=None),
     r"TensorFlow 2\.17\.1 makes tf.keras Keras 3"),
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


def test_keras_3_without_any_keras_reports_every_problem():
    # Keras 3 asked for without tf-keras is the keras3 row now: the problems are no Keras 3 and a Horovod built
    # against another TensorFlow, both reported.
    problems = _compat.stack_problems(**_stack(TF2_20, legacy_keras=None, tf_keras=None, keras=None,
                                               horovod_tf="2.15.1"))
    assert [p.split(" ")[0] for p in problems] == ["TensorFlow", "Horovod"]
    assert _compat.stack_problems(**_stack(TF2_20, legacy_keras=None, tf_keras=None)) == []


@pytest.mark.parametrize("tensorflow, legacy_keras, major", [
    ("2.15.1", None, 2), ("2.15.1", "1", 2), ("2.15.0rc1", "0", 2),
    ("2.16.1", None, 3), ("2.20.0", None, 3), ("2.21.0", None, 3), ("3.0.0", None, 3),
    ("2.20.0", "1", 2), ("2.20.0", "true", 2), ("2.20.0", "True", 2),
    # TensorFlow reads only these three as true (tensorflow/__init__.py): anything else leaves tf.keras Keras 3.
    ("2.20.0", "0", 3), ("2.20.0", "false", 3), ("2.20.0", "TRUE", 3), ("2.20.0", "yes", 3), ("2.20.0", "", 3),
])
def test_keras_major_is_tensorflows_rule(tensorflow, legacy_keras, major):
    assert _compat.keras_major({"tensorflow": tensorflow, "legacy_keras": legacy_keras}) == major


def test_keras_major_reads_the_environment_without_importing_tensorflow(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # `import tensorflow` now raises ImportError
    newer = _compat._major_minor(_compat.installed_stack()["tensorflow"]) >= (2, 16)
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    assert _compat.keras_major() == 2
    monkeypatch.delenv("TF_USE_LEGACY_KERAS")
    assert _compat.keras_major() == (3 if newer else 2)
    assert _compat.keras_major(_compat.installed_stack()) == (3 if newer else 2)


def test_keras_major_without_tensorflow_is_an_unsupported_stack():
    with pytest.raises(_compat.UnsupportedStackError, match="TensorFlow is not installed"):
        _compat.keras_major({"tensorflow": None, "legacy_keras": None})


def test_keras_major_is_public():
    assert "keras_major" in _compat.__all__ and "SUPPORTED_STACKS" in _compat.__all__


@pytest.mark.parametrize("python, command", [
    ("3.11.9", "bash scripts/install.sh .venv"),
    ("3.12.1", "bash scripts/install.sh .venv"),
    # TF_USE_LEGACY_KERAS unset asks for Keras 3: of the two Python 3.13 rows, keras3.
    ("3.13.0", "HVD_SCHED_STACK=keras3 bash scripts/install.sh .venv-keras3"),
])
def test_message_says_found_supported_and_the_install_command(python, command):
    found = _stack(TF2_20, python=python, legacy_keras=None, keras=None)
    message = _compat._message(_compat.stack_problems(**found), found)
    assert message.startswith("hvd_sched.keras cannot run on this stack:\n  - TensorFlow 2.20.0 makes tf.keras")
    assert f"Found: python={python}, numpy=2.1.3, tensorflow=2.20.0, tf_keras=2.20.1, keras=None" in message
    assert "tf2.15: Python 3.11, TensorFlow 2.15.1 (Keras 2 built in), numpy<2, Horovod 0.28.1" in message
    assert "tf2.21: Python 3.13, TensorFlow 2.21.0 + tf-keras 2.21.0" in message
    assert ("keras3: Python 3.13, TensorFlow 2.21.0 + Keras 3.15.1, numpy>=1.26,<3, Horovod 0.28.1 built without "
            "xla_mpi_ops.cc, TF_USE_LEGACY_KERAS unset") in message
    assert message.endswith(f"Install a supported stack from a checkout of hvd_sched: {command}")


@pytest.mark.parametrize("legacy_keras, row", [("1", "tf2.21"), ("true", "tf2.21"), (None, "keras3"), ("0", "keras3")])
def test_install_command_picks_the_python_3_13_row_the_environment_asks_for(legacy_keras, row):
    found = _stack(TF2_21, tf_keras=None, keras=None, legacy_keras=legacy_keras)
    message = _compat._message(_compat.stack_problems(**found), found)
    assert message.endswith(f"HVD_SCHED_STACK={row} bash scripts/install.sh .venv-{row}")


def test_error_is_an_import_error():
    assert issubclass(_compat.UnsupportedStackError, ImportError)


def test_supported_stacks_equal_versions_env():
    rows = subprocess.run(["bash", str(ROOT / "scripts" / "stack.sh"), "--list"], capture_output=True, text=True,
                          check=True).stdout.split()
    assert rows == list(_compat.SUPPORTED_STACKS)
    for name, (python, tensorflow, tf_keras, keras, numpy, _horovod) in _compat.SUPPORTED_STACKS.items():
        pins = dict(line.split("=", 1) for line in subprocess.run(
            ["bash", str(ROOT / "scripts" / "stack.sh"), name], capture_output=True, text=True,
            check=True).stdout.splitlines())
        assert (pins["PYTHON_VERSION"], pins["TENSORFLOW_VERSION"], pins["TF_KERAS_VERSION"] or None,
                pins["KERAS_VERSION"] or None, pins["NUMPY_SPEC"]) == (python, tensorflow, tf_keras, keras, numpy), name
        # The row's TF_USE_LEGACY_KERAS (LEGACY_KERAS) makes tf.keras the Keras the row lists.
        legacy = "1" if pins["LEGACY_KERAS"] == "1" else None
        expected = 3 if tf_keras is None and keras else 2
        assert _compat.keras_major({"tensorflow": tensorflow, "legacy_keras": legacy}) == expected, name


def test_this_row_is_supported_and_horovod_sees_its_keras():
    found = _compat.check_stack()
    assert found["horovod_tf"] == found["tensorflow"]
    import tensorflow as tf
    import horovod.tensorflow.keras  # noqa: F401

    keras = sys.modules["keras"]
    # What Horovod's Keras layer imports as `keras` is the Keras that tf.keras is (Keras 2 on the tf2.15 and tf2.21
    # rows, Keras 3 on keras3).
    assert keras.__version__.startswith(f"{_compat.keras_major()}."), keras.__version__
    assert tf.keras.optimizers.SGD.__module__.split(".")[0] == keras.__name__.split(".")[0]


def _run(code, path=(), **env_changes):
    env = {key: value for key, value in os.environ.items() if key not in env_changes}
    env.update({key: value for key, value in env_changes.items() if value is not None})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*map(str, path), str(ROOT), os.environ.get("PYTHONPATH")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=env)


_NEWER_ROW = pytest.mark.skipif(_compat._major_minor(_compat.installed_stack()["tensorflow"]) < (2, 16),
                                reason="Keras 3 as tf.keras exists only on TensorFlow >= 2.16")
_TF_KERAS_ROW = pytest.mark.skipif(_compat.installed_stack()["tf_keras"] is None,
                                   reason="Keras 2 through TF_USE_LEGACY_KERAS=1 needs tf-keras (the tf2.21 row)")


def _fake_keras_2(tmp_path):
    """A folder that, put first on the path, makes package metadata report keras 2.15.0 (the real Keras 3
    package is still what `import keras` loads; _compat stops before that)."""
    info = tmp_path / "keras-2.15.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: keras\nVersion: 2.15.0\n")
    return tmp_path


@_NEWER_ROW
def test_keras_3_is_a_clear_error_at_import(tmp_path):
    # Keras 3 is supported now: the refusal is for Keras 3 asked for (TF_USE_LEGACY_KERAS unset) when the
    # installed `keras` is Keras 2.
    completed = _run("import hvd_sched.keras", path=[_fake_keras_2(tmp_path)], TF_USE_LEGACY_KERAS=None)
    assert completed.returncode != 0
    last = completed.stderr.strip().splitlines()
    assert any(line.startswith("hvd_sched._compat.UnsupportedStackError: hvd_sched.keras cannot run") for line in last)
    assert "TF_USE_LEGACY_KERAS is unset" in completed.stderr
    assert "keras 2.15.0 is installed" in completed.stderr
    assert "horovod" not in "".join(line for line in last if line.startswith('  File "'))  # not from inside Horovod


@_NEWER_ROW
@_TF_KERAS_ROW
def test_horovod_imported_first_is_a_clear_error():
    completed = _run("import horovod.tensorflow.keras\nimport hvd_sched.keras", TF_USE_LEGACY_KERAS="1")
    assert completed.returncode != 0
    assert ("Move `import hvd_sched.keras` (or `import hvd_sched._compat`) above `import horovod.tensorflow.keras` "
            "in your script (hvd_sched is imported at <string>, line 2).") in completed.stderr
    assert "horovod.tensorflow.keras was imported before hvd_sched on TensorFlow" in completed.stderr


@_NEWER_ROW
@_TF_KERAS_ROW
def test_horovod_imported_first_with_tf_keras_already_is_accepted():
    # The check looks at the Keras Horovod's layer holds, not at the order: bound to tf_keras, nothing is wrong.
    completed = _run("import sys, tf_keras\nsys.modules['keras'] = tf_keras\n"
                     "import horovod.tensorflow.keras as hvd\nimport hvd_sched._compat\n"
                     "print(hvd.K.__name__, hvd.callbacks.K.__name__)", TF_USE_LEGACY_KERAS="1")
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert [name.split(".")[0] for name in completed.stdout.split()] == ["tf_keras", "tf_keras"]


_KERAS_3_CHECK = "\n".join([
    "import sys, tensorflow as tf", "from hvd_sched import _compat", "import horovod.tensorflow.keras as hvd",
    "keras = sys.modules['keras']", "assert keras.__name__ == 'keras', keras",
    "print(_compat.keras_major(), tf.keras.__version__, keras.__version__, hvd.K.__name__)"])


@_NEWER_ROW
@pytest.mark.parametrize("order", ["hvd_sched first", "horovod first"])
def test_keras_3_imports_in_either_order(order):
    lines = ["import hvd_sched._compat", "import horovod.tensorflow.keras"]
    if order == "horovod first":
        lines.reverse()
    completed = _run("\n".join(lines) + "\n" + _KERAS_3_CHECK, TF_USE_LEGACY_KERAS=None)
    assert completed.returncode == 0, completed.stderr[-3000:]
    major, tf_keras_version, keras_version, backend = completed.stdout.split()[-4:]
    # No keras -> tf_keras alias (even where tf-keras is installed): tf.keras and Horovod's `keras` are Keras 3.
    assert major == "3" and tf_keras_version == keras_version and keras_version.startswith("3."), completed.stdout
    assert backend.split(".")[0] == "keras", backend


def test_import_hvd_sched_keras_works_here():
    legacy = "1" if os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True") else None
    completed = _run("import sys, hvd_sched.keras; print(sys.modules['keras'].__version__)", TF_USE_LEGACY_KERAS=legacy)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.strip().splitlines()[-1].startswith(f"{_compat.keras_major()}.")
