"""The multi-host launch, for real: `horovodrun -H 127.0.0.2:2,127.0.0.3:2 -p PORT --ssh-identity-file KEY` over ssh.

Two "hosts" on loopback aliases (Linux routes all of 127.0.0.0/8 to `lo`), each reached through an sshd this
module starts itself: host and client keys generated in a temporary folder, key authentication only, its own
port, stopped at the end. Horovod treats only localhost/127.0.0.1 as local, so every rank below is started by
`ssh 127.0.0.x ...`, exactly as on a cluster; sshd's log proves it (one accepted key per launch). Nothing outside
the temporary folder is changed, except /run/sshd (sshd's privilege-separation folder, required when it runs as
root), which is made if missing and removed again. Host keys go to a known_hosts file in the folder: `ssh` on the
PATH of the launch is a wrapper that adds `-F` with this module's client config (what ~/.ssh/config does on a
cluster), so the user's ~/.ssh is never read or written.

Where sshd is not installed or cannot start, the tests are skipped with the reason (never passed). `.ci/run`
installs openssh-server where it is missing.
"""

import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from launch import rank_env, run_dropping_when_held

pytestmark = pytest.mark.multirank

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = [ROOT / "examples" / "train_keras.py", "--config", ROOT / "examples" / "configs" / "digits_warmup_steps.yaml",
        "--epochs", "8"]
ELASTIC_JOB = pathlib.Path(__file__).with_name("elastic_job.py")
HOSTS = ("127.0.0.2", "127.0.0.3")
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
FINAL = re.compile(r"rank (\d+): final val accuracy ([0-9.]+)")


def _free_port():
    with socket.socket() as probe:
        probe.bind((HOSTS[0], 0))
        return probe.getsockname()[1]


def _ssh(hosts, host, *command):
    return subprocess.run([str(hosts["ssh"]), host, "-p", str(hosts["port"]), "-i", str(hosts["key"]), *command],
                          capture_output=True, text=True, timeout=20)


@pytest.fixture(scope="module")
def ssh_hosts(tmp_path_factory):
    """An sshd listening on 127.0.0.2 and 127.0.0.3; yields its port, the client key and the ssh wrapper's folder."""
    if not os.path.exists(SSHD):
        pytest.skip(f"sshd not found ({SSHD}): install openssh-server (.ci/run does) to test the multi-host launch")
    if not (shutil.which("ssh") and shutil.which("ssh-keygen")):
        pytest.skip("ssh/ssh-keygen not found: install openssh-client (.ci/run does) to test the multi-host launch")
    folder = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)], check=True)
    shutil.copy(folder / "client_key.pub", folder / "authorized_keys")
    port = _free_port()
    (folder / "sshd_config").write_text("\n".join([
        f"Port {port}", *(f"ListenAddress {host}" for host in HOSTS), f"HostKey {folder / 'host_key'}",
        f"PidFile {folder / 'sshd.pid'}", f"AuthorizedKeysFile {folder / 'authorized_keys'}",
        "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
        "StrictModes no", "PermitRootLogin prohibit-password", "LogLevel VERBOSE", ""]))
    (folder / "ssh_config").write_text("\n".join([
        "Host *", f"  UserKnownHostsFile {folder / 'known_hosts'}", "  StrictHostKeyChecking no", "  BatchMode yes",
        "  LogLevel ERROR", ""]))
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f"#!/bin/sh\nexec {shutil.which('ssh')} "
                                 f"-F {folder / 'ssh_config'} \"$@\"\n")
    (bin_dir / "ssh").chmod(0o755)
    privsep = pathlib.Path("/run/sshd")
    made_privsep = os.geteuid() == 0 and not privsep.exists()
    if made_privsep:
        privsep.mkdir(mode=0o755)
    log = open(folder / "sshd.log", "w")
    sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(folder / "sshd_config")], stdout=log, stderr=log,
                            start_new_session=True)
    hosts = {"port": port, "key": folder / "client_key", "bin": bin_dir, "ssh": bin_dir / "ssh",
             "log": folder / "sshd.log"}
    try:
        deadline = time.time() + 20
        while True:
            if sshd.poll() is not None:
                pytest.skip(f"sshd could not start (exit {sshd.returncode}): {(folder / 'sshd.log').read_text()}")
            if all(_ssh(hosts, host, "true").returncode == 0 for host in HOSTS):
                break
            if time.time() > deadline:
                pytest.skip("sshd started but ssh to 127.0.0.2/127.0.0.3 did not succeed in 20 s: "
                            + _ssh(hosts, HOSTS[1], "true").stderr + (folder / "sshd.log").read_text()[-2000:])
            time.sleep(0.2)
        yield hosts
    finally:
        sshd.terminate()
        try:
            sshd.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(sshd.pid, signal.SIGKILL)
            sshd.wait()
        log.close()
        if made_privsep:
            shutil.rmtree(privsep, ignore_errors=True)


def _launch(hosts, out_dir, horovodrun_args, script_and_args, timeout):
    """horovodrun over ssh, as the README's multi-host line: returns (returncode, stdout + stderr)."""
    horovodrun = pathlib.Path(sys.executable).with_name("horovodrun")
    cmd = [str(horovodrun), *horovodrun_args, "--gloo", "-p", str(hosts["port"]),
           "--ssh-identity-file", str(hosts["key"]), sys.executable, *map(str, script_and_args)]
    env = rank_env(out_dir, {"PATH": os.pathsep.join([str(hosts["bin"]), os.environ.get("PATH", "")])})
    out_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(cmd, env=env, cwd=str(out_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout} s:\n{output[-8000:]}")
    return proc.returncode, output


def _commands_per_host(hosts):
    """How many commands sshd ran per address it was reached on (VERBOSE log: each connection's address, then
    its sessions by client port): the launches horovodrun made on each "host"."""
    log = hosts["log"].read_text()
    reached = dict(re.findall(r"Connection from \S+ port (\d+) on (\S+) port \d+", log))
    counts = dict.fromkeys(HOSTS, 0)
    for client_port in re.findall(r"Starting session: command for \S+ from \S+ port (\d+)", log):
        counts[reached[client_port]] += 1
    return counts


def test_demo_on_two_hosts_of_two_slots_over_ssh_ends_identical_on_four_ranks(ssh_hosts, tmp_path):
    before = _commands_per_host(ssh_hosts)
    returncode, output = _launch(ssh_hosts, tmp_path, ["-np", "4", "-H", f"{HOSTS[0]}:2,{HOSTS[1]}:2"],
                                 [*DEMO, "--out", tmp_path / "demo"], timeout=400)
    assert returncode == 0, output[-8000:]
    finals = {int(rank): float(accuracy) for rank, accuracy in FINAL.findall(output)}
    assert sorted(finals) == [0, 1, 2, 3], output[-4000:]
    assert len(set(finals.values())) == 1, f"the 4 ranks ended with different weights: {finals}"
    assert finals[0] > 0.9
    assert "4 ranks" in output
    # The ranks came through sshd: horovodrun checks each host over ssh, then starts each host's ranks over ssh
    # (Horovod treats 127.0.0.2/3 as remote hosts).
    after = _commands_per_host(ssh_hosts)
    assert all(after[host] - before[host] >= 2 for host in HOSTS), (before, after)


def test_elastic_across_two_hosts_survives_a_host_dropped_by_discovery(ssh_hosts, tmp_path):
    """test_elastic.py's job on 2 hosts of 1 slot, 127.0.0.3 removed by the discovery script at iteration 25: the
    survivor on 127.0.0.2 keeps its iteration and halves its LR and momentum slots at the reset."""
    drop = tmp_path / "DROP"
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\necho {HOSTS[0]}:1\n[ -f {drop} ] || echo {HOSTS[1]}:1\n")
    discover.chmod(0o755)
    before = _commands_per_host(ssh_hosts)
    horovodrun = pathlib.Path(sys.executable).with_name("horovodrun")
    cmd = [str(horovodrun), "--gloo", "--network-interface", "lo", "-np", "2", "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", str(discover), "-p", str(ssh_hosts["port"]),
           "--ssh-identity-file", str(ssh_hosts["key"]), sys.executable, str(ELASTIC_JOB)]
    env = rank_env(tmp_path, {"PATH": os.pathsep.join([str(ssh_hosts["bin"]), os.environ.get("PATH", "")])})
    returncode, dropped_at, stdout, stderr = run_dropping_when_held(
        cmd, tmp_path, env, drop, hold_at=25, reach_timeout=240, finish_timeout=240)
    output = stdout + stderr
    assert returncode == 0, output[-8000:]
    survivors = [json.loads(p.read_text()) for p in tmp_path.glob("elastic*.json")]
    assert len(survivors) == 1, output[-8000:]
    record = survivors[0]
    assert record["start_size"] == 2 and record["final_size"] == 1
    [reset] = record["resets"]
    assert reset["world_size"] == 1 and reset["scale"] == 0.5 and reset["slot_factor"] == 0.5
    assert dropped_at == 25 and reset["iteration"] > dropped_at and record["final_iteration"] >= 80
    its = [batch["it"] for batch in record["batches"]]
    assert its == sorted(set(its)) and its[0] == 0
    after = _commands_per_host(ssh_hosts)
    assert all(after[host] - before[host] >= 1 for host in HOSTS), (before, after)
