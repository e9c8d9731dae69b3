"""Which rows of the support matrix run a test: one rule, declared here and applied by tests/conftest.py.

A test depends on some *axes* of the stack, the things its outcome can differ by:

| axis          | what a row pins (scripts/versions.env)                                           |
|---------------|----------------------------------------------------------------------------------|
| `python`      | PYTHON_VERSION                                                                   |
| `numpy`       | NUMPY_SPEC (numpy 1 on tf2.15, numpy 2 on the others)                            |
| `tensorflow`  | TENSORFLOW_VERSION                                                               |
| `keras`       | what `tf.keras` is: TensorFlow's own Keras 2, tf-keras, or Keras 3, and its version |
| `keras_major` | 2 or 3: which of hvd_sched.keras' two paths (_keras2.py, _keras3.py) runs        |
| `horovod`     | the Horovod build: its version, the TensorFlow it is built against, its XLA ops  |

**The rule: a row runs a test when it is the first row, in STACKS order, with its values on the test's axes.**
Rows that repeat a combination another row already ran would rerun the same thing. A test with no axes (launchers,
Slurm, ssh, the docs site, the build recipes, the benchmarks' quick runs: what they exercise is the launcher, the
recipe or the files, not the Keras major) runs on the default row alone.

A test's axes: its `depends_on(...)` mark where it has one (a module's `pytestmark` or the test's own), else the
default of its folder or file (`DEFAULT_AXES`). `HVD_SCHED_ALL_ROWS=1` runs every test on the row at hand; a Python
that belongs to no row (a user's own environment) runs every test too. Importable without pytest.
"""

import os
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
AXES = ("python", "numpy", "tensorflow", "keras", "keras_major", "horovod")

#: numpy, PyYAML and the standard library only: differs by Python and numpy.
PURE = ("python", "numpy")
#: TensorFlow ops, no Keras.
TF_OPS = ("python", "numpy", "tensorflow")
#: hvd_sched.keras in one process: every row.
KERAS = ("python", "numpy", "tensorflow", "keras")
#: the whole stack (the installed pins themselves).
STACK = AXES
#: a multi-rank job whose hvd_sched.keras path is not the same on Keras 2 and 3 (Keras 3: hvd_sched's own
#: allreduce, stop agreement and iteration count): one Keras 2 row and the Keras 3 row.
KERAS_PATH = ("keras_major",)
#: the launcher, the recipe, the files: the default row.
LAUNCHER = ()

#: Folder or file (relative to tests/) -> its tests' axes, where they carry no depends_on mark; the longest match
#: wins. What is not listed (the recipes' dry runs, the launch files, the benchmarks, the docs site) is LAUNCHER.
DEFAULT_AXES = {
    "unit/": PURE,
    "unit/test_compat.py": STACK,  # checks the running stack itself
    "test_cli.py": PURE,
    "keras/": KERAS,
    "docs/test_doc_examples.py": KERAS,
    "docs/test_docstrings.py": KERAS,
    "test_versions.py": LAUNCHER,
    "multirank/": LAUNCHER,
}


def read_versions_env(path=ROOT / "scripts" / "versions.env"):
    """versions.env as a dict of NAME -> value (its plain NAME=value lines)."""
    values = {}
    for line in pathlib.Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip().strip("\"'")
    return values


ENV = read_versions_env()
STACKS = ENV["STACKS"].split()
DEFAULT = STACKS[0]


def pin(stack, name):
    """One pin of a row: STACK_<row>_<NAME> where the row overrides it, else the default row's NAME."""
    suffix = re.sub(r"[.-]", "_", stack)
    return ENV.get(f"STACK_{suffix}_{name}", ENV.get(name, "")) if stack != DEFAULT else ENV.get(name, "")


def _minor(version):
    return tuple(int(part) for part in version.split(".")[:2])


def axis_values(stack):
    """The row's value on every axis, from its pins."""
    tf = pin(stack, "TENSORFLOW_VERSION")
    if _minor(tf) < (2, 16):
        keras = f"TensorFlow {tf}'s Keras 2"
    elif pin(stack, "LEGACY_KERAS") == "1":
        keras = f"tf-keras {pin(stack, 'TF_KERAS_VERSION')}"
    else:
        keras = f"keras {pin(stack, 'KERAS_VERSION')}"
    return {"python": pin(stack, "PYTHON_VERSION"), "numpy": pin(stack, "NUMPY_SPEC"), "tensorflow": tf,
            "keras": keras, "keras_major": 3 if keras.startswith("keras ") else 2,
            "horovod": (pin(stack, "HOROVOD_VERSION"), tf, pin(stack, "HOROVOD_NO_XLA"))}


def rows_for(axes):
    """The rows that run a test with these axes (STACKS order)."""
    unknown = set(axes) - set(AXES)
    if unknown:
        raise ValueError(f"depends_on: unknown axis {sorted(unknown)}; the axes are {list(AXES)}")
    chosen, seen = [], set()
    for stack in STACKS:
        values = axis_values(stack)
        key = tuple(repr(values[axis]) for axis in axes)
        if key not in seen:
            seen.add(key)
            chosen.append(stack)
    return chosen


def default_axes(relative):
    """The axes of a test file's tests without a depends_on mark (`relative`: its path under tests/)."""
    matches = [key for key in DEFAULT_AXES if relative == key or (key.endswith("/") and relative.startswith(key))]
    return DEFAULT_AXES[max(matches, key=len)] if matches else LAUNCHER


def running_stack():
    """The row this interpreter belongs to, or None: HVD_SCHED_STACK (the Makefile exports it), else the row whose
    virtual environment this is (.venv, .venv-NAME)."""
    if os.environ.get("HVD_SCHED_STACK") in STACKS:
        return os.environ["HVD_SCHED_STACK"]
    venv = pathlib.Path(sys.prefix).name
    return next((stack for stack in STACKS if venv == (".venv" if stack == DEFAULT else f".venv-{stack}")), None)
