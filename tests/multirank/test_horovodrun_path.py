"""The environment's `horovodrun --mpi`, called by its path from a shell where the environment is not activated,
finds the Open MPI installed into it (scripts/install.sh, scripts/mpi.sh patch_horovodrun_path) and trains.

Horovod 0.28.1 runs `mpirun` from PATH only; unpatched, this command says "horovod does not find an installed
MPI". Skipped, with the reason, for a Horovod built without MPI or against a cluster's MPI outside the environment.
"""

import os
import pathlib
import re
import sys

import pytest

from launch import horovodrun_mpi_cmd, mpi_env, mpi_missing, run_command

# The script patch depends on the Python (its console-script template) and the Horovod build, not on Keras.
pytestmark = [pytest.mark.multirank, pytest.mark.depends_on("python", "horovod")]

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_keras.py"
DEMO = ROOT / "examples" / "configs" / "digits_warmup_steps.yaml"
FINAL = re.compile(r"rank (\d+): final val accuracy ([0-9.]+) \(360 samples, iteration (\d+)\)")


def _path_without_any_mpirun():
    """The caller's PATH less this environment's bin/ and every folder that holds an `mpirun`, so only the
    horovodrun script itself can lead Horovod to the bundled one."""
    env_bin = pathlib.Path(sys.executable).parent
    kept = [entry for entry in os.environ.get("PATH", "").split(os.pathsep)
            if entry and not (pathlib.Path(entry) / "mpirun").exists()
            and not (pathlib.Path(entry).exists() and pathlib.Path(entry).resolve() == env_bin.resolve())]
    return os.pathsep.join(kept or ["/usr/bin", "/bin"])


def test_horovodrun_mpi_trains_without_the_environment_on_path(tmp_path):
    reason = mpi_missing()
    if reason:
        pytest.skip(reason)
    env = {**mpi_env(), "PATH": _path_without_any_mpirun()}  # mpi_env's root consent, not its PATH
    command = horovodrun_mpi_cmd(2, SCRIPT, ["--config", DEMO, "--epochs", 1, "--out", tmp_path / "out"])
    proc = run_command(command, tmp_path, env, timeout=300)
    output = proc.stdout + proc.stderr
    assert "does not find an installed MPI" not in output, output[-4000:]
    assert proc.returncode == 0, f"exited {proc.returncode}\n{output[-8000:]}"
    assert "[1,0]<stdout>:" in proc.stdout  # launched through Open MPI's mpirun (--tag-output)
    finals = {int(rank): (float(acc), int(it)) for rank, acc, it in FINAL.findall(output)}
    assert sorted(finals) == [0, 1] and finals[0] == finals[1] and finals[0][1] == 22, output[-4000:]
