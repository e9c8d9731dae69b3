"""A real Python environment of this row without Horovod (and, on request, without hvd_sched), for the tests of
hvd_sched off the cluster (tests/keras/test_off_cluster.py).

    python = environment(tmp_path / "env", without=("horovod",))
    subprocess.run([python, "-c", "import horovod"])        # ModuleNotFoundError: it is not installed there

A venv of this interpreter (`python -m venv --without-pip`) whose site-packages holds a symbolic link to every
entry of this environment's site-packages except the distributions named (their modules and their .dist-info):
what `pip uninstall horovod` leaves, without copying TensorFlow. Nothing is mocked: `importlib.metadata` and
`importlib.util.find_spec` find no Horovod there, as on a serving host or a laptop. Made under the caller's folder
(a pytest tmp_path), nothing in the tree.
"""

import os
import pathlib
import subprocess
import sys
import sysconfig

__all__ = ["environment", "run"]

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: The tree's hvd_sched and the tests' helpers (rankutil, stackutil), for run(..., env={"PYTHONPATH": PATHS}).
PATHS = os.pathsep.join([str(ROOT), str(ROOT / "tests")])


def _excluded(name, without):
    """True for the entries of a site-packages that belong to one of the distributions `without`: its module
    (folder or .py), its .dist-info / .egg-info, an editable install's files."""
    lowered = name.lower()
    for distribution in without:
        stem = distribution.lower().replace("-", "_")
        if lowered in (stem, f"{stem}.py") or (lowered.endswith((".dist-info", ".egg-info"))
                                               and lowered.split("-")[0].replace(".", "_") == stem) \
                or (lowered.startswith("__editable__") and stem in lowered):
            return True
    return False


def environment(folder, without=("horovod",)):
    """The python executable of a new environment: this one's packages, less the distributions in `without`."""
    folder = pathlib.Path(folder)
    if not (folder / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--symlinks", str(folder)], check=True,
                       timeout=120, capture_output=True)
        source = pathlib.Path(sysconfig.get_paths()["purelib"])
        python = folder / "bin" / "python"
        target = pathlib.Path(subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
            timeout=60, capture_output=True, text=True).stdout.strip())
        target.mkdir(parents=True, exist_ok=True)
        for entry in source.iterdir():
            if not _excluded(entry.name, without) and not (target / entry.name).exists():
                (target / entry.name).symlink_to(entry)
    return str(folder / "bin" / "python")


def run(python, code, cwd, *, tree=True, env=None, timeout=300):
    """Run `code` (a Python program) with `python` in `cwd`; the tree's hvd_sched first on the path where `tree`.
    Returns the CompletedProcess (text); the caller asserts on it."""
    environ = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    environ.update({"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", "TF_NUM_INTRAOP_THREADS": "1",
                    "TF_NUM_INTEROP_THREADS": "1", "OMP_NUM_THREADS": "1"})
    if tree:
        environ["PYTHONPATH"] = str(ROOT)
    environ.update(env or {})
    return subprocess.run([python, "-c", code], cwd=str(cwd), env=environ, capture_output=True, text=True,
                          timeout=timeout)
