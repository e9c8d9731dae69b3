"""Fail fast and loudly in the ways a distributed job fails: non-finite losses and ranks that disagree.

A scheduler that hangs 64 GPUs, or silently trains ranks with different learning rates, is worse than none:
- `StopOnNonFinite`: a NaN/Inf loss raises `NonFiniteLossError` naming the iteration and the LR in force. The
  raising process exits non-zero and `horovodrun` ends the other ranks (no hang: they would otherwise wait in
  the next allreduce). Since the gradients are averaged, a NaN on one rank poisons every rank's weights in the
  same step, so all ranks see it at once or one step later.
- `RankConsistencyCheck`: at train begin the ranks allgather their schedule config, correction settings, world
  size and iteration; any difference raises `RankMismatchError` on every rank, listing the values per rank.
"""

import json
import math

from . import _backend, _horovod
from ._tracking import IterationTracker, iteration_count
from .optimizer import scheduled_of

__all__ = ["StopOnNonFinite", "RankConsistencyCheck", "NonFiniteLossError", "RankMismatchError"]


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or Inf."""


class RankMismatchError(ValueError):
    """Horovod ranks were started with different schedules, settings or iterations."""


def _current_lr(optimizer, iteration):
    scheduled = scheduled_of(optimizer)
    if scheduled is not None:
        return scheduled.lr_at(iteration)
    return float(_backend.get_value(_backend.unwrap(optimizer).learning_rate))


class StopOnNonFinite(IterationTracker):
    """Raise `NonFiniteLossError` at the first batch whose loss is NaN or Inf.

    The message names the iteration, the loss and the LR in force at that iteration, and the latest checkpoint
    of `checkpoint_dir` (which `EpochCheckpoint` never replaces with a non-finite epoch).

    Args:
        checkpoint_dir: optional EpochCheckpoint directory, only for the message.
    """

    def __init__(self, checkpoint_dir=None):
        super().__init__()
        self.checkpoint_dir = checkpoint_dir

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None or math.isfinite(float(loss)):
            return
        # The iteration whose loss it is; a step skipped for it (Keras 3 mixed precision) did not advance the count.
        iteration = self._read_iterations() if _backend.skips_iterations(self.model.optimizer) else \
            self._iteration(batch)
        lr = _current_lr(self.model.optimizer, iteration)
        where = ""
        if self.checkpoint_dir is not None:
            from .checkpoint import latest_checkpoint

            meta = latest_checkpoint(self.checkpoint_dir)
            where = (f"; the latest checkpoint is still {meta['path']} (epoch {meta['epoch']})" if meta
                     else "; no checkpoint was written yet")
        self.model.stop_training = True
        raise NonFiniteLossError(f"hvd_sched: loss is {float(loss)} at iteration {iteration} on rank "
                                 f"{_horovod.rank()} (learning rate in force {lr:.6g}); stopping training{where}")


def _describe(model, schedule):
    optimizer = model.optimizer
    record = {"iteration": iteration_count(optimizer), "micro_batches": _backend.micro_batches(optimizer),
              "optimizer": type(optimizer).__name__}
    scheduled = scheduled_of(optimizer)
    if scheduled is not None:
        record["schedule"] = scheduled.schedule.get_config()
        record["momentum_correction"] = scheduled.momentum_correction_mode
        record["lr_multipliers"] = scheduled.lr_multipliers or None
    elif schedule is not None:
        record["schedule"] = schedule.get_config()
    return json.loads(json.dumps(record))


def _differences(records):
    keys = sorted({k for r in records for k in r})
    out = []
    for key in keys:
        values = [r.get(key) for r in records]
        if isinstance(values[0], dict) and all(isinstance(v, dict) for v in values):
            for sub in sorted({s for v in values for s in v}):
                column = [v.get(sub) for v in values]
                if any(c != column[0] for c in column):
                    out.append((f"{key}.{sub}", column))
        elif any(v != values[0] for v in values):
            out.append((key, values))
    return out


class RankConsistencyCheck(_backend.keras.callbacks.Callback):
    """At train begin, check that every Horovod rank has the same schedule, settings and starting iteration.

    One `allgather_object` per `model.fit` call (nothing per batch). On a mismatch every rank raises
    `RankMismatchError`, e.g. `schedule.base_lr: rank 0 = 0.2, rank 1 = 0.1`, before the first step.

    Args:
        schedule: the schedule a ScheduleCallback follows; default: the ScheduledOptimizer's.
    """

    def __init__(self, schedule=None):
        super().__init__()
        self.schedule = schedule

    def on_train_begin(self, logs=None):
        if _horovod.size() == 1:
            return  # one process (or Horovod not installed): nothing to compare
        import horovod.tensorflow as hvd

        record = _describe(self.model, self.schedule)
        record["world_size"] = hvd.size()
        records = hvd.allgather_object(record, name="hvd_sched_consistency")
        differences = _differences(records)
        if differences:
            lines = [f"{key}: " + ", ".join(f"rank {r} = {v!r}" for r, v in enumerate(values))
                     for key, values in differences]
            raise RankMismatchError("hvd_sched: the Horovod ranks disagree before training starts:\n  " +
                                    "\n  ".join(lines))
