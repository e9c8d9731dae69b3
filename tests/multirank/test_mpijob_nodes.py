"""The Kubernetes MPIJob across hosts: examples/kubernetes/mpijob.yaml's launcher command, as written, run from a
"launcher" host against two "worker" hosts of their own (tests/netns.py), with what mpi-operator v2 gives the
launcher container standing in for Kubernetes:

- its environment for Open MPI (launch.MPIJOB_OPERATOR_ENV, and OMPI_MCA_orte_default_hostfile naming the hostfile);
- the hostfile it mounts at /etc/mpi/hostfile (one `NAME slots=slotsPerWorker` line per worker);
- its ssh: the hosts' own sshd (the workers' command is `sshd -De`), reached with the fixture's key;
- the pod's stop: SIGTERM to the script (the container's PID 1);
- the Job's restart (restartPolicy OnFailure, backoffLimit): the same script run again;
- a dead worker's node replaced: the host restored (its processes gone, its sshd answering again).

One job goes through all of it, each run of the script as the Job would start it:
1. it runs one rank on each worker and none on the launcher (with the operator's environment alone, Open MPI 5
   started both ranks on the launcher: it reads no OMPI_MCA_orte_default_hostfile);
2. the pod's SIGTERM: the script's trap turns it into SIGUSR1 for mpirun (through hvd_sched.supervise), the ranks on
   the workers stop at one iteration, rank 0 saves it and the script exits 138;
3. the Job's restart resumes; then the second worker's node dies (its link down, every process of it killed): the
   rank left exits 75 within --peer-timeout, supervise ends mpirun (which waits for its lost daemon), and the
   script exits 75 with the lost rank and host as its last line; nothing of the job is left on any host;
4. the Job's next restart, while the worker is still gone: the script waits for the worker's sshd (a launcher that
   failed then would use up backoffLimit before Kubernetes replaced the pod), the worker comes back, and the job
   resumes and ends, bit for bit, on the run of the same script never stopped (weights, momentum slots, iteration).

Default row only (tests/rows.py: the launcher, the shell and Open MPI are the same on every row); bounded (600 s).
"""

import os
import re
import signal
import sys
import time

import pytest

from launch import (DEMO_FINAL, MPIJOB_OPERATOR_ENV, STOPPED, assert_same_final_checkpoint, latest_meta, mpi_env,
                    mpi_missing, mpijob, mpijob_launcher_script, processes_naming, rank_env, run_during,
                    when_checkpoint_reaches)
from netns import Hosts

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(600)]

# The manifest's demo: 8 epochs of 22 iterations on 2 ranks; a checkpoint every 20 iterations and at each epoch's end.
EPOCHS, STEPS = 8, 22
PEER_TIMEOUT = 10  # the demo's --peer-timeout (60 s by default): the test's only change to the command
STOP_AT, DIE_AT = 40, 100  # the newest checkpoint's iteration at the pod's SIGTERM, at the worker's death
LOST = re.compile(r"hvd_sched: rank (\d+) \(host (\S+), pid \d+\) has not answered for [0-9.]+ s")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    reason = Hosts.missing() or mpi_missing()
    if reason:
        pytest.skip(reason)
    with Hosts(tmp_path_factory.mktemp("hosts"), count=3) as made:
        yield made


def _hostfile(hosts, folder):
    """What mpi-operator mounts at /etc/mpi/hostfile: one line per worker replica, with slotsPerWorker slots."""
    _, spec = mpijob()
    workers, slots = spec["mpiReplicaSpecs"]["Worker"]["replicas"], spec["slotsPerWorker"]
    assert (workers, slots) == (2, 1)
    path = folder / "hostfile"
    path.write_text("".join(f"{name} slots={slots}\n" for name in hosts.names[1:1 + workers]))
    return path


def _launcher(hosts, out, hostfile, folder, during=None, timeout=300):
    """One run of the launcher container's command on the launcher host; (status, output, fault time, end)."""
    env = rank_env(folder, {**mpi_env(), **MPIJOB_OPERATOR_ENV, "OMPI_MCA_orte_default_hostfile": str(hostfile)})
    env["PATH"] = os.pathsep.join([str(hosts.ssh_bin), env["PATH"]])
    env.pop("HVD_SCHED_TEST_OUT", None)
    command = mpijob_launcher_script(out, hostfile, extra_args=["--peer-timeout", PEER_TIMEOUT])
    return run_during(hosts.prefix(hosts.names[0]) + command, env, folder, timeout, during)


def _ranks_by_host(hosts, out):
    """{host name: number of the job's rank processes in it} (a rank: `python .../train_keras.py ...`)."""
    found = {}
    for pid, command in processes_naming(out):
        words = command.split()
        if len(words) > 1 and words[0] == sys.executable and words[1].endswith("train_keras.py"):
            [name] = [name for name in hosts.names if hosts.holds(name, pid)] or ["this machine"]
            found[name] = found.get(name, 0) + 1
    return found


def test_the_mpijob_launcher_runs_on_its_workers_stops_and_survives_a_dead_worker_bit_for_bit(hosts, tmp_path):
    launcher, first, second = hosts.names
    hostfile = _hostfile(hosts, tmp_path)

    # The job never stopped: every rank on a worker, none on the launcher.
    reference = tmp_path / "reference"
    placed = {}

    def where(proc):
        when_checkpoint_reaches(reference, STOP_AT, lambda: placed.update(_ranks_by_host(hosts, reference)), proc)

    code, output, _, _ = _launcher(hosts, reference, hostfile, tmp_path / "reference-run", where)
    assert code == 0, output[-6000:]
    assert placed == {first: 1, second: 1}, (placed, output[-3000:])
    finals = {int(rank): (acc, int(it)) for rank, acc, it in DEMO_FINAL.findall(output)}
    assert sorted(finals) == [0, 1] and len(set(finals.values())) == 1 and finals[0][1] == EPOCHS * STEPS, output

    # The pod's SIGTERM: every rank stops at one iteration, rank 0 saves it, the container exits 138.
    out = tmp_path / "out"
    code, output, _, _ = _launcher(hosts, out, hostfile, tmp_path / "stopped", lambda proc: when_checkpoint_reaches(
        out, STOP_AT, lambda: os.kill(proc.pid, signal.SIGTERM), proc))
    [(name, iteration, _, _, _, _, status)] = STOPPED.findall(output)
    assert code == int(status) == 128 + signal.SIGUSR1 and name == "SIGUSR1", (code, output[-6000:])
    stopped = latest_meta(out)
    assert (stopped["iteration"], stopped["signal"]) == (int(iteration), "SIGUSR1") and int(iteration) >= STOP_AT

    # The Job's restart resumes there; then the second worker's node dies.
    code, output, died, ended = _launcher(hosts, out, hostfile, tmp_path / "restarted", lambda proc: (
        when_checkpoint_reaches(out, DIE_AT, lambda: hosts.kill(second), proc)))
    assert died is not None, output[-6000:]
    assert f"rank 0: resumed from {out}/ckpt/" in output and f"(iteration {iteration})" in output, output[-6000:]
    assert code == 75, (code, output[-6000:])
    last = output.rstrip().splitlines()[-1]
    assert {(int(rank), host) for rank, host in LOST.findall(last)} == {(1, second)}, (last, output[-6000:])
    assert not processes_naming(out), processes_naming(out)
    seconds_to_end = ended - died
    assert seconds_to_end < PEER_TIMEOUT + 10 + 2 + 10 + 60, output[-6000:]  # supervise's grace, SIGTERMs, SIGKILL

    # The Job's next restart, the worker still gone: the launcher waits for it, then resumes and ends.
    lost_at = latest_meta(out)["iteration"]

    def replaced(proc):
        log = tmp_path / "replaced" / "output.txt"
        deadline = time.monotonic() + 60
        while f"launcher: waiting for worker {second} (ssh)" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-6000:]
            time.sleep(0.2)
        time.sleep(6)  # at least one more round of the wait: the launcher does not give up, nor start mpirun
        assert proc.poll() is None and "hvd_sched.supervise" not in log.read_text(), log.read_text()[-6000:]
        hosts.restore(second)

    code, output, _, _ = _launcher(hosts, out, hostfile, tmp_path / "replaced", replaced)
    assert code == 0, output[-6000:]
    assert f"rank 0: resumed from {out}/ckpt/" in output and f"(iteration {lost_at})" in output, output[-6000:]
    assert_same_final_checkpoint(out, reference, EPOCHS, STEPS)
    print(f"test_mpijob_nodes: stopped at {iteration}, worker lost at checkpoint {lost_at}, launcher ended "
          f"{seconds_to_end:.1f} s after the worker's death")
