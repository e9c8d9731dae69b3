"""Keras callbacks: the schedule for users who keep their own optimizer, LR logging, and Horovod's usual list.

All state is the optimizer's iteration counter (read once per epoch), so a resumed `model.fit` continues the
schedule where the checkpoint left it.
"""

import sys

import tensorflow as tf

from . import _slots
from ..momentum import correction_factor
from ._tables import as_schedule
from .optimizer import is_scheduled

__all__ = ["ScheduleCallback", "LearningRateLogger", "horovod_callbacks"]

LOG_KEY = "learning_rate"


def _say_correction(iteration, old_lr, new_lr, factor):
    """The one line, on rank 0, that announces a momentum correction."""
    if _slots.rank() == 0:
        print(f"hvd_sched: momentum correction at iteration {iteration}: lr {old_lr:.6g} -> {new_lr:.6g}, "
              f"momentum slots scaled by {factor:.6g}", file=sys.stdout, flush=True)


class _IterationTracker(tf.keras.callbacks.Callback):
    """Knows the global iteration of each batch without reading the device every batch."""

    def __init__(self):
        super().__init__()
        self._epoch_start = 0

    def _read_iterations(self):
        return int(tf.keras.backend.get_value(self.model.optimizer.iterations))

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._read_iterations()

    def _iteration(self, batch):
        return self._epoch_start + int(batch)


class ScheduleCallback(_IterationTracker):
    """Sets the optimizer's LR from `schedule` at each batch and rescales its momentum slots when due.

    For users who keep their own optimizer (e.g. `hvd.DistributedOptimizer(tf.keras.optimizers.SGD(...))`).
    At the beginning of the batch run at iteration `it` it sets the LR to `schedule.lr_at(it)` and, on the
    iterations of `schedule.momentum_corrections`, multiplies every momentum slot by new_lr/old_lr (Detectron's
    `_CorrectMomentum`) before that step's update. The same weights as `ScheduledOptimizer` come out (tested).
    It writes `learning_rate` into the batch and epoch logs (the epoch value is the LR of the epoch's last batch).

    Example:
        >>> opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(momentum=0.9))
        >>> model.compile(opt, "mse")
        >>> model.fit(x, y, callbacks=hvd_sched.keras.horovod_callbacks(ScheduleCallback(schedule)))

    Args:
        schedule: an `hvd_sched.Schedule` (or its `get_config()` dict).
        momentum_correction: as for `ScheduledOptimizer` (None follows the schedule).
        correction_threshold: overrides the schedule's SCALE_MOMENTUM_THRESHOLD.
        verbose: 1 prints one line on rank 0 at each correction.
    """

    def __init__(self, schedule, momentum_correction=None, correction_threshold=None, verbose=1):
        super().__init__()
        self.schedule = as_schedule(schedule)
        if correction_threshold is not None and not (isinstance(correction_threshold, (int, float))
                                                     and not isinstance(correction_threshold, bool)
                                                     and correction_threshold >= 1):
            raise ValueError(f"correction_threshold must be a number >= 1, got {correction_threshold!r}")
        self.momentum_correction = momentum_correction
        self.correction_threshold = correction_threshold
        self.verbose = verbose
        self._rule = ("off", 1.0)
        self._last_lr = None
        self._lr = None

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        if is_scheduled(optimizer):
            raise ValueError("the optimizer is a ScheduledOptimizer, which already follows its schedule; use "
                             "ScheduleCallback with a plain optimizer, or LearningRateLogger for logging only")
        if not isinstance(optimizer.learning_rate, tf.Variable):
            raise TypeError(f"ScheduleCallback sets the optimizer's learning rate, which must be a float, got "
                            f"{type(optimizer.learning_rate).__name__}; create the optimizer with a float "
                            "learning_rate")
        steps_per_execution = getattr(self.model, "_steps_per_execution", None)
        if steps_per_execution is not None and int(tf.keras.backend.get_value(steps_per_execution)) != 1:
            raise ValueError("ScheduleCallback sets the LR once per batch and needs model.compile("
                             "steps_per_execution=1); use ScheduledOptimizer, which schedules in-graph")
        mode = _slots.resolve_correction_mode(optimizer, self.schedule, self.momentum_correction)
        threshold = (self.schedule.scale_momentum_threshold if self.correction_threshold is None
                     else float(self.correction_threshold))
        self._rule = (mode, threshold)
        self._last_lr = None

    def on_train_batch_begin(self, batch, logs=None):
        it = self._iteration(batch)
        lr = self.schedule.lr_at(it)
        optimizer = self.model.optimizer
        if lr != self._last_lr:
            optimizer.learning_rate.assign(lr)
            self._last_lr = lr
        old_lr = self.schedule.lr_at(it - 1) if it > 0 else 0.0  # Detectron's LR blob is 0 before iteration 0
        factor = correction_factor(old_lr, lr, *self._rule) if self._rule[0] != "off" else None
        if factor is not None:
            factor = float(factor)
            for slot in _slots.all_momentum_slots(optimizer):
                slot.assign(slot * tf.cast(factor, slot.dtype))
            if self.verbose:
                _say_correction(it, old_lr, lr, factor)
        self._lr = lr

    def on_train_batch_end(self, batch, logs=None):
        if logs is not None:
            logs[LOG_KEY] = self._lr

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and self._lr is not None:
            logs[LOG_KEY] = self._lr


class LearningRateLogger(_IterationTracker):
    """Writes the scheduled LR into Keras' batch and epoch logs (key `learning_rate`) for History/TensorBoard.

    Use it with `ScheduledOptimizer` (whose LR lives in the graph). The value of a batch is
    `schedule.lr_at(it)` for the iteration that batch ran; the epoch value is the LR of the epoch's last batch.
    Put it before TensorBoard/CSVLogger in the callback list (`horovod_callbacks` does).

    Args:
        schedule: the schedule; default: the one of the model's ScheduledOptimizer.
        per_batch: also write batch logs (costs a Python call per batch; the epoch value is always written).
    """

    def __init__(self, schedule=None, per_batch=True):
        super().__init__()
        self.schedule = None if schedule is None else as_schedule(schedule)
        self.per_batch = per_batch
        self._last_batch = None
        self._rule = None  # (mode, threshold) of the corrections to announce, or None
        if not per_batch:
            # Keras skips batch hooks still marked as the default, which keeps the training loop fast.
            self.on_train_batch_end = tf.keras.callbacks.Callback.on_train_batch_end.__get__(self)

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        if self.schedule is None:
            if not is_scheduled(optimizer):
                raise ValueError("LearningRateLogger() without a schedule needs a model compiled with a "
                                 "ScheduledOptimizer; pass the schedule explicitly otherwise")
            self.schedule = optimizer.schedule
        # The corrections a ScheduledOptimizer makes in-graph, announced from here (rank 0, one line each).
        self._rule = None
        if is_scheduled(optimizer) and optimizer.schedule == self.schedule and optimizer._hvd_sched.log_corrections \
                and optimizer._hvd_sched.has_corrections:
            self._rule = (optimizer._hvd_sched.mode, optimizer._hvd_sched.threshold)

    def _announce(self, first, last):
        """One line per correction made at iterations first..last (found from the schedule's pieces)."""
        mode, threshold = self._rule
        for it, factor in self.schedule.momentum_corrections(last + 1, first, mode=mode, threshold=threshold):
            _say_correction(it, self._lr_at(it - 1), self._lr_at(it), factor)

    def _lr_of(self, batch):
        return self._lr_at(self._iteration(batch))

    def _lr_at(self, iteration):
        optimizer = self.model.optimizer
        if is_scheduled(optimizer) and optimizer.schedule == self.schedule:
            return optimizer.lr_at(iteration)  # includes an elastic world-size scale
        return self.schedule.lr_at(iteration)

    def on_train_batch_end(self, batch, logs=None):  # replaced per instance when per_batch=False
        if self._rule:
            first = self._iteration(self._last_batch + 1 if self._last_batch is not None else 0)
            self._announce(first, self._iteration(batch))
        self._last_batch = batch
        if logs is not None:
            logs[LOG_KEY] = self._lr_of(batch)

    def on_epoch_end(self, epoch, logs=None):
        if self._last_batch is None:  # batch hooks off: the epoch ran up to the current iteration
            last = max(self._read_iterations() - 1, 0)
            if self._rule:
                self._announce(self._epoch_start, last)
        else:
            last = self._iteration(self._last_batch)
        if logs is not None:
            logs[LOG_KEY] = self._lr_at(last)
        self._last_batch = None


def horovod_callbacks(schedule_callback=None, *, root_rank=0, average_metrics=True, log_lr=True,
                      per_batch_lr=True, check_ranks=True, stop_on_nonfinite=True, checkpoint_dir=None):
    """The usual callback list of a Horovod Keras job, in the order that works.

    1. `RankConsistencyCheck`: fail on every rank, before the first step, if the ranks' schedules, settings or
       starting iterations differ (one allgather per `fit`);
    2. `hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank)`: rank 0's weights and optimizer state to all
       (at the end of the first batch, once the slots exist);
    3. `hvd.callbacks.MetricAverageCallback()`: epoch metrics averaged over ranks, before anything logs them;
    4. `schedule_callback` (a ScheduleCallback) if given, else a `LearningRateLogger` (for ScheduledOptimizer);
    5. `StopOnNonFinite`: a NaN/Inf loss stops the job with the iteration and the LR in the message.

    Append checkpointing (`EpochCheckpoint`) and TensorBoard after these.

    Args:
        schedule_callback: a ScheduleCallback for users who keep their own optimizer, or None.
        root_rank: the rank whose variables are broadcast.
        average_metrics: include MetricAverageCallback.
        log_lr: include a LearningRateLogger when no schedule_callback is given.
        per_batch_lr: the logger also writes batch logs.
        check_ranks: include RankConsistencyCheck.
        stop_on_nonfinite: include StopOnNonFinite.
        checkpoint_dir: the EpochCheckpoint directory, named in StopOnNonFinite's message.

    Returns:
        A list of callbacks for `model.fit(callbacks=...)`.
    """
    import horovod.tensorflow.keras as hvd

    from .guards import RankConsistencyCheck, StopOnNonFinite

    if schedule_callback is not None and not isinstance(schedule_callback, ScheduleCallback):
        raise TypeError(f"schedule_callback must be a ScheduleCallback, got {type(schedule_callback).__name__}")
    callbacks = []
    if check_ranks:
        callbacks.append(RankConsistencyCheck(schedule_callback.schedule if schedule_callback else None))
    callbacks.append(hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank))
    if average_metrics:
        callbacks.append(hvd.callbacks.MetricAverageCallback())
    if schedule_callback is not None:
        callbacks.append(schedule_callback)
    elif log_lr:
        callbacks.append(LearningRateLogger(per_batch=per_batch_lr))
    if stop_on_nonfinite:
        callbacks.append(StopOnNonFinite(checkpoint_dir))
    return callbacks
