"""The job files users copy to launch the demo: examples/slurm/train.sbatch (run for real by
tests/multirank/test_launchers.py and test_slurm_requeue.py) and examples/kubernetes/mpijob.yaml (no Kubernetes
here: its launcher's command runs in tests/multirank/test_preemption.py and test_mpijob_nodes.py), read and checked
for what they must say. The Slurm script's decisions (resume, requeue itself, how often) also run here, with
stand-ins for srun and scontrol."""

import pathlib
import re
import subprocess
import sys

import pytest
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
    # The launcher's shell runs mpirun and turns the pod's SIGTERM into SIGUSR1 for it (mpirun's own SIGTERM kills
    # the ranks 0.25 s later, before they can save); tests/multirank/test_preemption.py runs this script for real.
    assert container["command"][:2] == ["bash", "-c"]
    script = container["command"][2]
    # mpirun runs under hvd_sched.supervise, which ends it once a rank reports a lost node (peer_lost.txt in the
    # checkpoint folder: OUT/ckpt) and passes the trap's SIGUSR1 on to it.
    [line] = [line for line in script.splitlines() if line.startswith("python -m hvd_sched.supervise ")]
    supervise, _, command = line.partition(" -- ")
    command = command.split()
    assert command[-3] == "--out" and supervise.split()[3:] == ["--checkpoint-dir", f"{command[-2]}/ckpt"]
    # The hostfile named to mpirun itself: Open MPI 5 does not read the operator's OMPI_MCA_orte_default_hostfile
    # (every rank ran on the launcher), and without -np it starts one rank per slot of it (replicas x slotsPerWorker).
    assert command[:4] == ["mpirun", "--allow-run-as-root", "--hostfile", "/etc/mpi/hostfile"] and command[-1] == "&"
    assert "-np" not in command and "-n" not in command
    # Before it, a bounded wait for every worker's sshd (a restart after a lost worker, before its pod is replaced).
    before = script[:script.index(line)]
    assert "awk '{print $1}' /etc/mpi/hostfile" in before and 'until ssh -o ConnectTimeout=5 "$host" true' in before
    assert "deadline=$((SECONDS + 900))" in before and "exit 1" in before
    assert command[4:4 + len(DEMO) + 1] == ["python", *DEMO] and command[-3] == "--out"
    assert "--resume" in command and "--checkpoint-period" in command
    assert (ROOT / command[5]).exists() and (ROOT / command[7]).exists()
    assert "trap 'kill -USR1 \"$pid\"' TERM" in script
    subprocess.run(["bash", "-n", "-c", script], check=True, timeout=30)
    for replica in (launcher, workers):  # the time a stop has before Kubernetes' SIGKILL
        assert replica["template"]["spec"]["terminationGracePeriodSeconds"] >= 60
    assert spec["runPolicy"]["backoffLimit"] >= 1  # the launcher runs again, and resumes
    [worker] = workers["template"]["spec"]["containers"]
    assert worker["command"] == ["/usr/sbin/sshd", "-De"]
    assert container["image"] == worker["image"] == "hvd_sched:cpu"


def test_the_slurm_script_starts_two_pmix_tasks_of_the_demo():
    text = (ROOT / "examples" / "slurm" / "train.sbatch").read_text()
    # 2 per node: `sbatch` alone gives 2 ranks on one node, `sbatch -N 2` 4 on two (tests/multirank/test_slurm_nodes.py)
    assert re.search(r"^#SBATCH --ntasks-per-node=2$", text, re.MULTILINE)
    assert not re.search(r"^#SBATCH (--ntasks|-n|--nodes|-N)[= ]", text, re.MULTILINE)
    # srun runs under hvd_sched.supervise (it ends srun once a rank reports a lost node), watching OUT/ckpt
    assert re.search(r'^"\$python" -m hvd_sched.supervise --checkpoint-dir "\$out/ckpt" -- \\\n'
                     r' +srun --mpi=pmix "\$python" examples/train_keras.py --config "\$config" --epochs', text,
                     re.MULTILINE)
    assert "set -euo pipefail" in text
    subprocess.run(["bash", "-n", str(ROOT / "examples" / "slurm" / "train.sbatch")], check=True, timeout=30)


def test_the_slurm_script_asks_slurm_to_requeue_it_and_to_warn_the_tasks_before_the_time_limit():
    """What tests/multirank/test_slurm_requeue.py measured: `--signal=USR1@SECONDS` without `B:` reaches the step's
    tasks (with `B:`, only this shell, and only once srun has returned); a requeued job reruns the script with the
    same job id, so the same OUT, and `--open-mode=append` keeps the first run's log."""
    text = (ROOT / "examples" / "slurm" / "train.sbatch").read_text()
    for line in ("#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --signal=USR1@90"):
        assert re.search(rf"^{re.escape(line)}$", text, re.MULTILINE), line
    assert 'out="${OUT:-runs/slurm-${SLURM_JOB_ID:-local}}"' in text
    assert len(re.findall(r"^\s*scontrol requeue", text, re.MULTILINE)) == 1  # one place asks for a requeue


def _run_slurm_script(tmp_path, srun_status, note=None, **env):
    """Run examples/slurm/train.sbatch with stand-ins for srun (writes `note` to OUT/ckpt/peer_lost.txt where
    given, as a rank that lost a peer does, then exits `srun_status`) and scontrol (records its arguments), as Slurm
    would run it in job 42, with the real hvd_sched.supervise around srun (`python` is this Python, importing this
    tree); returns (exit status, srun's arguments, scontrol's, stderr)."""
    stubs = tmp_path / "bin"
    stubs.mkdir(parents=True)
    for name in ("srun", "scontrol"):
        body = f'#!/bin/bash\nprintf "%s\\n" "$@" >> "{tmp_path}/{name}.args"\n'
        if name == "srun":
            body += ('if [ -n "${SRUN_NOTE:-}" ]; then mkdir -p "${OUT:-runs/slurm-42}/ckpt"; '
                     'echo "$SRUN_NOTE" > "${OUT:-runs/slurm-42}/ckpt/peer_lost.txt"; fi\nexit $SRUN_STATUS\n')
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    (stubs / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (stubs / "python").chmod(0o755)
    environ = {"PATH": f"{stubs}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_NTASKS": "2",
               "SLURM_JOB_NODELIST": "node1", "SRUN_STATUS": str(srun_status), "PYTHONPATH": str(ROOT), **env}
    if note is not None:
        environ["SRUN_NOTE"] = note
    proc = subprocess.run(["bash", str(ROOT / "examples" / "slurm" / "train.sbatch")], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=30)
    args = {name: (tmp_path / f"{name}.args").read_text().split("\n")[:-1] if (tmp_path / f"{name}.args").exists()
            else None for name in ("srun", "scontrol")}
    return proc.returncode, args["srun"], args["scontrol"], proc.stderr


def test_the_slurm_script_always_resumes_and_passes_its_knobs(tmp_path):
    status, srun, scontrol, _ = _run_slurm_script(tmp_path / "plain", 0)
    assert status == 0 and scontrol is None
    assert srun == ["--mpi=pmix", "python", *DEMO, "--out", "runs/slurm-42", "--resume"]
    out = tmp_path / "scratch" / "run"
    status, srun, _, _ = _run_slurm_script(tmp_path / "knobs", 0, PYTHON=sys.executable, EPOCHS="4",
                                           BATCH_SIZE="8", CHECKPOINT_PERIOD="20", PEER_TIMEOUT="30", OUT=str(out))
    assert srun == ["--mpi=pmix", sys.executable, *DEMO[:-1], "4", "--out", str(out), "--resume",
                    "--batch-size", "8", "--checkpoint-period", "20", "--peer-timeout", "30"]


@pytest.mark.parametrize("srun_status, restarts, max_requeues, requeued", [
    (138, None, None, True),   # SIGUSR1, the time limit's warning: the first run requeues itself
    (138, "2", None, True),    # ... up to MAX_REQUEUES (default 3) restarts in all
    (138, "3", None, False),
    (138, "1", "1", False),
    (143, None, None, False),  # SIGTERM: scontrol requeue / preemption (Slurm reruns it), scancel, the limit itself
    (1, None, None, False),    # a failure: never rerun
    (75, None, None, True),    # a rank lost a node (hvd_sched.keras.PEER_LOST_STATUS): requeued, capped the same
    (75, "3", None, False),
])
def test_the_slurm_script_requeues_itself_after_the_time_limit_warning_or_a_lost_node(tmp_path, srun_status, restarts,
                                                                                     max_requeues, requeued):
    env = {key: value for key, value in (("SLURM_RESTART_COUNT", restarts), ("MAX_REQUEUES", max_requeues))
           if value is not None}
    status, srun, scontrol, stderr = _run_slurm_script(tmp_path, srun_status, **env)
    assert status == srun_status and srun is not None  # Slurm records the step's status as the job's
    assert scontrol == (["requeue", "42"] if requeued else None), stderr
    why = "lost a node (status 75)" if srun_status == 75 else "stopped by SIGUSR1 (time limit near)"
    if requeued:
        assert f"job 42 {why}: requeueing it (restart {int(restarts or 0) + 1} of at most {max_requeues or 3})" \
            in stderr
    elif srun_status in (138, 75):
        assert f"not requeued: it has been restarted {restarts} times (MAX_REQUEUES={max_requeues or 3})" in stderr
    elif srun_status == 143:
        assert "stopped by SIGTERM: not requeued from here" in stderr


@pytest.mark.parametrize("srun_status", [137, 143, 1])
def test_the_slurm_script_requeues_when_a_rank_wrote_a_lost_node_whatever_srun_reports(tmp_path, srun_status):
    """srun reports a status of its own after a lost node (the SIGKILL of supervise, its tasks' 75 or a signal):
    the note decides. hvd_sched.supervise exits 75 and prints the note last, naming the lost rank and host."""
    note = "hvd_sched: rank 1 (host node2, pid 7) has not answered for 10.0 s"
    status, _, scontrol, stderr = _run_slurm_script(tmp_path, srun_status, note=note)
    assert status == 75 and scontrol == ["requeue", "42"], stderr
    assert "job 42 lost a node (status 75): requeueing it (restart 1 of at most 3)" in stderr
    assert stderr.rstrip().splitlines()[-2] == note, stderr  # then the script's own line: requeueing it


def test_the_slurm_script_refuses_a_max_requeues_that_is_not_a_count(tmp_path):
    status, srun, scontrol, stderr = _run_slurm_script(tmp_path, 138, MAX_REQUEUES="three")
    assert (status, srun, scontrol) == (2, None, None)
    assert "MAX_REQUEUES must be a whole number of requeues, got 'three'" in stderr
