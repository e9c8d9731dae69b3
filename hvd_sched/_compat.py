"""The stack check and the one run-time adjustment hvd_sched needs on the newer rows of its support matrix.

Imported by ``hvd_sched.keras`` before anything imports Horovod (and by the test and benchmark scripts that
import Horovod themselves). On import it:

1. reads the installed versions (Python, numpy, TensorFlow, tf-keras, the TensorFlow Horovod was built
   against) from package metadata, without importing TensorFlow, and raises `UnsupportedStackError` (an
   `ImportError`) naming what was found, what is supported and the command that installs a supported stack,
   before TensorFlow or Horovod can fail deep inside their own imports (e.g. TensorFlow 2.15 under numpy 2);
2. on TensorFlow >= 2.16 with ``TF_USE_LEGACY_KERAS=1`` makes ``import keras`` resolve to ``tf_keras``
   (Keras 2, what ``tf.keras`` is then): Horovod 0.28.1's Keras layer does ``from keras import backend``, and
   Keras 3 there breaks ``MetricAverageCallback`` (``module 'keras.backend' has no attribute 'constant'``);
3. imports ``horovod.tensorflow`` and turns a failed load (Horovod missing, or built against another
   TensorFlow) into the same clear error.

Nothing of Horovod's is patched. Users on the newer rows import ``hvd_sched.keras`` (or ``hvd_sched._compat``)
before ``horovod.tensorflow.keras``; the rows themselves are pinned in ``scripts/versions.env``
(``SUPPORTED_STACKS`` repeats them, tests/unit/test_compat.py checks that the two agree).
"""

import importlib.metadata
import importlib.util
import json
import os
import pathlib
import sys

__all__ = ["SUPPORTED_STACKS", "UnsupportedStackError", "installed_stack", "stack_problems", "check_stack"]

# name -> (Python, TensorFlow, tf-keras or None when Keras 2 is built in, numpy spec, what Horovod needs).
SUPPORTED_STACKS = {
    "tf2.15": ("3.11", "2.15.1", None, "numpy<2", "Horovod 0.28.1"),
    "tf2.20": ("3.12", "2.20.0", "2.20.1", "numpy>=1.26,<3",
               "Horovod 0.28.1 built without xla_mpi_ops.cc, TF_USE_LEGACY_KERAS=1"),
}
_TF_DISTS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos", "tf-nightly")
_LEGACY_VALUES = ("1", "true", "True")  # what TensorFlow itself accepts for TF_USE_LEGACY_KERAS


class UnsupportedStackError(ImportError):
    """hvd_sched.keras cannot run on the installed Python / TensorFlow / Keras / numpy / Horovod."""


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _major_minor(version):
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit()) or "0"
        parts.append(int(digits))
    return tuple(parts + [0] * (2 - len(parts)))


def _horovod_built_tf():
    """The TensorFlow version Horovod was compiled against (horovod/metadata.json), without importing Horovod."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "metadata.json"
    try:
        return json.loads(path.read_text()).get("tensorflow")
    except (OSError, ValueError):
        return "unknown"


def installed_stack():
    """The versions found here, as the keyword arguments of `stack_problems` (None: not installed)."""
    tensorflow = next(filter(None, (_version(dist) for dist in _TF_DISTS)), None)
    return {"python": "%d.%d.%d" % sys.version_info[:3], "numpy": _version("numpy"), "tensorflow": tensorflow,
            "tf_keras": _version("tf-keras"), "horovod": _version("horovod"), "horovod_tf": _horovod_built_tf(),
            "legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS")}


def stack_problems(*, python, numpy, tensorflow, tf_keras, horovod, horovod_tf, legacy_keras):
    """What is wrong with a stack, from version strings only (pure: testable with any versions).

    Args:
        python, numpy, tensorflow, tf_keras, horovod: installed versions (None: not installed).
        horovod_tf: the TensorFlow version Horovod was built against (horovod/metadata.json), or None.
        legacy_keras: the value of TF_USE_LEGACY_KERAS, or None when unset.

    Returns:
        A list of problems, each one sentence with its fix; empty when hvd_sched.keras can run.
    """
    if tensorflow is None:
        return ["TensorFlow is not installed (hvd_sched.keras needs TensorFlow and Horovod)"]
    problems = []
    tf_mm = _major_minor(tensorflow)
    if tf_mm < (2, 15):
        problems.append(f"TensorFlow {tensorflow} is older than every supported row (2.15 is the oldest)")
    if numpy is not None and _major_minor(numpy) >= (2, 0) and tf_mm < (2, 18):
        problems.append(f"numpy {numpy} with TensorFlow {tensorflow}: TensorFlow before 2.18 is built against "
                        "numpy 1.x and fails on numpy 2 (pip install 'numpy<2')")
    if tf_mm >= (2, 16):
        # TensorFlow 2.16+ makes tf.keras Keras 3 unless TF_USE_LEGACY_KERAS is set; Horovod 0.28.1 has Keras 2
        # support only (horovod #4290), and so does hvd_sched's optimizer glue.
        if legacy_keras not in _LEGACY_VALUES:
            shown = "unset" if legacy_keras is None else f"={legacy_keras!r}"
            problems.append(f"TensorFlow {tensorflow} makes tf.keras Keras 3 (TF_USE_LEGACY_KERAS is {shown}); "
                            "Horovod 0.28.1 supports Keras 2 only: export TF_USE_LEGACY_KERAS=1 before Python starts")
        if tf_keras is None:
            problems.append(f"tf-keras is not installed; TensorFlow {tensorflow} needs it for Keras 2 "
                            f"(pip install 'tf-keras~={tf_mm[0]}.{tf_mm[1]}.0')")
        elif _major_minor(tf_keras) != tf_mm:
            problems.append(f"tf-keras {tf_keras} does not match TensorFlow {tensorflow} (they are released in "
                            "step: install the tf-keras of the same minor version)")
    if horovod is None:
        problems.append("Horovod is not installed (it must be built from source against this TensorFlow)")
    elif horovod_tf not in (None, "unknown") and _major_minor(horovod_tf) != tf_mm:
        problems.append(f"Horovod {horovod} was built against TensorFlow {horovod_tf}, not the installed "
                        f"{tensorflow}: rebuild it (pip uninstall horovod, then rerun scripts/install.sh)")
    return problems


def _install_command(python):
    """The one command that installs the supported row for this Python (the default row otherwise)."""
    for name, (row_python, *_rest) in SUPPORTED_STACKS.items():
        if python.startswith(row_python + ".") and name != next(iter(SUPPORTED_STACKS)):
            return f"HVD_SCHED_STACK={name} bash scripts/install.sh .venv-{name}"
    return "bash scripts/install.sh .venv"


def _message(problems, found):
    rows = "\n".join(
        f"  {name}: Python {py}, TensorFlow {tf}" + (f" + tf-keras {keras}" if keras else " (Keras 2 built in)")
        + f", {numpy}, {hvd}" for name, (py, tf, keras, numpy, hvd) in SUPPORTED_STACKS.items())
    shown = ", ".join(f"{key}={value}" for key, value in found.items())
    return ("hvd_sched.keras cannot run on this stack:\n" + "\n".join(f"  - {p}" for p in problems)
            + f"\nFound: {shown}\nSupported stacks (scripts/versions.env):\n{rows}\n"
            + "Install a supported stack from a checkout of hvd_sched: " + _install_command(found["python"]))


def check_stack():
    """Raises `UnsupportedStackError` (found / supported / install command) unless hvd_sched.keras can run."""
    found = installed_stack()
    problems = stack_problems(**found)
    if problems:
        raise UnsupportedStackError(_message(problems, found))
    return found


def _use_tf_keras_as_keras(found):
    """`import keras` -> tf_keras, so Horovod's `from keras import backend` gets the Keras that tf.keras is."""
    if _major_minor(found["tensorflow"]) < (2, 16):
        return
    import tf_keras

    keras = sys.modules.get("keras")
    if keras is not tf_keras and any(name in sys.modules for name in ("horovod._keras", "horovod.tensorflow.keras")):
        raise UnsupportedStackError(
            "horovod.tensorflow.keras was imported before hvd_sched.keras on TensorFlow "
            f"{found['tensorflow']}: its Keras layer then holds Keras 3 (`keras`), not tf-keras. "
            "Import hvd_sched.keras first.")
    sys.modules["keras"] = tf_keras


def _import_horovod(found):
    import tensorflow as tf

    try:
        import horovod.tensorflow  # noqa: F401  (loads Horovod's compiled ops against this TensorFlow)
    except (ImportError, tf.errors.NotFoundError) as error:
        problem = f"horovod.tensorflow does not load on TensorFlow {found['tensorflow']}: {error}"
        raise UnsupportedStackError(_message([problem], found)) from error


def _prepare():
    found = check_stack()
    _use_tf_keras_as_keras(found)
    _import_horovod(found)


_prepare()
