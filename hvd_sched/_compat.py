"""The stack check and the one run-time adjustment hvd_sched needs on the newer rows of its support matrix.

Imported by `hvd_sched.keras` before anything imports Horovod (and by the test and benchmark scripts that
import Horovod themselves). On import it:

1. reads the installed versions (Python, numpy, TensorFlow, tf-keras, keras, the TensorFlow Horovod was built
   against) from package metadata, without importing TensorFlow, and raises `UnsupportedStackError` (an
   `ImportError`) naming what was found, what is supported and the command that installs a supported stack,
   before TensorFlow or Horovod can fail deep inside their own imports (e.g. TensorFlow 2.15 under numpy 2);
2. only where `tf.keras` is Keras 2 from tf-keras (TensorFlow >= 2.16 with `TF_USE_LEGACY_KERAS=1`, see
   `keras_major`), makes `import keras` resolve to `tf_keras`: Horovod 0.28.1's Keras layer does
   `from keras import backend`, and Keras 3 there breaks `MetricAverageCallback` (`module 'keras.backend'
   has no attribute 'constant'`). Where `tf.keras` is Keras 3 (the keras3 row) `keras` is left alone;
3. imports `horovod.tensorflow` and turns a failed load (a Horovod built against another TensorFlow, or broken)
   into the same clear error. Where Horovod is not installed at all, hvd_sched.keras runs in one process
   (`HOROVOD` is False): the names that need Horovod raise `HorovodMissingError` when used, naming the install.

Nothing of Horovod's is patched. On the tf-keras rows users import `hvd_sched.keras` (or
`hvd_sched._compat`) before `horovod.tensorflow.keras`, and the error says which line to move when they do
not; on the Keras 3 row the order does not matter. The rows themselves are pinned in `scripts/versions.env`
(`SUPPORTED_STACKS` repeats them, tests/unit/test_compat.py checks that the two agree).
"""

import collections
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import sys

__all__ = ["SUPPORTED_STACKS", "UnsupportedStackError", "HorovodMissingError", "installed_stack", "stack_problems",
           "check_stack", "keras_major", "horovod_installed", "require_horovod", "HOROVOD"]

_Row = collections.namedtuple("_Row", "python tensorflow tf_keras keras numpy horovod")
# name -> (Python, TensorFlow, tf-keras or None when tf.keras is not tf-keras, the keras pin or None when
# TensorFlow pins it itself, numpy spec, what Horovod needs).
SUPPORTED_STACKS = {
    "tf2.15": _Row("3.11", "2.15.1", None, None, "numpy<2", "Horovod 0.28.1"),
    "tf2.21": _Row("3.13", "2.21.0", "2.21.0", "3.15.1", "numpy>=1.26,<3",
                   "Horovod 0.28.1 built without xla_mpi_ops.cc, TF_USE_LEGACY_KERAS=1"),
    "keras3": _Row("3.13", "2.21.0", None, "3.15.1", "numpy>=1.26,<3",
                   "Horovod 0.28.1 built without xla_mpi_ops.cc, TF_USE_LEGACY_KERAS unset"),
}
_TF_DISTS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos", "tf-nightly")
# What TensorFlow itself accepts for TF_USE_LEGACY_KERAS (tensorflow/__init__.py and
# tensorflow/python/util/lazy_loader.py, 2.16-2.21); anything else, "0" and "false" included, means Keras 3.
_LEGACY_VALUES = ("1", "true", "True")
# Horovod's modules that bind a Keras when imported: `K` is `from keras import backend` in the first two, and
# horovod.keras (for standalone Keras) imports `keras` itself.
_HOROVOD_KERAS_MODULES = (("horovod.tensorflow.keras", "K"), ("horovod.tensorflow.keras.callbacks", "K"),
                          ("horovod.keras", "keras"))


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


def _tensorflow_version():
    return next(filter(None, (_version(dist) for dist in _TF_DISTS)), None)


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
    return {"python": "%d.%d.%d" % sys.version_info[:3], "numpy": _version("numpy"),
            "tensorflow": _tensorflow_version(), "tf_keras": _version("tf-keras"), "keras": _version("keras"),
            "horovod": _version("horovod"), "horovod_tf": _horovod_built_tf(),
            "legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS")}


def keras_major(found=None):
    """The major version of the Keras that `tf.keras` is on this stack: 2 or 3, without importing TensorFlow.

    3 if and only if TensorFlow >= 2.16 and `TF_USE_LEGACY_KERAS` is not one of the values TensorFlow itself
    reads as true (`"1"`, `"true"`, `"True"`; unset, `"0"`, `"false"` and anything else mean Keras 3),
    the rule of `tensorflow/__init__.py`. 2 otherwise: TensorFlow 2.15 has Keras 2 built in, later ones route
    `tf.keras` to tf-keras under `TF_USE_LEGACY_KERAS=1`. Whether that Keras is installed is
    `stack_problems`' question, not this one's. `hvd_sched.keras` picks its Keras 2 or Keras 3 implementation
    with it.

    Args:
        found: a mapping with `"tensorflow"` (the installed version string) and `"legacy_keras"` (the value
            of `TF_USE_LEGACY_KERAS`, None when unset), as `installed_stack` returns it; None (the default)
            reads both now, from package metadata and `os.environ`.

    Returns:
        2 or 3.

    Raises:
        UnsupportedStackError: TensorFlow is not installed (`found["tensorflow"]` is None).

    Example:
        >>> from hvd_sched import _compat
        >>> _compat.keras_major({"tensorflow": "2.20.0", "legacy_keras": None})
        3
        >>> _compat.keras_major({"tensorflow": "2.20.0", "legacy_keras": "1"})
        2
    """
    if found is None:
        found = {"tensorflow": _tensorflow_version(), "legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS")}
    if found["tensorflow"] is None:
        raise UnsupportedStackError("TensorFlow is not installed (hvd_sched.keras needs TensorFlow and Horovod)")
    if _major_minor(found["tensorflow"]) >= (2, 16) and found["legacy_keras"] not in _LEGACY_VALUES:
        return 3
    return 2


def stack_problems(*, python, numpy, tensorflow, tf_keras, keras, horovod, horovod_tf, legacy_keras):
    """What is wrong with a stack, from version strings only (pure: testable with any versions).

    Args:
        python, numpy, tensorflow, tf_keras, keras, horovod: installed versions (None: not installed);
            `keras` is the `keras` distribution (Keras 3 on TensorFlow >= 2.16).
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
    major = keras_major({"tensorflow": tensorflow, "legacy_keras": legacy_keras})
    if major == 3:
        # TensorFlow 2.16+ makes tf.keras the `keras` package, Keras 3, unless TF_USE_LEGACY_KERAS is set.
        if keras is None or _major_minor(keras)[0] != 3:
            shown = "unset" if legacy_keras is None else f"={legacy_keras!r}"
            what = "the keras package is not installed" if keras is None else f"keras {keras} is installed"
            problems.append(
                f"TensorFlow {tensorflow} makes tf.keras Keras 3 (TF_USE_LEGACY_KERAS is {shown}) but {what}: "
                f"pip install 'keras>=3,<4' (the keras3 row pins {SUPPORTED_STACKS['keras3'].keras}) for Keras 3, "
                "or install tf-keras and export TF_USE_LEGACY_KERAS=1 before Python starts for Keras 2")
    elif tf_mm >= (2, 16):
        # TF_USE_LEGACY_KERAS=1: tf.keras is tf-keras, which must be there and of TensorFlow's minor version
        # (without it TensorFlow falls back to Keras 3 with a warning only).
        if tf_keras is None:
            problems.append(f"tf-keras is not installed; TensorFlow {tensorflow} needs it for Keras 2 "
                            f"(TF_USE_LEGACY_KERAS={legacy_keras}): pip install 'tf-keras~={tf_mm[0]}.{tf_mm[1]}.0', "
                            "or unset TF_USE_LEGACY_KERAS for Keras 3")
        elif _major_minor(tf_keras) != tf_mm:
            problems.append(f"tf-keras {tf_keras} does not match TensorFlow {tensorflow} (they are released in "
                            "step: install the tf-keras of the same minor version)")
    if horovod is None:
        problems.append(HOROVOD_MISSING)
    elif horovod_tf not in (None, "unknown") and _major_minor(horovod_tf) != tf_mm:
        problems.append(f"Horovod {horovod} was built against TensorFlow {horovod_tf}, not the installed "
                        f"{tensorflow}: rebuild it (pip uninstall horovod, then rerun scripts/install.sh)")
    return problems


def _install_command(python, legacy_keras=None):
    """The one command that installs the supported row for this Python (the default row otherwise).

    Two rows share Python 3.13 (tf2.21 with tf-keras, keras3): the one whose Keras the environment asks for
    (TF_USE_LEGACY_KERAS) is named.
    """
    default = next(iter(SUPPORTED_STACKS))
    wants_tf_keras = legacy_keras in _LEGACY_VALUES
    candidates = [name for name, row in SUPPORTED_STACKS.items()
                  if python.startswith(row.python + ".") and name != default]
    matching = [name for name in candidates if (SUPPORTED_STACKS[name].tf_keras is not None) == wants_tf_keras]
    for name in matching + candidates:
        return f"HVD_SCHED_STACK={name} bash scripts/install.sh .venv-{name}"
    return "bash scripts/install.sh .venv"


def _describe_row(name, row):
    if row.tf_keras:
        keras = f" + tf-keras {row.tf_keras}"
    elif row.keras:
        keras = f" + Keras {row.keras}"
    else:
        keras = " (Keras 2 built in)"
    return f"  {name}: Python {row.python}, TensorFlow {row.tensorflow}{keras}, {row.numpy}, {row.horovod}"


def _message(problems, found):
    rows = "\n".join(_describe_row(name, row) for name, row in SUPPORTED_STACKS.items())
    shown = ", ".join(f"{key}={value}" for key, value in found.items())
    return ("hvd_sched.keras cannot run on this stack:\n" + "\n".join(f"  - {p}" for p in problems)
            + f"\nFound: {shown}\nSupported stacks (scripts/versions.env):\n{rows}\n"
            + "Install a supported stack from a checkout of hvd_sched: "
            + _install_command(found["python"], found.get("legacy_keras")))


def check_stack(require_horovod=True):
    """Raises `UnsupportedStackError` (found / supported / install command) unless hvd_sched.keras can run.

    Args:
        require_horovod: where False, a Horovod that is not installed at all is no problem (hvd_sched.keras then
            runs in one process: the solver, the callbacks, the checkpoints; the names that need Horovod raise
            `HorovodMissingError` when used). A Horovod that is installed but built for another TensorFlow is
            refused either way.
    """
    found = installed_stack()
    problems = [problem for problem in stack_problems(**found)
                if require_horovod or problem != HOROVOD_MISSING]
    if problems:
        raise UnsupportedStackError(_message(problems, found))
    return found


def _importer():
    """Where hvd_sched is being imported from: "FILE, line N" of the first frame outside importlib and
    hvd_sched, or None."""
    package = str(pathlib.Path(__file__).resolve().parent) + os.sep
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith("<frozen") and not str(pathlib.Path(filename).resolve()).startswith(package):
            return f"{filename}, line {frame.f_lineno}"
        frame = frame.f_back
    return None


def _horovod_keras_3_holders():
    """Horovod's Keras modules already imported whose Keras is not tf_keras (they bound Keras 3 at import)."""
    holders = []
    for module_name, attribute in _HOROVOD_KERAS_MODULES:
        module = sys.modules.get(module_name)
        bound = getattr(module, attribute, None)
        if bound is not None and getattr(bound, "__name__", "").split(".")[0] != "tf_keras":
            holders.append(module_name)
    return holders


def _use_tf_keras_as_keras(found):
    """`import keras` -> tf_keras, so Horovod's `from keras import backend` gets the Keras that tf.keras is.

    Only where tf.keras is tf-keras (`keras_major` 2 on TensorFlow >= 2.16). If Horovod's Keras layer was
    imported before, it already holds Keras 3's backend; rebinding its module globals would patch Horovod after
    the fact (and miss callbacks already built with the old backend), so the error names the line to move.
    """
    if _major_minor(found["tensorflow"]) < (2, 16) or keras_major(found) != 2:
        return
    import tf_keras

    holders = _horovod_keras_3_holders()
    if holders:
        horovod_import = "horovod.keras" if holders[0] == "horovod.keras" else "horovod.tensorflow.keras"
        where = _importer()
        raise UnsupportedStackError(
            f"{horovod_import} was imported before hvd_sched on TensorFlow {found['tensorflow']} with "
            f"TF_USE_LEGACY_KERAS={found['legacy_keras']}: Horovod's Keras layer then holds Keras 3 "
            "(`from keras import backend`), not tf-keras, which is what tf.keras is here, and its callbacks fail. "
            f"Move `import hvd_sched.keras` (or `import hvd_sched._compat`) above `import {horovod_import}` "
            "in your script" + (f" (hvd_sched is imported at {where})" if where else "") + ".")
    sys.modules["keras"] = tf_keras


def horovod_installed(found=None):
    """True where a Horovod is installed here (its package metadata or its module), whether it loads or not."""
    found = installed_stack() if found is None else found
    return found["horovod"] is not None or importlib.util.find_spec("horovod") is not None


class HorovodMissingError(ImportError):
    """A name of hvd_sched.keras that needs Horovod was used where Horovod is not installed.

    An `ImportError` subclass; its message names what was used, this Python, and the install.
    """


HorovodMissingError.__module__ = "hvd_sched.keras"  # its public name, in tracebacks


def require_horovod(what):
    """Raise `HorovodMissingError` naming `what` (e.g. "hvd_sched.keras.DistributedOptimizer") where Horovod is
    not installed; return None otherwise."""
    if HOROVOD:
        return
    raise HorovodMissingError(
        f"{what} needs Horovod, and Horovod is not installed in this environment ({sys.executable}). To train "
        "on several processes, install it, built against this TensorFlow: bash scripts/install.sh (from a "
        "checkout of hvd_sched; HVD_SCHED_STACK=<row> for another row). In one process leave it out: the "
        "solver (ScheduledOptimizer, build_optimizer), the callbacks, TrainingCheckpoint and load_model "
        "work without Horovod (docs/how-to/off-cluster.md).")


def _import_horovod(found):
    global HOROVOD
    if not horovod_installed(found):
        HOROVOD = False  # one process without Horovod: require_horovod() names the install where it is needed
        return
    import tensorflow as tf

    try:
        import horovod.tensorflow  # noqa: F401  (loads Horovod's compiled ops against this TensorFlow)
    except (ImportError, tf.errors.NotFoundError) as error:
        problem = f"horovod.tensorflow does not load on TensorFlow {found['tensorflow']}: {error}"
        raise UnsupportedStackError(_message([problem], found)) from error


#: Whether Horovod is installed here (and loaded: a Horovod that is installed but does not load stops the import).
HOROVOD = True

#: stack_problems' words for a stack without Horovod (a problem for a distributed job; hvd_sched.keras imports
#: without it, in one process).
HOROVOD_MISSING = "Horovod is not installed (it must be built from source against this TensorFlow)"


def _prepare():
    found = check_stack(require_horovod=False)
    _use_tf_keras_as_keras(found)
    _import_horovod(found)


_prepare()
