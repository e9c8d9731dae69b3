"""Hosts of their own on this machine, for tests: N Linux network namespaces, each with its own host name, its own
address on a veth pair into a bridge that this module makes, and its own sshd.

    with Hosts(tmp_path / "hosts", count=2) as hosts:
        hosts.names            # ["hvd3h1", "hvd3h2"]: also each host's `hostname`
        hosts.address("hvd3h1")   # "10.203.3.11": exists only on that namespace's veth end
        hosts.run("hvd3h1", ["hostname"])   # a process inside (ip netns exec + its own UTS namespace)
        hosts.ssh_bin          # a folder whose `ssh` reaches the hosts' sshd with this module's key
        hosts.freeze("hvd3h2") / hosts.kill("hvd3h2") / hosts.cut("hvd3h2")   # a frozen, dead, cut-off node

The launcher's side (horovodrun, mpirun, sbatch) stays in this machine's own namespace, which reaches the hosts
over the bridge (address .1 of the subnet), as a login node reaches its cluster. Each host runs its processes in
a UTS namespace of its own (`unshare --uts`, host name = the namespace's name), so `socket.gethostname()`, Horovod
and Slurm see distinct hosts; the file system and the Python environments are this machine's (a shared file
system, as clusters have).

Faults, as a cluster has them: `freeze` SIGSTOPs every process of a host (a hung node: its sockets stay open,
nothing answers); `kill` first sets its link down, then SIGKILLs every process in it (a node whose kernel died: a
killed process's kernel would reset its connections, a dead node's sends nothing); `cut` sets its link down (a
cut cable or switch port: no reset reaches anyone). There is no `tc netem` here (no sch_netem module), so no
latency or loss.

Everything made here is removed at the end, also when a test fails: every process in each namespace SIGKILLed,
the namespaces deleted (their veth ends go with them), the bridge deleted, /etc/netns/NAME (each host's
/etc/hosts, which `ip netns exec` mounts: the hosts resolve each other's names) and sshd's privilege-separation
folder removed. Where namespaces cannot be made (not root, no `ip`, no `unshare`, no sshd), `Hosts.missing()`
says why, for pytest.skip. `.ci/run` installs iproute2, util-linux and openssh-server where missing.
"""

import os
import pathlib
import shutil
import signal
import subprocess
import time

import launch

__all__ = ["Hosts"]

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def _default_interface():
    """The device of this machine's default route (e.g. eth0), or eth0 where there is none."""
    words = _ip("route", "show", "default", check=False).stdout.split()
    return words[words.index("dev") + 1] if "dev" in words else "eth0"


def _free_tag(first):
    """The first tag from `first` on (1 to 200, wrapping) whose namespaces and bridge do not exist yet."""
    names = set(_ip("netns", "list", check=False).stdout.split())
    links = _ip("-o", "link", "show", check=False).stdout
    for step in range(200):
        tag = (first - 1 + step) % 200 + 1
        if f"hvd{tag}h1" not in names and f"hvdbr{tag}:" not in links:
            return tag
    raise RuntimeError("no free tag for hosts of their own: 200 sets of hvd*h* namespaces exist (ip netns list)")


class Hosts:
    """`with Hosts(folder, count) as hosts:` `count` hosts of their own (see the module's docstring)."""

    def __init__(self, folder, count=2, tag=None):
        self.folder = pathlib.Path(folder)
        self.count = int(count)
        # A tag of its own per instance: names and a subnet that no other hosts on this machine use.
        self.tag = int(tag if tag is not None else _free_tag(os.getpid() % 200 + 1))
        self.names = [f"hvd{self.tag}h{i}" for i in range(1, self.count + 1)]
        self.subnet = f"10.203.{self.tag}"
        self.bridge = f"hvdbr{self.tag}"
        self.gateway = f"{self.subnet}.1"
        # Each host's link, inside it, named as this machine's own way out (its default route's device): horovodrun
        # wants one interface name on every host and on the launcher's (`--network-interface`), and the
        # launcher's address on it is delivered here from the hosts' bridge.
        self.interface = _default_interface()
        self.etc = pathlib.Path("/etc/netns")
        self._made_etc = False
        self._made = []
        self._sshd = {}
        self._made_privsep = False

    @staticmethod
    def missing():
        """Why no hosts can be made here (a reason for pytest.skip), or None."""
        if os.geteuid() != 0:
            return "network namespaces need root (ip netns add): run the tests as root (CI containers do)"
        for tool in ("ip", "unshare", "nsenter", "ssh", "ssh-keygen"):
            if shutil.which(tool) is None:
                return f"{tool} not found: install iproute2, util-linux and openssh-client (.ci/run does)"
        if not os.path.exists(SSHD):
            return f"sshd not found ({SSHD}): install openssh-server (.ci/run does)"
        probe = f"hvdprobe{os.getpid()}"
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"network namespaces cannot be made here (ip netns add: {made.stderr.strip()})"
        _ip("netns", "del", probe, check=False)
        return None

    # ------------------------------------------------------------------------------------------ making them

    def address(self, name):
        return f"{self.subnet}.{10 + self.names.index(name) + 1}"

    def veth(self, name):
        """The host's link as seen from this machine (its end in the bridge): down = the host is cut off."""
        return f"hvdv{self.tag}x{self.names.index(name) + 1}"

    @property
    def cidr(self):
        return f"{self.subnet}.0/24"

    def prefix(self, name, mounts=True):
        """The command prefix that runs a process inside host `name`: its network namespace, its host name.
        `ip netns exec` also gives the process a mount namespace of its own, with the host's /etc/hosts and a sysfs
        of the namespace (no cgroup file systems in it); `mounts=False` enters the network namespace alone
        (nsenter), keeping this machine's mounts: for a daemon that reads its cgroups (slurmd)."""
        if mounts:
            enter = ["ip", "netns", "exec", name]
        else:
            enter = ["nsenter", f"--net=/run/netns/{name}"]
        return [*enter, "unshare", "--uts", "sh", "-c", f'hostname {name} && exec "$@"', "sh"]

    def run(self, name, command, **kwargs):
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 60)
        return subprocess.run(self.prefix(name) + list(command), **kwargs)

    def popen(self, name, command, mounts=True, **kwargs):
        return subprocess.Popen(self.prefix(name, mounts) + list(command), **kwargs)

    def __enter__(self):
        # Removed by __exit__ (the fixture's teardown), or by tests/guard.py where no teardown runs (its backstop
        # after a hang outside Python, SIGTERM to pytest) and at the session's end.
        launch.CLEANUPS.append(self._cleanup)
        try:
            self._make()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _make(self):
        self.folder.mkdir(parents=True, exist_ok=True)
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("bridge", self.bridge))
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        # Name resolution, as a cluster's DNS gives it (Gloo's TCP device looks its own host name up): `ip netns
        # exec` bind-mounts /etc/netns/NAME/hosts over /etc/hosts for the processes of host NAME.
        hosts_file = "".join(["127.0.0.1 localhost\n"] + [f"{self.address(n)} {n}\n" for n in self.names])
        if not self.etc.exists():
            self.etc.mkdir(mode=0o755)
            self._made_etc = True
        for name in self.names:
            (self.etc / name).mkdir(exist_ok=True)
            self._made.append(("etc", name))
            (self.etc / name / "hosts").write_text(hosts_file)
        for name in self.names:
            _ip("netns", "add", name)
            self._made.append(("netns", name))
            outside, inside = self.veth(name), f"hvde{self.tag}x{self.names.index(name) + 1}"
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            self._made.append(("link", outside))
            _ip("link", "set", inside, "netns", name)
            _ip("link", "set", outside, "master", self.bridge)
            _ip("link", "set", outside, "up")
            _ip("-n", name, "link", "set", "lo", "up")
            # One name on every host, as a cluster's nodes have (horovodrun needs an interface name they share).
            _ip("-n", name, "link", "set", inside, "name", self.interface)
            _ip("-n", name, "addr", "add", f"{self.address(name)}/24", "dev", self.interface)
            _ip("-n", name, "link", "set", self.interface, "up")
            _ip("-n", name, "route", "add", "default", "via", self.gateway)
        self._start_sshd()

    def _start_sshd(self):
        f = self.folder
        for key in ("host_key", "client_key"):
            if not (f / key).exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(f / key)], check=True)
        shutil.copy(f / "client_key.pub", f / "authorized_keys")
        privsep = pathlib.Path("/run/sshd")
        if not privsep.exists():
            privsep.mkdir(mode=0o755)
            self._made_privsep = True
        (f / "ssh_config").write_text("\n".join([
            "Host *", f"  IdentityFile {f / 'client_key'}", f"  UserKnownHostsFile {f / 'known_hosts'}",
            "  StrictHostKeyChecking no", "  BatchMode yes", "  LogLevel ERROR", "  ConnectTimeout 10",
            "  ServerAliveInterval 5", "  ServerAliveCountMax 3", ""]))
        bin_dir = f / "bin"
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "ssh").write_text(f"#!/bin/sh\nexec {shutil.which('ssh')} -F {f / 'ssh_config'} \"$@\"\n")
        (bin_dir / "ssh").chmod(0o755)
        for name in self.names:
            self._start_host_sshd(name)
        self._wait_for_sshd(self.names)

    def _start_host_sshd(self, name):
        f = self.folder
        config = f / f"sshd_{name}.config"
        config.write_text("\n".join([
            "Port 22", f"ListenAddress {self.address(name)}", f"HostKey {f / 'host_key'}",
            f"PidFile {f / f'sshd_{name}.pid'}", f"AuthorizedKeysFile {f / 'authorized_keys'}",
            "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "UsePAM no", "StrictModes no", "PermitRootLogin prohibit-password", "AcceptEnv *",
            "PermitUserEnvironment no", "LogLevel VERBOSE", "MaxStartups 100", "MaxSessions 100", ""]))
        log = open(f / f"sshd_{name}.log", "w")
        self._sshd[name] = self.popen(name, [SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=log,
                                      start_new_session=True)
        launch.KEPT.add(self._sshd[name].pid)  # a daemon of the fixture: not killed at the end of a test
        log.close()

    def _wait_for_sshd(self, names):
        f, bin_dir = self.folder, self.folder / "bin"
        deadline = time.monotonic() + 30
        for name in names:
            while True:
                probe = subprocess.run([str(bin_dir / "ssh"), self.address(name), "hostname"], capture_output=True,
                                       text=True, timeout=30)
                if probe.returncode == 0 and probe.stdout.strip() == name:
                    break
                if self._sshd[name].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the sshd of host {name} did not answer: {probe.stderr}\n"
                                       + (f / f"sshd_{name}.log").read_text()[-2000:])
                time.sleep(0.2)

    @property
    def ssh_bin(self):
        """A folder whose `ssh` reaches the hosts (put it first on PATH; what ~/.ssh/config does on a cluster)."""
        return self.folder / "bin"

    @property
    def ssh_key(self):
        return self.folder / "client_key"

    # ------------------------------------------------------------------------------------------ faults

    def pids(self, name):
        """Every process of host `name` (its network namespace)."""
        listed = _ip("netns", "pids", name, check=False).stdout.split()
        return [int(pid) for pid in listed if pid.isdigit()]

    def holds(self, name, pid):
        """Whether process `pid` runs in host `name` (its network namespace)."""
        try:
            return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{name}").st_ino
        except OSError:
            return False

    def _signal_all(self, name, number):
        for pid in self.pids(name):
            try:
                os.kill(pid, number)
            except ProcessLookupError:
                pass

    def freeze(self, name):
        """SIGSTOP every process of the host: a frozen node."""
        self._signal_all(name, signal.SIGSTOP)

    def thaw(self, name):
        self._signal_all(name, signal.SIGCONT)

    def cut(self, name):
        """Its link down: no packet in or out, no reset to anyone."""
        _ip("link", "set", self.veth(name), "down")

    def kill(self, name):
        """A node that died: its link down first (a dead kernel resets no connection), then every process."""
        self.cut(name)
        self._signal_all(name, signal.SIGKILL)

    def crash(self, name):
        """Every process of the host SIGKILLed, its kernel (and link) alive: the OOM killer, a node agent killing
        the job, a crashed container; its kernel resets the TCP connections of the processes killed."""
        self._signal_all(name, signal.SIGKILL)

    def restore(self, name):
        """The host rebooted after a fault: every process of it gone, its link up, its sshd answering."""
        self._signal_all(name, signal.SIGCONT)
        for _ in range(20):
            self._signal_all(name, signal.SIGKILL)
            if not self.pids(name):
                break
            time.sleep(0.1)
        _ip("link", "set", self.veth(name), "up")
        self._sshd[name].wait(timeout=10)
        launch.KEPT.discard(self._sshd[name].pid)
        self._start_host_sshd(name)
        self._wait_for_sshd([name])

    # ------------------------------------------------------------------------------------------ removing them

    def __exit__(self, *exc):
        if self._cleanup in launch.CLEANUPS:
            launch.CLEANUPS.remove(self._cleanup)
        self._cleanup()
        return False

    def _cleanup(self):
        for proc in self._sshd.values():
            launch.KEPT.discard(proc.pid)
        for kind, name in reversed(self._made):
            if kind == "netns":
                for _ in range(3):
                    self._signal_all(name, signal.SIGCONT)
                    self._signal_all(name, signal.SIGKILL)
                    if not self.pids(name):
                        break
                    time.sleep(0.2)
        for proc in self._sshd.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for kind, name in reversed(self._made):
            if kind == "netns":
                _ip("netns", "del", name, check=False)
            elif kind == "etc":
                shutil.rmtree(self.etc / name, ignore_errors=True)
            else:
                _ip("link", "del", name, check=False)
        self._made = []
        if self._made_etc:
            shutil.rmtree(self.etc, ignore_errors=True)
            self._made_etc = False
        if self._made_privsep:
            shutil.rmtree("/run/sshd", ignore_errors=True)
            self._made_privsep = False
