"""A Slurm cluster for tests, started in a temporary folder and stopped at the end: one node on this machine, or one
node per host of tests/netns.py's hosts of their own (`SlurmCluster(folder, hosts=hosts)`).

Debian's `slurm-wlm` daemons (slurmctld, slurmd) and `munge` (its authentication), run as the current user, in
the foreground, with everything in the folder: munge's key and socket, slurm.conf with its own ports on
127.0.0.1, the state, spool, logs and pid files. No system file is read or written; the node is named
`hvdsched` (slurmd -N), so nothing depends on the machine's host name except SlurmctldHost, which slurmctld
requires to be its own short host name. Clients find the cluster through SLURM_CONF (`SlurmCluster.env`).

With `hosts`, each host runs a slurmd of its own inside its namespace (`slurmd -N NAME`, its host name, its
address as NodeAddr); slurmctld and munged stay in this machine's namespace, as on a cluster's head node, and
slurmctld listens on the hosts' bridge address. munge's socket is a file, which every namespace reaches (the file
system is shared). A node lost by a fault (netns.Hosts.freeze/kill/cut) comes back with `hosts.restore(name)`
and then `cluster.restart_node(name)` (a rebooted node's slurmd registers again: ReturnToService=2).
Timeouts are short for tests (SlurmdTimeout=NODE_TIMEOUT, MessageTimeout=5, cred_expire=CRED_EXPIRE); measured
here (../shared/STACK_NOTES.md): a frozen slurmd is NOT_RESPONDING after about 6 s and DOWN after about
SlurmdTimeout; a requeued job may start again cred_expire + 1 s after the requeue.

.ci/run installs the packages where missing (slurmd slurmctld slurm-client munge libpmix-dev: the last is what
Slurm's mpi/pmix plugin loads, `libpmix.so`); `SlurmCluster.missing()` gives the reason to skip where they are not.
"""

import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import time

import launch

__all__ = ["SlurmCluster", "NODE", "NODE_TIMEOUT", "CRED_EXPIRE", "ENDED"]

NODE = "hvdsched"
NODE_TIMEOUT = 40
"""SlurmdTimeout of a cluster on hosts: seconds before slurmctld sets a silent node DOWN."""
CRED_EXPIRE = 10
"""AuthInfo's cred_expire of a cluster on hosts: a requeued job waits this + 1 s before it may start again."""
ENDED = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED")
"""The states of a job that has ended (`scontrol show job`'s JobState)."""
_BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "srun", "sbatch", "sinfo")


def _sbin(name):
    return shutil.which(name) or next((str(p) for p in (pathlib.Path("/usr/sbin") / name, pathlib.Path("/sbin") / name)
                                       if p.exists()), None)


def _free_ports(count):
    sockets, ports = [], []
    for _ in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
        ports.append(sock.getsockname()[1])
    for sock in sockets:
        sock.close()
    return ports


class SlurmCluster:
    """`with SlurmCluster(folder) as cluster:` a running Slurm of one node (or, with `hosts`, one per host);
    `cluster.env` for srun/sbatch."""

    def __init__(self, folder, cpus=None, hosts=None):
        self.folder = pathlib.Path(folder)
        self.cpus = cpus or os.cpu_count() or 2
        self.hosts = hosts
        self.nodes = list(hosts.names) if hosts is not None else [NODE]
        self.processes = []
        self._slurmd = {}

    @staticmethod
    def missing():
        """Why no cluster can start here (a reason for pytest.skip), or None."""
        absent = [name for name in _BINARIES if _sbin(name) is None]
        if absent:
            return (f"Slurm/munge not installed ({', '.join(absent)} missing): apt-get install slurmd slurmctld "
                    "slurm-client munge libpmix-dev (.ci/run does)")
        return None

    @property
    def env(self):
        return {"SLURM_CONF": str(self.folder / "slurm.conf")}

    def pmix_missing(self):
        """Why `srun --mpi=pmix` cannot start a step here, or None (Slurm's plugin loads libpmix.so)."""
        listed = subprocess.run([_sbin("srun"), "--mpi=list"], env={**os.environ, **self.env}, capture_output=True,
                                text=True, timeout=30)
        if "pmix" not in listed.stdout + listed.stderr:
            return f"this Slurm has no mpi/pmix plugin (srun --mpi=list: {listed.stdout.strip()})"
        if not any(pathlib.Path(d, "libpmix.so").exists() for d in
                   ("/usr/lib/x86_64-linux-gnu/pmix2/lib", "/usr/lib/aarch64-linux-gnu/pmix2/lib", "/usr/lib")):
            return "Slurm's mpi/pmix plugin needs libpmix.so (Debian: libpmix-dev)"
        return None

    def _start(self, *command, node=None):
        name = pathlib.Path(command[0]).name + (f"-{node}" if node else "")
        with open(self.folder / "log" / f"{name}.out", "a") as log:
            kwargs = dict(stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **self.env})
            if node is not None and self.hosts is not None:
                # this machine's mounts (slurmd reads its cgroups at start), the host's network and host name
                proc = self.hosts.popen(node, list(command), mounts=False, **kwargs)
                launch.KEPT.add(proc.pid)  # a daemon of the fixture (restart_node starts it during a test)
                self._slurmd[node] = proc
            else:
                proc = subprocess.Popen(command, **kwargs)
        self.processes.append(proc)
        return proc

    def _slurmd_command(self, node):
        return (_sbin("slurmd"), "-D", "-N", node, "-f", str(self.folder / "slurm.conf"))

    def node_states(self):
        """{node: state} from sinfo (states such as idle, allocated, down*, idle*)."""
        listed = subprocess.run([_sbin("sinfo"), "-h", "-N", "-o", "%N %T"], env={**os.environ, **self.env},
                                capture_output=True, text=True, timeout=30).stdout
        return dict(line.split(None, 1) for line in listed.splitlines() if line.strip())

    def job(self, job):
        """`scontrol show job JOB` as a dict (JobState, Reason, Restarts, ExitCode, NodeList, BatchHost, ...)."""
        proc = subprocess.run([_sbin("scontrol"), "show", "job", "-o", str(job)], env={**os.environ, **self.env},
                              capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise RuntimeError(f"scontrol show job {job}: {proc.stderr.strip()}")
        return dict(re.findall(r"(\w+)=(\S*)", proc.stdout))

    def _wait_idle(self, nodes, limit=60):
        deadline = time.monotonic() + limit
        states = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if all(states.get(node) == "idle" for node in nodes):
                return True
            time.sleep(0.5)
        return states

    def restart_node(self, node):
        """Start the slurmd of `node` again (after hosts.restore: a rebooted node) and wait until it is idle."""
        old = self._slurmd.pop(node, None)
        if old is not None:
            launch.KEPT.discard(old.pid)
            try:
                old.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._start(*self._slurmd_command(node), node=node)
        subprocess.run([_sbin("scontrol"), "update", f"nodename={node}", "state=resume"], capture_output=True,
                       env={**os.environ, **self.env}, timeout=30)  # refused where it is not DOWN: nothing to do
        states = self._wait_idle([node])
        if states is not True:
            raise RuntimeError(f"node {node} did not come back idle in 60 s (sinfo: {states}); logs in "
                               f"{self.folder / 'log'}")

    def __enter__(self):
        f = self.folder
        for sub in ("state", "spool", "log", "run"):
            (f / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(f, 0o700)  # munged refuses a key or socket in a folder others can write
        subprocess.run([_sbin("mungekey"), "--create", f"--keyfile={f / 'munge.key'}"], check=True,
                       capture_output=True, timeout=30)
        os.chmod(f / "munge.key", 0o600)
        socket_path = f / "munge.sock"
        self._start(_sbin("munged"), "--foreground", "--force", f"--socket={socket_path}",
                    f"--key-file={f / 'munge.key'}", f"--pid-file={f / 'run' / 'munged.pid'}",
                    f"--log-file={f / 'log' / 'munged.log'}", f"--seed-file={f / 'munged.seed'}")
        ctld_port, slurmd_port = _free_ports(2)
        if self.hosts is None:
            address = "127.0.0.1"
            nodes = [f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN"]
            spool, pids, logs = f / "spool", f / "run" / "slurmd.pid", f / "log" / "slurmd.log"
            per_host = []
        else:
            # Each node's own spool, pid and log file (%n: the node's name), and PMIx's client folder (TmpFS).
            address = self.hosts.gateway
            nodes = [f"NodeName={n} NodeHostname={n} NodeAddr={self.hosts.address(n)} CPUs={self.cpus} State=UNKNOWN"
                     for n in self.nodes]
            spool, pids, logs = f / "spool-%n", f / "run" / "slurmd-%n.pid", f / "log" / "slurmd-%n.log"
            for n in self.nodes:
                (f / f"tmpfs-{n}").mkdir(exist_ok=True)
                (f / f"spool-{n}").mkdir(exist_ok=True)
            # sched_interval: the main scheduling pass every 5 s, not 60 (a requeued job whose lost node was just
            # set DOWN waited for it: started 35 to 47 s after the DOWN with the default)
            per_host = [f"TmpFS={f / 'tmpfs-%n'}", f"SlurmdTimeout={NODE_TIMEOUT}", "MessageTimeout=5",
                        "SchedulerParameters=sched_interval=5",
                        # The nodes' CPUs as configured, whatever this machine has (4 tasks on one node of 2 cores)
                        "SlurmdParameters=config_overrides"]
        user = os.environ.get("USER") or "root"
        if os.geteuid() == 0:
            user = "root"
        (f / "slurm.conf").write_text("\n".join([
            "ClusterName=hvdsched",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({address})",
            f"SlurmctldPort={ctld_port}", f"SlurmdPort={slurmd_port}",
            f"SlurmUser={user}", f"SlurmdUser={user}",
            "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={socket_path}" + (f",cred_expire={CRED_EXPIRE}" if self.hosts is not None else ""),
            f"StateSaveLocation={f / 'state'}", f"SlurmdSpoolDir={spool}",
            f"SlurmctldPidFile={f / 'run' / 'slurmctld.pid'}", f"SlurmdPidFile={pids}",
            f"SlurmctldLogFile={f / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={logs}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "SchedulerType=sched/builtin",
            "MpiDefault=none", "ReturnToService=2", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "KillWait=5", "MinJobAge=60", *per_host, *nodes,
            f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
            ""]))
        deadline = time.monotonic() + 20
        while not socket_path.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        self._start(_sbin("slurmctld"), "-D", "-f", str(f / "slurm.conf"))
        for node in self.nodes:
            self._start(*self._slurmd_command(node), node=node if self.hosts is not None else None)
        state = self._wait_idle(self.nodes)
        if state is True:
            return self
        self.__exit__(None, None, None)
        raise RuntimeError(f"the test Slurm did not become idle in 60 s (sinfo: {state!r}); logs in {f / 'log'}:\n"
                           + "\n".join(p.read_text()[-2000:] for p in (f / "log").glob("*")))

    def __exit__(self, *exc):
        subprocess.run([_sbin("scancel"), "--full", "-u", os.environ.get("USER", "root")] if _sbin("scancel")
                       else ["true"], env={**os.environ, **self.env}, capture_output=True, timeout=30)
        for proc in reversed(self.processes):
            launch.KEPT.discard(proc.pid)
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in reversed(self.processes):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        self.processes = []
        return False
