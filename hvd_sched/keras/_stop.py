"""Stop requests from a cluster's signals, and the ranks' agreement on the iteration to stop at.

A signal handler here only records which signal came (the first one; a second Ctrl-C raises KeyboardInterrupt,
the way out of a job that no longer answers). It never saves, prints or calls Horovod: a handler runs between two
Python bytecodes of whatever the main thread was doing, possibly inside a collective or a file write (Lightning
saved in its handler and hung, its issue #21406). The training loop asks `agree` at an update boundary; every rank
calls it at the same iterations, so a signal that reaches one rank, or the ranks a step apart, stops them all at
the same iteration without a deadlock.
"""

import signal
import threading

from . import _horovod

__all__ = ["DEFAULT_SIGNALS", "signal_numbers", "signal_name", "StopRequests", "agree", "share_from_root"]

#: What schedulers and launchers send to stop a job: Slurm, Kubernetes, horovodrun and mpirun send SIGTERM,
#: a terminal's Ctrl-C SIGINT. SIGUSR1/SIGUSR2 (Slurm's `--signal`) are added by whoever asks for them.
DEFAULT_SIGNALS = ("SIGTERM", "SIGINT")

_UNCATCHABLE = ("SIGKILL", "SIGSTOP")


def signal_numbers(signals):
    """`signals` (names such as "SIGTERM" or "TERM", numbers, `signal.Signals`) as a tuple of `signal.Signals`.

    Raises:
        TypeError: `signals` is not a list or tuple (a single name must be in one: `("SIGUSR1",)`).
        ValueError: a name or number that is not a signal here, or SIGKILL/SIGSTOP (no process can catch them).
    """
    if isinstance(signals, (str, bytes, int)) or not isinstance(signals, (list, tuple)):
        raise TypeError(f"stop_signals must be a list or tuple of signals, e.g. ('SIGTERM', 'SIGUSR1'), got "
                        f"{signals!r}")
    numbers = []
    for item in signals:
        if isinstance(item, str):
            name = item.upper() if item.upper().startswith("SIG") else "SIG" + item.upper()
            number = getattr(signal.Signals, name, None)
        elif isinstance(item, int) and not isinstance(item, bool):
            try:
                number = signal.Signals(item)
            except ValueError:
                number = None
        else:
            number = None
        if number is None:
            raise ValueError(f"stop_signals: {item!r} is not a signal name or number here (e.g. 'SIGTERM', "
                             "'SIGUSR1', 15)")
        if number.name in _UNCATCHABLE:
            raise ValueError(f"stop_signals: {number.name} cannot be caught by any process; a job killed by it "
                             "loses what came after the last periodic checkpoint (period=...)")
        if number not in numbers:
            numbers.append(number)
    return tuple(numbers)


def signal_name(number):
    """'SIGTERM' for 15; None for 0 or None."""
    return signal.Signals(number).name if number else None


class StopRequests:
    """Installs handlers for `signals` that record the first one received (`received`, a number or None).

    A second SIGINT after a first one restores Python's handler and raises KeyboardInterrupt (a user pressing
    Ctrl-C twice wants out now). `install` and `uninstall` nest (the handlers stay from the first `install` to the
    last `uninstall`) and restore whatever handlers were there before; `uninstall(everything=True)` ends them all.
    """

    def __init__(self, signals):
        self.signals = tuple(signals)
        self.received = None
        self._previous = {}
        self._depth = 0

    @property
    def installed(self):
        return bool(self._previous)

    def install(self):
        """Install the handlers (main thread only: Python delivers signals there)."""
        if not self.signals:
            return
        if not self.installed:
            if threading.current_thread() is not threading.main_thread():
                raise RuntimeError("hvd_sched: stop signals can only be handled in the main thread (Python runs "
                                   "signal handlers there), and model.fit runs in another one; call fit from the "
                                   "main thread, or pass stop_signals=() to checkpoint without handling signals")
            for number in self.signals:
                self._previous[number] = signal.signal(number, self._handle)
        self._depth += 1

    def uninstall(self, everything=False):
        """Restore the handlers that were there before the first `install`, at the last `uninstall`."""
        self._depth = 0 if everything else max(self._depth - 1, 0)
        if self._depth:
            return
        for number, previous in self._previous.items():
            signal.signal(number, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def _handle(self, number, frame):
        if self.received is None:
            self.received = number
        elif number == signal.SIGINT and self.received == signal.SIGINT:
            self.uninstall(everything=True)
            raise KeyboardInterrupt


def agree(received, proposal):
    """Every rank's `received` signal (0: none) and the root's `proposal`, with one Horovod allgather.

    Returns:
        (the signal to stop for, or 0: the lowest-ranked rank that received one decides which; rank 0's proposal)
    """
    if _horovod.size() == 1:
        return int(received or 0), int(proposal)
    import horovod.tensorflow as hvd
    import tensorflow as tf

    rows = hvd.allgather(tf.constant([[int(received or 0), int(proposal)]], tf.int64),
                         name="hvd_sched_stop_agreement").numpy()
    signals = [int(value) for value in rows[:, 0] if value]
    return (signals[0] if signals else 0), int(rows[0, 1])


def share_from_root(value, root_rank=0):
    """`value` of `root_rank` on every rank (Horovod's broadcast_object); also a barrier: no rank returns before
    the root has reached it."""
    if _horovod.size() == 1:
        return value
    import horovod.tensorflow as hvd

    return hvd.broadcast_object(value, root_rank=root_rank, name="hvd_sched_stop_saved")
