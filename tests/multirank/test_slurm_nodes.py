"""examples/slurm/train.sbatch on a Slurm of several nodes for real: one slurmctld and one slurmd per host of its
own (tests/netns.py's network namespaces, each with its own host name and address; tests/slurmutil.py), the job's
ranks started by `srun --mpi=pmix` on two of them, Open MPI between them over TCP.

- `sbatch -N 2 --ntasks-per-node=2` (4 ranks, 2 per node) ends, on every rank, bit for bit on the weights,
  momentum slots and iteration of `sbatch -N 1 --ntasks-per-node=4` (the same 4 ranks on one node).
- The same job with its second node frozen (every process of it SIGSTOPped, slurmd too), dead (its link down, then
  every process SIGKILLed) or cut off (its link down) mid-run, once the newest checkpoint is at iteration 60 or
  later: the ranks left exit 75 after PEER_TIMEOUT naming a lost rank (2 or 3) and that node, hvd_sched.supervise
  ends srun and exits 75 with that note as its last words, the script requeues the job (`lost a node (status 75):
  requeueing it`), and Slurm starts it again by itself on the nodes that answer, where `--resume` ends bit for bit
  on the run never stopped. Nothing of the job is left on the nodes that answer. The times (from the fault to the
  job's requeue, to the node's DOWN, to the restart) go to PYTEST's tmp folder as slurm_nodes_timings.json: the
  figures of docs/how-to/preemption.md.

The cluster has three nodes: a job of two goes on on two when one is lost, as on a cluster with spare nodes.
Slurm's timeouts are short (tests/slurmutil.py: SlurmdTimeout NODE_TIMEOUT, cred_expire CRED_EXPIRE); the requeued
job waits for Slurm to set the lost node DOWN (it holds the job's old allocation until then). The lost node comes
back after each test (a reboot: its processes gone, its link up, its slurmd registered again).

The default run takes the frozen node (CI's time: the one that no TCP connection notices; to Slurm and to the ranks
left, a dead node and a cut link are the same silence); HVD_SCHED_TEST_NODES=all adds those two. Run on the default
row only (tests/rows.py: Slurm, the script and the launcher are the same on every row); bounded (600 s each).
"""
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from launch import assert_same_final_checkpoint, latest_meta, mpi_env, mpi_missing, processes_naming, rank_env
from netns import Hosts
from slurmutil import ENDED, NODE_TIMEOUT, SlurmCluster

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(600)]

ROOT = pathlib.Path(__file__).resolve().parents[2]
SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"
CONFIG = ROOT / "examples" / "configs" / "digits_warmup_steps.yaml"
ALL = os.environ.get("HVD_SCHED_TEST_NODES") == "all"
# 4 ranks at batch 8: 44 iterations per epoch, 88 in all; the fault comes once the newest checkpoint (every 20
# iterations) is at 60 or later, in the second epoch.
EPOCHS, STEPS, BATCH, PERIOD, FAULT_AT, PEER_TIMEOUT = 2, 44, 8, 20, 60, 10
KNOBS = {"EPOCHS": str(EPOCHS), "BATCH_SIZE": str(BATCH), "CHECKPOINT_PERIOD": str(PERIOD),
         "PEER_TIMEOUT": str(PEER_TIMEOUT)}
LOST = re.compile(r"hvd_sched: rank (\d+) \(host (\S+), pid \d+\) has not answered for [0-9.]+ s")
FAULTS = {"frozen": "freeze", "dead": "kill", "cut": "cut"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = Hosts.missing() or SlurmCluster.missing() or mpi_missing()
    if reason:
        pytest.skip(reason)
    with Hosts(tmp_path_factory.mktemp("hosts"), count=3) as hosts:
        # 4 CPUs per node as Slurm is told (config_overrides): the one-node reference runs 4 tasks on one node.
        with SlurmCluster(tmp_path_factory.mktemp("slurm"), cpus=4, hosts=hosts) as made:
            reason = made.pmix_missing()
            if reason:
                pytest.skip(reason)
            yield made


@pytest.fixture(scope="module")
def timings(tmp_path_factory):
    found = {}
    yield found
    (pathlib.Path(tmp_path_factory.getbasetemp()) / "slurm_nodes_timings.json").write_text(json.dumps(found, indent=1))


def _env(cluster, extra=None):
    hosts = cluster.hosts
    env = rank_env(ROOT, {**mpi_env(), **cluster.env,
                          # Open MPI between the nodes over their link alone (../shared/STACK_NOTES.md); 4 ranks'
                          # sums in one order every run (docs/how-to/launching.md, "Several hosts")
                          "OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": hosts.cidr,
                          "OMPI_MCA_oob_tcp_if_include": hosts.cidr, "HOROVOD_FUSION_THRESHOLD": "0",
                          **(extra or {})})
    env.pop("HVD_SCHED_TEST_OUT", None)
    return env


def _scontrol(cluster, *args):
    return subprocess.run(["scontrol", *args], env=_env(cluster), capture_output=True, text=True, timeout=30)


def _submit(cluster, folder, *options):
    out, log = folder / "out", folder / "slurm.out"
    folder.mkdir(parents=True, exist_ok=True)
    env = _env(cluster, {"PYTHON": sys.executable, "OUT": str(out), **KNOBS})
    proc = subprocess.run(["sbatch", "--parsable", "--chdir", str(ROOT), "-o", str(log), *options, str(SBATCH)],
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0], out, log


def _follow(cluster, job, log, act=None, timeout=420):
    """Poll `job` until it ends; `act(info)` at each poll. Returns its last `scontrol show job`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = cluster.job(job)
        if info["JobState"] in ENDED:
            return info
        if act is not None:
            act(info)
        time.sleep(0.2)
    pytest.fail(f"job {job} did not end within {timeout} s: {cluster.job(job)}\n"
                f"{log.read_text()[-6000:] if log.exists() else ''}\n{_logs(cluster)}")


def _logs(cluster):
    return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted((cluster.folder / "log").glob("*")))


def _nodes(cluster, nodelist):
    proc = _scontrol(cluster, "show", "hostnames", nodelist)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def _run_to_end(cluster, folder, *options):
    job, out, log = _submit(cluster, folder, *options)
    info = _follow(cluster, job, log)
    text = log.read_text()
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "0"), \
        f"{info}\n{text[-6000:]}\n{_logs(cluster)}"
    return out, text, _nodes(cluster, info["NodeList"])


_references = {}


def _reference(cluster, tmp_path_factory, *options):
    """The job never stopped with sbatch `options`: its OUT folder, made once per module."""
    if options not in _references:
        out, _, _ = _run_to_end(cluster, tmp_path_factory.mktemp("reference"), *options)
        _references[options] = out
    return _references[options]


ACROSS = ("-N", "2", "--ntasks-per-node=2")  # the command the docs give: 4 ranks, 2 on each of two nodes


def test_sbatch_on_two_nodes_ends_bit_for_bit_as_on_one_node(cluster, tmp_path_factory):
    """The docs' command, `sbatch -N 2 --ntasks-per-node=2`, and the same 4 ranks on one node: srun --mpi=pmix joins
    the 4 tasks into one Open MPI job either way, and without fusion each gradient is summed in one order (Open
    MPI's tuned allreduce picks its algorithm by the communicator's size and the message's, not by where the ranks
    are)."""
    across = _reference(cluster, tmp_path_factory, *ACROSS)
    text = (across.parent / "slurm.out").read_text()
    assert re.search(r"\(restart 0\): 4 tasks on (\S+),", text) and len(_nodes(cluster, re.search(
        r"\(restart 0\): 4 tasks on (\S+),", text)[1])) == 2, text[-3000:]
    # every rank's final line, the same on all 4 (the demo prints each rank's accuracy and iteration)
    finals = set(re.findall(r"rank \d+: final val accuracy ([0-9.]+) \(360 samples, iteration (\d+)\)", text))
    assert len(re.findall(r"rank \d+: final val accuracy", text)) == 4 and len(finals) == 1, text[-3000:]
    alone = _reference(cluster, tmp_path_factory, "-N", "1", "--ntasks-per-node=4")
    assert len(_nodes(cluster, re.search(r"\(restart 0\): 4 tasks on (\S+),",
                                         (alone.parent / "slurm.out").read_text())[1])) == 1
    assert_same_final_checkpoint(across, alone, EPOCHS, STEPS)


@pytest.mark.parametrize("fault", ["frozen", "dead", "cut"] if ALL else ["frozen"])
def test_a_lost_node_requeues_the_job_which_resumes_on_the_nodes_left_bit_for_bit(cluster, fault, tmp_path,
                                                                                 tmp_path_factory, timings):
    hosts = cluster.hosts
    reference = _reference(cluster, tmp_path_factory, *ACROSS)
    job, out, log = _submit(cluster, tmp_path, *ACROSS)
    seen = {}

    def act(info):
        now = time.monotonic()
        if "fault" not in seen:
            meta = latest_meta(out)
            if info["JobState"] == "RUNNING" and info["Restarts"] == "0" and meta is not None \
                    and meta["iteration"] >= FAULT_AT:
                nodes = _nodes(cluster, info["NodeList"])
                # ranks 2 and 3 are on the node that is not the batch host (srun's block distribution)
                [victim] = [node for node in nodes if node != info["BatchHost"]]
                seen.update(victim=victim, iteration=meta["iteration"], nodes=nodes, waits=set())
                getattr(hosts, FAULTS[fault])(victim)
                seen["fault"] = time.monotonic()
            return
        if "requeued" not in seen and (info["Restarts"] != "0" or info["JobState"] != "RUNNING"):
            seen["requeued"] = now
        if "down" not in seen and "down" in cluster.node_states().get(seen["victim"], ""):
            seen["down"] = now
        if "requeued" in seen and "restarted" not in seen:
            if info["JobState"] == "RUNNING":
                seen["restarted"] = now
                seen["restart_nodes"] = _nodes(cluster, info["NodeList"])
            else:
                seen["waits"].add(f"{info['JobState']}/{info.get('Reason')}")

    try:
        info = _follow(cluster, job, log, act)
        # Nothing of the job is left on the nodes that answer (the lost one keeps what it had until it reboots).
        left = [entry for entry in processes_naming(out) if "victim" not in seen
                or not hosts.holds(seen["victim"], entry[0])]
    finally:
        if "victim" in seen:
            hosts.restore(seen["victim"])
            cluster.restart_node(seen["victim"])
    text = log.read_text()  # both runs: --open-mode=append
    assert "fault" in seen, f"the job ended before iteration {FAULT_AT}:\n{text[-6000:]}"
    victim = seen["victim"]
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), \
        f"{info}\n{text[-6000:]}\n{_logs(cluster)}"
    # The ranks left named ranks of the lost node (2 and 3, or the first of them past PEER_TIMEOUT), and that node;
    # supervise printed the note last, and the script requeued the job.
    first_run = text.split(f"hvd_sched: job {job} (restart 1)")[0]
    named = {(int(rank), host) for rank, host in LOST.findall(first_run)}
    assert named and named <= {(2, victim), (3, victim)}, (named, first_run[-6000:])
    assert "hvd_sched.supervise: a node was lost (exit status 75" in first_run, first_run[-6000:]
    assert f"hvd_sched: job {job} lost a node (status 75): requeueing it (restart 1 of at most 3)" in first_run, \
        first_run[-6000:]
    # Slurm may add its own line last ("slurmstepd-NODE: error: *** JOB N ON NODE CANCELLED AT ... DUE TO JOB
    # REQUEUE ***"): the requeue cancels the batch step while the script is still ending (seen once in a rehearsal).
    lines = [line for line in first_run.rstrip().splitlines() if not line.startswith("slurmstepd")]
    assert LOST.search(lines[-2]) or LOST.search(lines[-1]), lines[-6:]
    # Slurm started it again on nodes that answer, and it ran to the end on the weights of the run never stopped.
    assert victim not in seen["restart_nodes"], seen
    assert re.search(rf"rank 0: resumed from {re.escape(str(out))}/ckpt/\S+ .*\(iteration (\d+)\)", text), text[-3000:]
    assert not left, left
    assert_same_final_checkpoint(out, reference, EPOCHS, STEPS)
    timings[fault] = {"checkpoint_iteration_at_fault": seen["iteration"],
                      "seconds_to_requeue": round(seen["requeued"] - seen["fault"], 1),
                      "seconds_to_restart": round(seen["restarted"] - seen["fault"], 1),
                      "seconds_to_node_down": round(seen["down"] - seen["fault"], 1) if "down" in seen else None,
                      "pending_as": sorted(seen["waits"]),
                      "node_timeout": NODE_TIMEOUT, "peer_timeout": PEER_TIMEOUT}
