"""Keras callbacks: the schedule for users who keep their own optimizer, LR logging, and Horovod's usual list.

All state is the optimizer's iteration counter (read once per epoch), so a resumed `model.fit` continues the
schedule where the checkpoint left it.
"""

import sys

from ..momentum import correction_factor
from . import _backend, _horovod, _slots
from ._tables import as_schedule
from .checkpoint import TrainingCheckpoint
from ._tracking import IterationTracker, epoch_problem
from .distributed import distributed_callbacks
from .guards import RankConsistencyCheck, StopOnNonFinite
from .optimizer import is_scheduled, scheduled_of

__all__ = ["ScheduleCallback", "LearningRateLogger", "horovod_callbacks"]

LOG_KEY = "learning_rate"


def _say_correction(iteration, old_lr, new_lr, factor):
    """The one line, on rank 0, that announces a momentum correction."""
    if _horovod.rank() == 0:
        print(f"hvd_sched: momentum correction at iteration {iteration}: lr {old_lr:.6g} -> {new_lr:.6g}, "
              f"momentum slots scaled by {factor:.6g}", file=sys.stdout, flush=True)


class ScheduleCallback(IterationTracker):
    """Sets the optimizer's LR from `schedule` at each batch and rescales its momentum slots when due.

    For users who keep their own optimizer (e.g. `DistributedOptimizer(tf.keras.optimizers.SGD(...))`).
    At the beginning of the batch run at iteration `it` it sets the LR to `schedule.lr_at(it)` and, on the
    iterations of `schedule.momentum_corrections`, multiplies every momentum slot by new_lr/old_lr (Detectron's
    `_CorrectMomentum`) before that step's update. The same weights as `ScheduledOptimizer` come out (tested).
    It writes `learning_rate` into the batch and epoch logs (the epoch value is the LR of the epoch's last batch).
    It needs `model.compile(steps_per_execution=1)` and no gradient accumulation (the LR is set between batches);
    `ScheduledOptimizer`, which schedules in-graph, has neither limit.

    Examples:
        ```python
        opt = hvd_sched.keras.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9))
        model.compile(opt, "sparse_categorical_crossentropy")
        model.fit(x, y, callbacks=hvd_sched.keras.horovod_callbacks(ScheduleCallback(schedule)))
        ```

    Args:
        schedule: an `hvd_sched.Schedule` (or its `get_config()` dict).
        momentum_correction: as for `ScheduledOptimizer` (None follows the schedule).
        correction_threshold: overrides the schedule's SCALE_MOMENTUM_THRESHOLD.
        verbose: 1 prints one line on rank 0 at each correction.

    Raises:
        ValueError: at train begin, for a `ScheduledOptimizer` (it already follows its schedule),
            `steps_per_execution` other than 1, or gradient accumulation; here, for a `correction_threshold` < 1.
        TypeError: at train begin, for an optimizer whose learning rate is not a float.
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
        self._corrected_at = None

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        if is_scheduled(optimizer):
            raise ValueError("the optimizer is a ScheduledOptimizer, which already follows its schedule; use "
                             "ScheduleCallback with a plain optimizer, or LearningRateLogger for logging only")
        if _backend.learning_rate_variable(optimizer) is None:
            raise TypeError(f"ScheduleCallback sets the optimizer's learning rate, which must be a float, got "
                            f"{type(_backend.unwrap(optimizer).learning_rate).__name__}; create the optimizer "
                            "with a float learning_rate")
        if _backend.steps_per_execution(self.model) != 1:
            raise ValueError("ScheduleCallback sets the LR once per batch and needs model.compile("
                             "steps_per_execution=1); use ScheduledOptimizer, which schedules in-graph")
        micro_batches = max(_backend.micro_batches(optimizer), self.schedule.iter_size)
        if micro_batches > 1:
            raise ValueError(f"ScheduleCallback sets the LR and rescales the slots between batches, which under "
                             f"gradient accumulation ({micro_batches} micro-batches per update) fall inside an "
                             "update; use hvd_sched.keras.ScheduledOptimizer, which schedules by update in-graph")
        mode = _slots.resolve_correction_mode(optimizer, self.schedule, self.momentum_correction)
        threshold = (self.schedule.scale_momentum_threshold if self.correction_threshold is None
                     else float(self.correction_threshold))
        self._rule = (mode, threshold)
        self._last_lr = None
        self._corrected_at = None

    def on_train_batch_begin(self, batch, logs=None):
        it = self._iteration_begin(batch)
        lr = self.schedule.lr_at(it)
        optimizer = self.model.optimizer
        if lr != self._last_lr:
            _backend.learning_rate_variable(optimizer).assign(lr)
            self._last_lr = lr
        old_lr = self.schedule.lr_at(it - 1) if it > 0 else 0.0  # Detectron's LR blob is 0 before iteration 0
        factor = correction_factor(old_lr, lr, *self._rule) if self._rule[0] != "off" else None
        # Once per iteration: a step skipped for non-finite gradients (Keras 3 mixed precision) runs again at the
        # same iteration, and its slots were already rescaled.
        if factor is not None and it != self._corrected_at:
            factor = float(factor)
            for slot in _backend.all_momentum_slots(optimizer):
                _backend.scale_variable(slot, factor)
            self._corrected_at = it
            if self.verbose:
                _say_correction(it, old_lr, lr, factor)
        self._lr = lr

    def on_train_batch_end(self, batch, logs=None):
        if logs is not None:
            logs[LOG_KEY] = self._lr

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and self._lr is not None:
            logs[LOG_KEY] = self._lr


class LearningRateLogger(IterationTracker):
    """Writes the scheduled LR into Keras' batch and epoch logs (key `learning_rate`) for History/TensorBoard.

    Use it with `ScheduledOptimizer` (whose LR lives in the graph). The value of a batch is
    `schedule.lr_at(it)` for the iteration that batch ran; the epoch value is the LR of the epoch's last step.
    With a `ScheduledOptimizer` built with `log_corrections=True` it also prints one line on rank 0 per momentum
    correction. Put it before TensorBoard/CSVLogger in the callback list (`horovod_callbacks` does).

    Examples:
        ```python
        opt = hvd_sched.keras.DistributedOptimizer(hvd_sched.keras.ScheduledOptimizer(sgd, schedule))
        model.compile(opt, "sparse_categorical_crossentropy")
        history = model.fit(x, y, epochs=3, callbacks=[hvd_sched.keras.LearningRateLogger()])
        history.history["learning_rate"]   # the LR of each epoch's last step
        ```

    Args:
        schedule: the schedule; default: the one of the model's ScheduledOptimizer.
        per_batch: also write batch logs (costs a Python call per batch; the epoch value is always written).
    """

    def __init__(self, schedule=None, per_batch=True):
        super().__init__()
        self.schedule = None if schedule is None else as_schedule(schedule)
        self.per_batch = per_batch
        self._next = 0
        self._last = None
        self._rule = None  # (mode, threshold) of the corrections to announce, or None
        if not per_batch:
            # Keras skips batch hooks still marked as the default, which keeps the training loop fast.
            self.on_train_batch_end = _backend.keras.callbacks.Callback.on_train_batch_end.__get__(self)

    def on_train_begin(self, logs=None):
        scheduled = scheduled_of(self.model.optimizer)
        problem = epoch_problem(self.model, (self.params or {}).get("steps"))
        if problem:
            raise ValueError(problem)
        if self.schedule is None:
            if scheduled is None:
                raise ValueError("LearningRateLogger() without a schedule needs a model compiled with a "
                                 "ScheduledOptimizer (also inside a LossScaleOptimizer); pass the schedule "
                                 "explicitly otherwise")
            self.schedule = scheduled.schedule
        # The corrections a ScheduledOptimizer makes in-graph, announced from here (rank 0, one line each).
        self._rule = None
        if scheduled is not None and scheduled.schedule == self.schedule and scheduled.logs_corrections:
            self._rule = (scheduled.momentum_correction_mode, scheduled.correction_threshold_in_force)

    def _announce(self, first, last):
        """One line per correction made at iterations first..last (found from the schedule's pieces)."""
        mode, threshold = self._rule
        for it, factor in self.schedule.momentum_corrections(last + 1, first, mode=mode, threshold=threshold):
            _say_correction(it, self._lr_at(it - 1), self._lr_at(it), factor)

    def _lr_at(self, iteration):
        scheduled = scheduled_of(self.model.optimizer)
        if scheduled is not None and scheduled.schedule == self.schedule:
            return scheduled.lr_at(iteration)  # includes an elastic world-size scale
        return self.schedule.lr_at(iteration)

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self._next = self._first_iteration()  # the first iteration whose correction is not announced yet
        self._last = None

    def _ran_until(self, last):
        """Announce the corrections of the iterations run since the last call, up to `last`."""
        if self._rule and last >= self._next:
            self._announce(self._next, last)
        self._next = max(self._next, last + 1)
        self._last = last

    def on_train_batch_end(self, batch, logs=None):  # replaced per instance when per_batch=False
        self._ran_until(self._iteration(batch))
        if logs is not None:
            logs[LOG_KEY] = self._lr_at(self._last)

    def on_epoch_end(self, epoch, logs=None):
        if self._last is None:  # batch hooks off: the epoch ran up to the current iteration
            self._ran_until(max(self._read_iterations() - 1, 0))
        if logs is not None:
            logs[LOG_KEY] = self._lr_at(self._last)
        self._last = None


def horovod_callbacks(schedule_callback=None, *, root_rank=0, average_metrics=True, log_lr=True,
                      per_batch_lr=True, check_ranks=True, stop_on_nonfinite=True, checkpoint_dir=None,
                      local_variables=None, checkpoint=None):
    """The usual callback list of a Horovod Keras job, in the order that works.

    1. `RankConsistencyCheck`: fail on every rank, before the first step, if the ranks' schedules, settings or
       starting iterations differ (one allgather per `fit`);
    2. `DistributedCheck`: on more than one rank, fail before the first step if the compiled optimizer does
       not average gradients (or, on Keras 3, could not: Horovod's own Keras wrapper, a LossScaleOptimizer
       around the distributed one, an XLA-compiled train step);
    3. the initial broadcast of rank `root_rank`'s weights and optimizer state, before the first step: on Keras 2
       Horovod's `BroadcastGlobalVariablesCallback`, run at train begin once the optimizer's slots are made (a
       model not built by then is broadcast by Horovod at the end of the first batch), on Keras 3
       `BroadcastVariables` (at train begin: Keras 3 builds the slots before);
    4. epoch metrics averaged over ranks, before anything logs them (Horovod's `MetricAverageCallback` on
       Keras 2, `AverageMetrics` on Keras 3);
    5. `schedule_callback` (a ScheduleCallback) if given, else a `LearningRateLogger` (for ScheduledOptimizer);
    6. `StopOnNonFinite`: a NaN/Inf loss stops the job with the iteration and the LR in the message;
    7. `checkpoint` (a `TrainingCheckpoint`) if given: after the metric averaging (it reads the averaged epoch
       loss) and after the NaN stop (a non-finite step is never saved), before anything you append (TensorBoard,
       a progress bar), which a stop at a signal then skips for that batch.

    Broadcast and averaging are Horovod's callbacks on Keras 2, and `BroadcastVariables(root_rank,
    local_variables)` / `AverageMetrics` (Horovod's `broadcast_variables` and `allreduce`) on Keras 3. Append
    TensorBoard and your own callbacks after these.

    Examples:
        ```python
        checkpoint = hvd_sched.keras.TrainingCheckpoint("runs/ckpt", period=500)
        callbacks = hvd_sched.keras.horovod_callbacks(checkpoint=checkpoint)
        if hvd.rank() == 0:
            callbacks.append(tf.keras.callbacks.TensorBoard("runs/tb"))
        model.fit(x, y, epochs=8, callbacks=callbacks)
        ```

    Args:
        schedule_callback: a ScheduleCallback for users who keep their own optimizer, or None.
        root_rank: the rank whose variables are broadcast.
        average_metrics: include the metric averaging.
        log_lr: include a LearningRateLogger when no schedule_callback is given.
        per_batch_lr: the logger also writes batch logs.
        check_ranks: include RankConsistencyCheck.
        stop_on_nonfinite: include StopOnNonFinite.
        checkpoint_dir: the checkpoint directory, named in StopOnNonFinite's message (default: `checkpoint`'s).
        local_variables: variables each rank keeps as it is, left out of the initial broadcast (Horovod's
            `BroadcastGlobalVariablesCallback(local_variables=...)`).
        checkpoint: a `TrainingCheckpoint` (or `EpochCheckpoint`) to put in its place, or None.

    Returns:
        A list of callbacks for `model.fit(callbacks=...)`.
    """
    _horovod.check_launcher(require_init=False)
    if schedule_callback is not None and not isinstance(schedule_callback, ScheduleCallback):
        raise TypeError(f"schedule_callback must be a ScheduleCallback, got {type(schedule_callback).__name__}")
    if checkpoint is not None and not isinstance(checkpoint, TrainingCheckpoint):
        raise TypeError(f"checkpoint must be a hvd_sched.keras.TrainingCheckpoint, got {type(checkpoint).__name__}")
    if checkpoint is not None and checkpoint_dir is None:
        checkpoint_dir = checkpoint.directory
    callbacks = []
    if check_ranks:
        callbacks.append(RankConsistencyCheck(schedule_callback.schedule if schedule_callback else None))
    callbacks.extend(distributed_callbacks(root_rank, average_metrics, local_variables))
    if schedule_callback is not None:
        callbacks.append(schedule_callback)
    elif log_lr:
        callbacks.append(LearningRateLogger(per_batch=per_batch_lr))
    if stop_on_nonfinite:
        callbacks.append(StopOnNonFinite(checkpoint_dir))
    if checkpoint is not None:
        callbacks.append(checkpoint)
    return callbacks
