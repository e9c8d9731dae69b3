"""A one-node Slurm cluster for tests, started in a temporary folder and stopped at the end.

Debian's `slurm-wlm` daemons (slurmctld, slurmd) and `munge` (its authentication), run as the current user, in
the foreground, with everything in the folder: munge's key and socket, slurm.conf with its own ports on
127.0.0.1, the state, spool, logs and pid files. No system file is read or written; the node is named
`hvdsched` (slurmd -N), so nothing depends on the machine's host name except SlurmctldHost, which slurmctld
requires to be its own short host name. Clients find the cluster through SLURM_CONF (`SlurmCluster.env`).

.ci/run installs the packages where missing (slurmd slurmctld slurm-client munge libpmix-dev: the last is what
Slurm's mpi/pmix plugin loads, `libpmix.so`); `SlurmCluster.missing()` gives the reason to skip where they are not.
"""

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time

__all__ = ["SlurmCluster", "NODE"]

NODE = "hvdsched"
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
    """`with SlurmCluster(folder) as cluster:` a running one-node Slurm; `cluster.env` for srun/sbatch."""

    def __init__(self, folder, cpus=None):
        self.folder = pathlib.Path(folder)
        self.cpus = cpus or os.cpu_count() or 2
        self.processes = []

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

    def _start(self, *command):
        log = open(self.folder / "log" / f"{pathlib.Path(command[0]).name}.out", "w")
        self.processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True, env={**os.environ, **self.env}))

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
        user = os.environ.get("USER") or "root"
        if os.geteuid() == 0:
            user = "root"
        (f / "slurm.conf").write_text("\n".join([
            "ClusterName=hvdsched",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}", f"SlurmdPort={slurmd_port}",
            f"SlurmUser={user}", f"SlurmdUser={user}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={socket_path}",
            f"StateSaveLocation={f / 'state'}", f"SlurmdSpoolDir={f / 'spool'}",
            f"SlurmctldPidFile={f / 'run' / 'slurmctld.pid'}", f"SlurmdPidFile={f / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={f / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={f / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "SchedulerType=sched/builtin",
            "MpiDefault=none", "ReturnToService=2", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "KillWait=5", "MinJobAge=60",
            f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
            f"PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
            ""]))
        deadline = time.monotonic() + 20
        while not socket_path.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        self._start(_sbin("slurmctld"), "-D", "-f", str(f / "slurm.conf"))
        self._start(_sbin("slurmd"), "-D", "-N", NODE, "-f", str(f / "slurm.conf"))
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline:
            state = subprocess.run([_sbin("sinfo"), "-h", "-N", "-o", "%T"], env={**os.environ, **self.env},
                                   capture_output=True, text=True, timeout=30).stdout.strip()
            if state == "idle":
                return self
            time.sleep(0.5)
        self.__exit__(None, None, None)
        raise RuntimeError(f"the test Slurm did not become idle in 60 s (sinfo: {state!r}); logs in {f / 'log'}:\n"
                           + "\n".join(p.read_text()[-2000:] for p in (f / "log").glob("*")))

    def __exit__(self, *exc):
        subprocess.run([_sbin("scancel"), "--full", "-u", os.environ.get("USER", "root")] if _sbin("scancel")
                       else ["true"], env={**os.environ, **self.env}, capture_output=True, timeout=30)
        for proc in reversed(self.processes):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.processes):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.processes = []
        return False
