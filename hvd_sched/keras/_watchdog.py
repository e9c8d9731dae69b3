"""Peers that stop answering: a heartbeat between the ranks, off the training path, that ends this process when
another rank's host has died, frozen or been cut off, instead of waiting in a collective until the job's time limit.

Why heartbeats and not a progress timeout: a rank waiting in an allreduce cannot tell a peer that is slow (a long
validation, a checkpoint save, the first step's compile, a data loader's stall) from one that will never come.
Each rank's process can: a thread of its own sends a small UDP datagram to every other rank every `interval`
seconds, whatever its main thread is doing (TensorFlow releases the GIL in its kernels, the save and the
compile). A peer silent for `timeout` seconds is gone (SIGKILL of its host, SIGSTOP, a link set down: no datagram
comes from it); a slow peer keeps beating, so a healthy job is never stopped however long its pauses are.

What the thread does and does not do: it sends and receives datagrams, reads the newest checkpoint's metadata
(a file read) for its message, prints, and ends the process with `os._exit(PEER_LOST_STATUS)`. It never calls
Horovod or TensorFlow and never saves: the main thread may be inside a collective or a checkpoint write. The only
collective is one `allgather_object` of each rank's addresses, once per process, at the first train begin.

Where the main thread raises first (Horovod reports a lost connection: a killed process's kernel resets its
sockets, unlike a dead node's), the exception hook waits for the heartbeat's verdict before the process exits,
so the job ends with the same status and message; a rank whose own code raised tells its peers (a FAILED
datagram) and they end at once instead of after `timeout`, with status 1 and no note file: a failure, which a job
script must not requeue as a lost node.
"""

import fcntl
import os
import secrets
import socket
import struct
import sys
import threading
import time

__all__ = ["PEER_LOST_STATUS", "PeerWatchdog", "shared", "local_addresses"]

PEER_LOST_STATUS = 75
"""The exit status (75, EX_TEMPFAIL: try again) of a rank that `TrainingCheckpoint(peer_timeout=...)` ended
because another rank stopped answering (its host died, froze or was cut off), distinct from a stop signal's 128 + N
and from an error's 1; examples/slurm/train.sbatch requeues the job on it, and `--resume` goes on from the newest
checkpoint."""

# The exit status of a rank whose peer failed on an error of its own (a FAILED datagram, every other peer
# answering): an error's, like the failed rank's.
FAILED_PEER_STATUS = 1

_MAGIC = b"HVDW"
_PACKET = struct.Struct("!4s8sIIBq")  # magic, job token, rank, sequence, state, iteration
BEATING, DONE, FAILED = 0, 1, 2
_SIOCGIFADDR = 0x8915


def local_addresses():
    """The IPv4 addresses of this host's interfaces (Linux; where none can be read, the host name's)."""
    addresses = []
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        names = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for name in names:
            try:
                packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # no IPv4 address on this interface
            address = socket.inet_ntoa(packed[20:24])
            if address not in addresses:
                addresses.append(address)
    if not addresses:
        try:
            addresses.append(socket.gethostbyname(socket.gethostname()))
        except OSError:
            addresses.append("127.0.0.1")
    return addresses


_SHARED = []


def shared(timeout, describe, note=None):
    """This process's one PeerWatchdog (made at the first call; later calls set its timeout, message source and
    note file: the fit now starting is the one it speaks for)."""
    if not _SHARED:
        _SHARED.append(PeerWatchdog(timeout, describe=describe, note=note))
    watchdog = _SHARED[0]
    watchdog.timeout, watchdog.describe, watchdog.note = float(timeout), describe, note
    watchdog.interval = default_interval(watchdog.timeout)
    return watchdog


def default_interval(timeout):
    """Seconds between two heartbeats for a `timeout`: 20 beats per timeout, between 0.2 and 2 s."""
    return min(max(float(timeout) / 20.0, 0.2), 2.0)


def _write_note(path, text, first_only=False, since=0.0):
    """Write `text` to `path` whole (a temporary file renamed). `first_only`: keep a note written since `since`
    (time.time()) by another rank: the view of the ranks that still hear rank 0 wins a partition."""
    partial = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(partial, "w") as f:
            f.write(text)
        if first_only:
            time.sleep(1.0)  # the other side writes at once: let its note land first
            try:
                if os.stat(path).st_mtime >= since:
                    os.unlink(partial)
                    return
            except FileNotFoundError:
                pass
        os.replace(partial, path)
    except OSError as exc:
        print(f"hvd_sched: could not write {path}: {exc}", file=sys.stderr, flush=True)


#: What Horovod's errors say when a collective cannot complete because a peer's connection is gone (Gloo's and
#: MPI's words, through TensorFlow's op errors). Not "Horovod" alone: hvd_sched's own errors name Horovod in their
#: fixes, and a rank that raised one must tell its peers at once, not wait for a verdict.
_LOST_CONNECTION = ("Horovod has been shut down", "Connection closed by peer", "Connection reset by peer",
                    "Broken pipe", "Gloo", "gloo::")


def _is_horovod_error(exc):
    """True where `exc` is Horovod reporting a collective that cannot complete (a peer's connection lost)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return "HorovodInternalError" in names or any(words in str(exc) for words in _LOST_CONNECTION)


class PeerWatchdog:
    """The heartbeat of one rank: `start` once Horovod is initialised (every rank, at the same point: it
    allgathers the addresses), `watch(True/False)` around the fits, `iteration` kept current by the caller.

    Args:
        timeout: seconds of silence after which a peer is gone and this process exits PEER_LOST_STATUS.
        interval: seconds between two heartbeats (default: timeout / 20, between 0.2 and 2).
        describe: a callable returning the newest checkpoint, as text, for the message (called by the thread;
            it must only read files).
        note: a file the message is also written to before the exit (or None), so that a job script can tell a
            lost peer whatever status its launcher reports (srun, horovodrun report their own).
    """

    def __init__(self, timeout, interval=None, describe=None, note=None):
        self.timeout = float(timeout)
        self.interval = float(interval) if interval else default_interval(self.timeout)
        self.describe = describe
        self.note = note
        self.iteration = -1
        self.watching = False
        self.started = False
        self._state = BEATING
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def start(self, rank, size):
        """Open the socket, exchange the addresses (one Horovod allgather_object) and start the thread."""
        import horovod.tensorflow as hvd

        self.rank, self.size = int(rank), int(size)
        self._started_at = time.time()
        self.host = socket.gethostname()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("0.0.0.0", 0))
        mine = {"host": self.host, "addresses": local_addresses(), "port": self._sock.getsockname()[1],
                "pid": os.getpid(), "token": secrets.token_bytes(8)}
        everyone = hvd.allgather_object(mine, name="hvd_sched_watchdog_addresses")
        self._token = everyone[0]["token"]
        self.peers = {}
        for peer, info in enumerate(everyone):
            if peer == self.rank:
                continue
            same_host = sorted(info["addresses"]) == sorted(mine["addresses"])
            targets = [("127.0.0.1", info["port"])] if same_host else [
                (address, info["port"]) for address in info["addresses"] if not address.startswith("127.")]
            self.peers[peer] = {"host": info["host"], "pid": info["pid"], "targets": targets or
                                [(address, info["port"]) for address in info["addresses"]]}
        now = time.monotonic()
        self._seen = dict.fromkeys(self.peers, now)
        self._peer_state = dict.fromkeys(self.peers, BEATING)
        self._peer_iteration = dict.fromkeys(self.peers, -1)
        self._sequence = 0
        self._thread = threading.Thread(target=self._run, name="hvd_sched-peer-watchdog", daemon=True)
        self.started = True
        self._install_hook()
        self._thread.start()

    # ------------------------------------------------------------------------------------------ the thread

    def _send(self, state):
        self._sequence += 1
        packet = _PACKET.pack(_MAGIC, self._token, self.rank, self._sequence & 0xFFFFFFFF, state,
                              int(self.iteration))
        for peer in self.peers.values():
            for target in peer["targets"]:
                try:
                    self._sock.sendto(packet, target)
                except OSError:
                    pass  # unreachable from here (a link down): the peers judge our silence

    def _receive(self, wait):
        self._sock.settimeout(max(wait, 0.01))
        try:
            data, _ = self._sock.recvfrom(64)
        except (socket.timeout, OSError):
            return
        if len(data) != _PACKET.size:
            return
        magic, token, rank, _, state, iteration = _PACKET.unpack(data)
        if magic != _MAGIC or token != self._token or rank not in self._seen:
            return
        self._seen[rank] = time.monotonic()
        self._peer_state[rank] = state
        self._peer_iteration[rank] = iteration

    def _run(self):
        next_beat = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                self._send(self._state)
                next_beat = now + self.interval
            self._receive(next_beat - now)
            if self.watching and self._state == BEATING:
                self._judge(time.monotonic())

    def _judge(self, now):
        failed = [peer for peer, state in self._peer_state.items() if state == FAILED]
        silent = [peer for peer, seen in self._seen.items()
                  if self._peer_state[peer] == BEATING and now - seen > self.timeout]
        if failed or silent:
            self._end(failed, silent, now)

    def _end(self, failed, silent, now):
        parts = []
        for peer in failed:
            parts.append(f"rank {peer} (host {self.peers[peer]['host']}, pid {self.peers[peer]['pid']}) failed "
                         f"(an error at its iteration {self._peer_iteration[peer]})")
        for peer in silent:
            parts.append(f"rank {peer} (host {self.peers[peer]['host']}, pid {self.peers[peer]['pid']}) has not "
                         f"answered for {now - self._seen[peer]:.1f} s (its last heartbeat at iteration "
                         f"{self._peer_iteration[peer]})")
        try:
            newest = self.describe() if self.describe else "unknown"
        except Exception as exc:  # noqa: BLE001 (the message must go out whatever the checkpoint folder holds)
            newest = f"unreadable ({exc})"
        if not silent:
            # Every peer is answering, one failed on an error of its own: a failure, not a lost node. Status 1 and no
            # note, so that a job script does not requeue a job that would fail again.
            message = (f"hvd_sched: {'; '.join(parts)}. This is rank {self.rank} on host {self.host} at iteration "
                       f"{self.iteration}; newest checkpoint: {newest}. Exiting with status {FAILED_PEER_STATUS} "
                       f"(a peer failed; its own output has the error)")
            print(message, file=sys.stderr, flush=True)
            os._exit(FAILED_PEER_STATUS)
        message = (f"hvd_sched: {'; '.join(parts)}. This is rank {self.rank} on host {self.host} at iteration "
                   f"{self.iteration}; newest checkpoint: {newest}. Exiting with status {PEER_LOST_STATUS} (peer "
                   f"lost; TrainingCheckpoint(peer_timeout={self.timeout:g})): requeue or relaunch with --resume")
        print(message, file=sys.stderr, flush=True)
        if self.note:
            # In a thread of its own: a hung file system (one of the faults this is for) must not keep the process
            # from exiting.
            # A link cut in two leaves both sides running, each seeing the other silent, and both may reach a shared
            # file system: the side that still hears rank 0 (the launcher's, usually) says which ranks were lost,
            # and the other side's note stands only where none of this job's is there (rank 0's side is gone too).
            first_only = self.rank != 0 and 0 in silent
            writer = threading.Thread(target=_write_note, args=(self.note, message + "\n", first_only,
                                                                self._started_at), daemon=True)
            writer.start()
            writer.join(2.0)
        os._exit(PEER_LOST_STATUS)

    # ------------------------------------------------------------------------------------------ the main thread

    def done(self):
        """This process is leaving normally: peers stop watching it."""
        if not self.started or self._state != BEATING:
            return
        self._state = DONE
        for _ in range(3):
            self._send(DONE)

    def failed(self):
        """This process is leaving on an error of its own: peers stop at once."""
        if not self.started:
            return
        self._state = FAILED
        for _ in range(3):
            self._send(FAILED)

    def _install_hook(self):
        previous = sys.excepthook
        import atexit

        atexit.register(self.done)

        def hook(kind, value, traceback):
            previous(kind, value, traceback)  # (SystemExit, TrainingInterrupted's too, never comes here)
            if self.watching and _is_horovod_error(value):
                # A peer's connection is gone: wait for the heartbeat's verdict (the thread exits the process).
                deadline = time.monotonic() + self.timeout + 3 * self.interval
                while time.monotonic() < deadline:
                    time.sleep(self.interval)
            self.failed()

        sys.excepthook = hook
