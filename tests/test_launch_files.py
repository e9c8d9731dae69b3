"""The job files users copy to launch the demo: examples/slurm/train.sbatch (run for real by
tests/multirank/test_launchers.py) and examples/kubernetes/mpijob.yaml (not run: no Kubernetes here), read and
checked for what they must say."""

import pathlib
import re
import subprocess

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO = ["examples/train_keras.py", "--config", "examples/configs/digits_warmup_steps.yaml", "--epochs", "8"]


def test_the_mpijob_manifest_is_a_two_worker_open_mpi_job_running_the_demo():
    [job] = list(yaml.safe_load_all((ROOT / "examples" / "kubernetes" / "mpijob.yaml").read_text()))
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    spec = job["spec"]
    assert spec["mpiImplementation"] == "OpenMPI" and spec["slotsPerWorker"] == 1
    launcher = spec["mpiReplicaSpecs"]["Launcher"]
    workers = spec["mpiReplicaSpecs"]["Worker"]
    assert launcher["replicas"] == 1 and workers["replicas"] == 2
    [container] = launcher["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:4] == ["mpirun", "--allow-run-as-root", "-np", "2"]
    assert command[4:-2] == ["python", *DEMO] and command[-2] == "--out"
    assert (ROOT / command[5]).exists() and (ROOT / command[7]).exists()
    [worker] = workers["template"]["spec"]["containers"]
    assert worker["command"] == ["/usr/sbin/sshd", "-De"]
    assert container["image"] == worker["image"] == "hvd_sched:cpu"


def test_the_slurm_script_starts_two_pmix_tasks_of_the_demo():
    text = (ROOT / "examples" / "slurm" / "train.sbatch").read_text()
    assert re.search(r"^#SBATCH --ntasks=2$", text, re.MULTILINE)
    assert re.search(r'^srun --mpi=pmix "\$python" examples/train_keras.py --config "\$config" --epochs', text,
                     re.MULTILINE)
    assert "set -euo pipefail" in text
    subprocess.run(["bash", "-n", str(ROOT / "examples" / "slurm" / "train.sbatch")], check=True, timeout=30)
