"""Several nodes for real: the demo across hosts of their own (tests/netns.py: network namespaces with their own
host names, addresses and sshd), under `horovodrun --gloo -H`, `horovodrun --mpi -H` and `mpirun -H`, and a node
that dies, freezes or is cut off, or a rank that raises, in the middle of training.

The demo runs 4 ranks, 2 per host; the fault and slow-rank tests run 2 ranks, one per host (half the processes on
this machine's 2 cores; the heartbeat and the launchers' paths are the same at 2 and 4 ranks).

What each fault test asserts, on what the job reports (the newest checkpoint's iteration, not a sleep), with the
launcher run under hvd_sched.supervise as the docs tell users to:
- the launcher and every surviving rank end within the bound (TrainingCheckpoint's peer_timeout, 10 s here, plus
  supervise's grace and SIGTERMs and the launcher's own teardown; the run is failed as hung past that), and no
  process of the job is left on any host;
- a survivor prints which rank and host stopped answering, its iteration and the newest checkpoint, and exits
  75 (hvd_sched.keras.PEER_LOST_STATUS); horovodrun exits 1 by itself, mpirun waits for its lost daemon until
  supervise's third SIGTERM; the job (supervise) exits 75 and its last line names the lost rank and host;
- a host whose processes are all killed while its kernel lives ("crashed") is seen by the launchers at once:
  mpirun names the host and exits 0 or 255, and supervise turns that into 75; horovodrun exits 1 naming rank 1;
- the host comes back (a reboot: its processes gone, its link up, its sshd answering), the same command with
  --resume runs to the end, and its final checkpoint is, bit for bit, the one of the same job never stopped.

The healthy ones: a rank that validates 35 s longer than the others, a checkpoint save of 35 s, a first step slowed
by 35 s, all longer than the 10 s bound and Gloo's own 30 s timeout, run to the end on the reference's weights.

The default run takes the combinations whose paths differ (CI's time): under Gloo a frozen host, a cut-off host and
a raising rank; under mpirun a frozen, a dead and a crashed host; a slow validation (Gloo) and a slow save (mpirun),
also under supervise. A dead host is, to the survivors, a cut-off one whose processes are gone (no datagram and no
TCP reset comes from either).
HVD_SCHED_TEST_NODES=all runs every fault under both launchers and the slow first step too (all passed on this
machine when they were written).
The time from each fault to the job's end goes to PYTEST's tmp folder as nodes_timings.json (the figures of
docs/how-to/preemption.md's table).

Run on the default row only (tests/rows.py: a multi-rank test's outcome depends on the launcher and the Horovod
build, not on the row): the launchers, the shell tools and the heartbeat are the same on every row (the heartbeat is
Python with no TensorFlow in it); tests/multirank/test_preemption.py checks the resume on the Keras 3 path too.
Every test is bounded (600 s: a reference run, the faulted run and the resumed one); the hosts are removed by the
fixture's teardown, or by tests/guard.py where none runs.
"""

import json
import os
import pathlib
import re
import sys
import time

import pytest

from launch import (DEMO_FINAL, assert_same_final_checkpoint, latest_meta, mpi_env, mpi_missing, processes_naming,
                    rank_env, run_during, when_checkpoint_reaches)
from netns import Hosts

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(600)]

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "train_keras.py"
FAULT_JOB = pathlib.Path(__file__).with_name("fault_job.py")
CONFIG = ROOT / "examples" / "configs" / "digits_warmup_steps.yaml"
# 44 iterations per epoch at batch 8 on 4 ranks: 88 in all (2 epochs: the last bits of 88 updates of every
# weight and slot are compared); the fault tests' 2 ranks fault once the newest checkpoint is at 60 or later.
EPOCHS, STEPS, BATCH, PERIOD, FAULT_AT = 2, 44, 8, 20, 60
# The fault tests' 2 ranks (one per host): 89 iterations per epoch at batch 8, 178 in all.
EPOCHS_2, STEPS_2 = 2, 89
ALL = os.environ.get("HVD_SCHED_TEST_NODES") == "all"
PEER_TIMEOUT, TEARDOWN = 10, 90
# hvd_sched.supervise's defaults: 10 s of grace after peer_lost.txt, three SIGTERMs a second apart, SIGKILL 10 s on.
SUPERVISE = 10 + 2 + 10
LOST = re.compile(r"hvd_sched: rank (\d+) \(host (\S+), pid \d+\) (has not answered for [0-9.]+ s|failed)")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    reason = Hosts.missing()
    if reason:
        pytest.skip(reason)
    with Hosts(tmp_path_factory.mktemp("hosts"), count=2) as made:
        yield made


@pytest.fixture(scope="module")
def timings(tmp_path_factory):
    found = {}
    yield found
    path = pathlib.Path(tmp_path_factory.getbasetemp()) / "nodes_timings.json"
    path.write_text(json.dumps(found, indent=1))


def _pass_env(names):
    return [item for name in names for item in ("-x", name)]


_RANK_VARS = ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS",
              "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "HOROVOD_FUSION_THRESHOLD", "HVD_SCHED_TEST_FAULT",
              "HVD_SCHED_TEST_FAULT_RANK",
              "HVD_SCHED_TEST_FAULT_AT", "HVD_SCHED_TEST_FAULT_SECONDS")


def _command(hosts, launcher, script, out, slots, resume=False):
    """The user's command for the ranks of `slots` ([(host name, ranks on it), ...], filled in that order)."""
    np_ = str(sum(count for _, count in slots))
    listed = ",".join(f"{hosts.address(name)}:{count}" for name, count in slots)
    epochs = EPOCHS if int(np_) == 4 else EPOCHS_2
    args = [sys.executable, str(script), "--config", str(CONFIG), "--epochs", str(epochs), "--batch-size",
            str(BATCH), "--checkpoint-period", str(PERIOD), "--peer-timeout", str(PEER_TIMEOUT), "--out", str(out)]
    if resume:
        args.append("--resume")
    bindir = pathlib.Path(sys.executable).parent
    # --network-interface: with one host in -H that is not this machine, horovodrun's interface check finds `lo`
    # common as well ({"eth0", "lo"}) and takes the rendezvous address from the first of that set, whose order
    # changes with each process's hash seed: half the launches gave the ranks 127.0.0.1, their own loopback, and
    # every rank failed in hvd.init() ("HTTP GET request failed too many times"; horovod/runner/util/network.py,
    # get_driver_ip). Naming the hosts' interface is what a cluster with several networks needs anyway.
    nic = ["--network-interface", hosts.interface]
    if launcher == "gloo":
        return [str(bindir / "horovodrun"), "--gloo", "-np", np_, "-H", listed, "-p", "22",
                "--ssh-identity-file", str(hosts.ssh_key), *nic, *args]
    tcp = ["--mca", "btl_tcp_if_include", hosts.cidr, "--mca", "oob_tcp_if_include", hosts.cidr,
           "--prtemca", "oob_tcp_if_include", hosts.cidr]
    if launcher == "horovodrun-mpi":
        return [str(bindir / "horovodrun"), "--mpi", "-np", np_, "-H", listed, "-p", "22",
                "--ssh-identity-file", str(hosts.ssh_key), *nic, "--mpi-args",
                f"--prtemca oob_tcp_if_include {hosts.cidr}",  # it sets btl_tcp_if_include and --bind-to itself
                *args]
    # Two ranks per host on this machine's 2 cores: Open MPI binds each host's ranks to "its" cores 0 and 1, four
    # busy-polling ranks on two cores, and MPI_Init never completes; a real node has cores of its own.
    return [str(bindir / "mpirun"), "-np", np_, "-H", listed, "--bind-to", "none", *tcp,
            *_pass_env(_RANK_VARS), *args]


# Four ranks' sums in one order every run: Horovod fuses the gradients that are ready in one cycle into one buffer,
# and a ring allreduce of more than 2 ranks adds each element in an order set by its offset in that buffer, so a
# fusion that depends on timing changes the last bits from run to run (2 ranks add a + b either way). Without
# fusion each gradient is reduced alone, in the same order in every run (docs/how-to/preemption.md).
EXACT = {"HOROVOD_FUSION_THRESHOLD": "0"}


def _env(hosts, fault=None):
    extra = {**mpi_env(), **EXACT, **(fault or {})}
    env = rank_env(hosts.folder, extra)
    env["PATH"] = os.pathsep.join([str(hosts.ssh_bin), env["PATH"]])
    env.pop("HVD_SCHED_TEST_OUT", None)
    for name in ("HVD_SCHED_TEST_FAULT", "HVD_SCHED_TEST_FAULT_RANK", "HVD_SCHED_TEST_FAULT_AT",
                 "HVD_SCHED_TEST_FAULT_SECONDS"):
        env.setdefault(name, "")
    return env


def _finals(output):
    return {int(rank): (float(acc), int(it)) for rank, acc, it in DEMO_FINAL.findall(output)}


_references = {}


def _reference(hosts, launcher, tmp_path_factory, slots):
    """The job never stopped, under `launcher` on `slots` (its OUT folder): made once per module."""
    key = (launcher, tuple(slots))
    if key not in _references:
        ranks = sum(count for _, count in slots)
        work = tmp_path_factory.mktemp(f"reference-{launcher}-{len(slots)}x{ranks}")
        code, output, _, _ = run_during(_command(hosts, launcher, FAULT_JOB, work / "out", slots), _env(hosts), work,
                                        400)
        assert code == 0, output[-6000:]
        finals = _finals(output)
        assert sorted(finals) == list(range(ranks)) and len(set(finals.values())) == 1, (finals, output[-6000:])
        # Where each rank ran (fault_job prints its host name): the slots, in order.
        where = {int(rank): host for rank, host in re.findall(r"fault_job: rank (\d+) of \d+ on host (\S+)", output)}
        assert where == {rank: name for rank, name in enumerate(n for n, count in slots for _ in range(count))}, \
            (where, output[-6000:])
        _references[key] = work / "out"
    return _references[key]


@pytest.mark.parametrize("launcher", ["gloo", "mpirun", "horovodrun-mpi"])
def test_demo_across_two_hosts_ends_bit_for_bit_as_on_one_host(hosts, launcher, tmp_path_factory):
    """4 ranks, 2 on each host, end with the same weights, momentum slots and iteration on every rank (the final
    accuracy printed by each), and bit for bit equal to the same launcher's 4 ranks on one host. EXACT (no fusion)
    makes each gradient's sum one order in every run; the same launcher sums in the same order whether its peers
    are on this host or the other: Gloo's ring by rank, Open MPI's allreduce by the communicator's size and the
    message's (its tuned component, not the hosts' layout)."""
    if launcher != "gloo" and mpi_missing():
        pytest.skip(mpi_missing())
    first, second = hosts.names
    across = _reference(hosts, launcher, tmp_path_factory, [(first, 2), (second, 2)])
    # horovodrun --mpi is mpirun underneath (the same Open MPI allreduce): mpirun's run on one host is its
    # reference too, one 4-rank MPI run fewer (about 40 s on this machine's 2 cores).
    alone = _reference(hosts, "mpirun" if launcher == "horovodrun-mpi" else launcher, tmp_path_factory, [(first, 4)])
    assert_same_final_checkpoint(across, alone, EPOCHS, STEPS)


def _hostname_of_ranks(hosts, per_host):
    """Rank r is on host r // per_host (the slots are filled in order by every launcher here)."""
    return {rank: hosts.names[rank // per_host] for rank in range(2 * per_host)}


def PAIR(hosts):
    """The fault tests' layout: one rank on each host."""
    return [(hosts.names[0], 1), (hosts.names[1], 1)]


FAULTS = {"frozen": "freeze", "dead": "kill", "cut": "cut", "crashed": "crash"}


DEFAULT_FAULTS = [("gloo", "frozen"), ("gloo", "cut"), ("gloo", "raise"), ("mpirun", "frozen"), ("mpirun", "dead"),
                  ("mpirun", "crashed")]
EVERY_FAULT = [(launcher, fault) for launcher in ("gloo", "mpirun")
               for fault in ("frozen", "dead", "cut", "crashed", "raise")]


@pytest.mark.parametrize("launcher,fault", EVERY_FAULT if ALL else DEFAULT_FAULTS)
def test_a_node_that_stops_answering_ends_the_job_loudly_and_resume_is_exact(hosts, launcher, fault, tmp_path,
                                                                            tmp_path_factory, timings):
    if launcher != "gloo" and mpi_missing():
        pytest.skip(mpi_missing())
    reference = _reference(hosts, launcher, tmp_path_factory, [(hosts.names[0], 1), (hosts.names[1], 1)])
    out = tmp_path / "out"
    victim = hosts.names[1]
    if fault == "raise":
        env = _env(hosts, {"HVD_SCHED_TEST_FAULT": "raise", "HVD_SCHED_TEST_FAULT_RANK": "1",
                           "HVD_SCHED_TEST_FAULT_AT": str(FAULT_AT)})
        cmd = _command(hosts, launcher, FAULT_JOB, out, PAIR(hosts))

        def during(proc):
            while "fault_job: rank 1 at iteration" not in (tmp_path / "first" / "output.txt").read_text():
                if proc.poll() is not None:
                    return None
                time.sleep(0.05)
            return time.monotonic()
    else:
        env, cmd = _env(hosts), _command(hosts, launcher, DEMO, out, PAIR(hosts))

        def during(proc):
            return when_checkpoint_reaches(out, FAULT_AT, lambda: getattr(hosts, FAULTS[fault])(victim), proc)
    try:
        code, output, faulted, ended = run_during(_supervised(cmd, out), env, tmp_path / "first",
                                                  PEER_TIMEOUT + SUPERVISE + TEARDOWN, during)
    finally:
        hosts.restore(victim)
    left = processes_naming(out)
    if left and (launcher, fault) == ("gloo", "crashed"):
        # horovodrun exited at once on rank 1's end; rank 0, on the other host, is not its child: horovodrun ends
        # it in some runs, and in others rank 0 outlives it and ends itself on its heartbeat's verdict (75 and
        # peer_lost.txt) within PEER_TIMEOUT, unheard (its output went through horovodrun).
        deadline = time.monotonic() + PEER_TIMEOUT + 15
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = processes_naming(out)
        note = out / "ckpt" / "peer_lost.txt"
        assert not note.exists() or LOST.search(note.read_text()).group(2) == victim, note.read_text()
    assert not left, f"still running after the job ended: {left}\n{output[-6000:]}"
    assert faulted is not None, output[-6000:]
    assert code != 0, output[-6000:]
    where = _hostname_of_ranks(hosts, 1)
    named = {(int(rank), host) for rank, host, _ in LOST.findall(output)}
    if fault == "raise":
        # The rank's own traceback names it; the launcher ends the job on its exit status 1, and a survivor that
        # heard its FAILED datagram first names it too and exits 1, not 75, writing no note: a job script must not
        # requeue a failure as a lost node.
        assert "fails on purpose at iteration" in output, output[-6000:]
        assert named <= {(1, where[1])}, (named, output[-6000:])
        assert "Exiting with status 75" not in output, output[-6000:]
        assert not (out / "ckpt" / "peer_lost.txt").exists(), output[-6000:]
        assert code == 1 and _launcher_status(output) == 1, (code, output[-6000:])
    elif fault == "crashed" and launcher == "gloo":
        # Every process of the host killed, its kernel alive: horovodrun sees rank 1's ssh end (status 255) at
        # once, ends rank 0 and exits 1 naming rank 1 ("Process name: 1 / Exit code: 255"), before rank 0's
        # heartbeat could: status 1, no note (a script requeueing on 75 does not requeue it; a Job's restart does).
        assert code == 1 and _launcher_status(output) == 1, (code, output[-6000:])
        assert re.search(r"Process name: 1\s+Exit code: 255", output), output[-6000:]
    elif fault == "crashed":
        # The same under mpirun: the kernel resets prted's connection and prterun ends the job itself at once,
        # killing the surviving rank before its heartbeat's verdict, and names the host, not the rank ("PRTE has
        # lost communication with a remote daemon ... on node NAME", or "A daemon failed to report back ... Remote
        # host: NAME"), exiting 0 or 255 (both seen). supervise reads that report and exits 75: a job that did not
        # finish is never a success. (With prterun on the first host, as in ../shared/STACK_NOTES.md, it exited 0
        # and left its own rank running: supervise waits for such orphans, tests/unit/test_supervise.py.)
        assert re.search(rf"(on node|Remote host:) +{re.escape(victim)}\b", output), output[-6000:]
        assert code == 75 and f"lost its daemon on {victim}" in output, (code, output[-6000:])
    else:
        assert named, f"no survivor named the rank that stopped answering:\n{output[-6000:]}"
        assert named <= {(r, h) for r, h in where.items() if h == victim}, (named, output[-6000:])
        assert re.search(r"newest checkpoint: \S+ \(iteration (\d+)\)", output), output[-6000:]
        note = out / "ckpt" / "peer_lost.txt"  # what a job script reads (examples/slurm/train.sbatch)
        assert note.is_file() and LOST.search(note.read_text()), output[-6000:]
        # The job ends with 75 whatever the launcher did, and its last line names the lost rank and its host
        # (hvd_sched.supervise prints the note last), not the survivor that the launcher names.
        assert code == 75, (code, output[-6000:])
        last = output.rstrip().splitlines()[-1]
        assert {(int(r), h) for r, h, _ in LOST.findall(last)} == named, (last, output[-6000:])
        if launcher == "mpirun":
            # Open MPI's prterun reports the rank's 75, then waits for its daemon on the lost host, which never
            # answers (measured: still running 100 s after the ranks left, Open MPI 5.0.11); supervise's three
            # SIGTERMs end it (prte.c: the third exits).
            assert "Exit code:    75" in output and "sending it SIGTERM three times" in output, output[-6000:]
        else:
            # horovodrun ends by itself once its ranks have exited (75), with a status of its own.
            assert "exit with status code 75" in output and _launcher_status(output) == 1, output[-6000:]
    newest = latest_meta(out)
    timings[f"{launcher}/{fault}"] = {"seconds_to_end": round(ended - faulted, 1), "status": code,
                                      "launcher_status": _launcher_status(output),
                                      "checkpoint_iteration": newest["iteration"], "fault_after": FAULT_AT}
    # Requeued: the same command with --resume ends on the run never stopped, bit for bit.
    code, output, _, _ = run_during(_command(hosts, launcher, DEMO, out, PAIR(hosts), resume=True), _env(hosts),
                                    tmp_path / "resumed", 400)
    assert code == 0, output[-6000:]
    assert f"resumed from {out}/ckpt/" in output
    assert_same_final_checkpoint(out, reference, EPOCHS_2, STEPS_2)


def _supervised(cmd, out):
    """The launcher under hvd_sched.supervise, as docs/how-to/launching.md tells users to run it."""
    return [sys.executable, "-m", "hvd_sched.supervise", "--checkpoint-dir", str(out / "ckpt"), "--", *cmd]


def _launcher_status(output):
    found = re.findall(r"hvd_sched\.supervise: \S+ exited with status (\d+)", output)
    return int(found[-1]) if found else None


SLOW = [("validation", 1, "gloo"), ("save", 0, "mpirun")] + ([("first_step", 1, "gloo")] if ALL else [])


@pytest.mark.parametrize("kind,rank,launcher", SLOW)
def test_a_slow_rank_that_is_alive_is_never_stopped(hosts, kind, rank, launcher, tmp_path, tmp_path_factory):
    if launcher != "gloo" and mpi_missing():
        pytest.skip(mpi_missing())
    reference = _reference(hosts, launcher, tmp_path_factory, [(hosts.names[0], 1), (hosts.names[1], 1)])
    out = tmp_path / "out"
    env = _env(hosts, {"HVD_SCHED_TEST_FAULT": kind, "HVD_SCHED_TEST_FAULT_RANK": str(rank),
                       "HVD_SCHED_TEST_FAULT_AT": str(FAULT_AT), "HVD_SCHED_TEST_FAULT_SECONDS": "35"})
    # Under hvd_sched.supervise as users run it: it never acts on a job that is only slow.
    code, output, _, _ = run_during(_supervised(_command(hosts, launcher, FAULT_JOB, out, PAIR(hosts)), out), env,
                                    tmp_path, 500)
    assert code == 0, output[-6000:]
    assert "fault_job: rank" in output, output[-4000:]
    assert not LOST.findall(output), output[-6000:]
    assert_same_final_checkpoint(out, reference, EPOCHS_2, STEPS_2)
