"""examples/train_keras.py with one rank misbehaving on purpose, for tests/multirank/test_nodes.py.

The example runs unchanged; one callback is added after its own (HVD_SCHED_TEST_FAULT, on rank
HVD_SCHED_TEST_FAULT_RANK, at iteration HVD_SCHED_TEST_FAULT_AT, for HVD_SCHED_TEST_FAULT_SECONDS):

- `validation`: a long validation on that rank alone (it sleeps at the end of the epoch that holds the iteration,
  where Keras validates, before the checkpoint's epoch-end agreement: the others wait for it there);
- `save`: a slow checkpoint save on rank 0 (it sleeps in the write, inside the epoch);
- `first_step`: the first step slowed down on that rank (a slow compile, or a data loader's first fill);
- `raise`: that rank raises an error at the iteration (a bug, a failed read): the others are left in a collective.

Every rank prints `fault_job: rank R of N on host H` as it sets up, and `fault_job: rank R at iteration I` when the
iteration is reached, so tests act on what the job reports.
"""

import os
import pathlib
import socket
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import train_keras  # noqa: E402

import hvd_sched.keras.checkpoint as checkpoint_module  # noqa: E402

KIND = os.environ.get("HVD_SCHED_TEST_FAULT", "")
RANK = int(os.environ.get("HVD_SCHED_TEST_FAULT_RANK") or "1")
AT = int(os.environ.get("HVD_SCHED_TEST_FAULT_AT") or "100")
SECONDS = float(os.environ.get("HVD_SCHED_TEST_FAULT_SECONDS") or "0")


class Misbehave(train_keras.tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rank = train_keras.hvd.rank()
        self.done = False

    def _iteration(self):
        return hvd_sched.keras.iteration_count(self.model.optimizer)

    def on_train_batch_begin(self, batch, logs=None):
        if KIND == "first_step" and self.rank == RANK and not self.done:
            self.done = True
            print(f"fault_job: rank {self.rank} slows its first step by {SECONDS:g} s", flush=True)
            time.sleep(SECONDS)

    def on_train_batch_end(self, batch, logs=None):
        if self.done or self._iteration() < AT:
            return
        if KIND == "raise":
            self.done = True
            print(f"fault_job: rank {self.rank} at iteration {self._iteration()}", flush=True)
            if self.rank == RANK:
                raise RuntimeError(f"fault_job: rank {self.rank} fails on purpose at iteration {self._iteration()}")

    def on_epoch_end(self, epoch, logs=None):
        if KIND == "validation" and not self.done and self._iteration() >= AT:
            self.done = True
            if self.rank == RANK:
                print(f"fault_job: rank {self.rank} validates for {SECONDS:g} s more at iteration "
                      f"{self._iteration()}", flush=True)
                time.sleep(SECONDS)


import hvd_sched.keras  # noqa: E402

if KIND == "save":
    _write = checkpoint_module.write_checkpoint

    def slow_write(directory, model, meta, *args, **kwargs):
        if meta["iteration"] >= AT and not getattr(slow_write, "done", False):
            slow_write.done = True
            print(f"fault_job: rank 0 saves iteration {meta['iteration']} for {SECONDS:g} s", flush=True)
            time.sleep(SECONDS)
        return _write(directory, model, meta, *args, **kwargs)

    checkpoint_module.write_checkpoint = slow_write

_callbacks = train_keras.horovod_callbacks


def callbacks_with_fault(*args, **kwargs):
    # Where this rank runs (tests/multirank/test_nodes.py checks the hosts' layout).
    print(f"fault_job: rank {train_keras.hvd.rank()} of {train_keras.hvd.size()} on host {socket.gethostname()}",
          flush=True)
    # Before the checkpoint (last in the list): a long validation delays this rank's epoch-end agreement.
    found = _callbacks(*args, **kwargs)
    return found[:-1] + [Misbehave(), found[-1]] if KIND else found


train_keras.horovod_callbacks = callbacks_with_fault

if __name__ == "__main__":
    sys.exit(train_keras.main())
