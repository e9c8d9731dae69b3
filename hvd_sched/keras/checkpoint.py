"""Checkpoints that a killed process cannot tear: at epoch ends, every N iterations, and at a scheduler's signal,
with every rank stopping at the same iteration; restoring the newest on every rank, and resuming inside an epoch.

The layout, the metadata and the atomic write are documented in `TrainingCheckpoint` and `restore_latest`.
"""

import collections
import contextlib
import json
import os
import shutil
import sys
import time

import numpy as np
import tensorflow as tf

from .. import _validation
from . import _backend, _horovod, _stop, _watchdog
from ._tracking import iteration_count, note_restored, resume_offset
from .optimizer import scheduled_of
from ._watchdog import PEER_LOST_STATUS

# The file in a TrainingCheckpoint's folder that a rank ending with PEER_LOST_STATUS writes its message to.
PEER_LOST_NOTE = "peer_lost.txt"

__all__ = ["TrainingCheckpoint", "EpochCheckpoint", "TrainingInterrupted", "PEER_LOST_STATUS", "latest_checkpoint",
           "restore_latest", "resume_plan", "FitPart", "write_checkpoint"]

#: restore_latest's `lr_rule` choices for a checkpoint of another world size or schedule (None: refuse those).
LR_RULES = ("linear", "schedule")

_LATEST = "latest"
#: TrainingCheckpoint's default peer_timeout (seconds): a heartbeat is missed only by a host that is gone, so the
#: bound need not cover slow steps, validation or saves; 60 s covers a heavily loaded host's scheduling stalls.
DEFAULT_PEER_TIMEOUT = 60.0
_PREFIX = "ckpt"


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path):
    for name in os.listdir(path):
        with open(os.path.join(path, name), "rb") as f:
            os.fsync(f.fileno())
    _fsync_dir(path)


def latest_checkpoint(directory):
    """The metadata of the newest complete checkpoint in `directory` (with its "path"), or None.

    Args:
        directory: a `TrainingCheckpoint` directory.

    Returns:
        The checkpoint's metadata dict (see `restore_latest`), or None if there is none yet.
    """
    pointer = os.path.join(directory, _LATEST)
    try:
        with open(pointer) as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    path = os.path.join(directory, name)
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    meta["path"] = path
    return meta


def _iteration_of(path):
    """The iteration a checkpoint folder holds (its meta.json), or -1 where it cannot be read."""
    try:
        with open(os.path.join(path, "meta.json")) as f:
            return int(json.load(f)["iteration"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1


def write_checkpoint(directory, model, meta, keep=3, optimizer=None):
    """Write `model` and its optimizer into `directory` atomically, point `latest` at it, keep the `keep` newest.

    The folder is `epoch-EEEE` where `meta["step"] == meta["steps_per_epoch"]` (an epoch end), else
    `iter-IIIIIIII`. Call it on one rank (the others hold the same state). Returns the checkpoint's path.
    """
    os.makedirs(directory, exist_ok=True)
    for entry in os.listdir(directory):  # a save torn by a killed process
        if entry.startswith(".tmp-"):
            shutil.rmtree(os.path.join(directory, entry), ignore_errors=True)
    steps = meta.get("steps_per_epoch")
    at_epoch_end = meta.get("step") is None or (steps is not None and meta["step"] >= steps)
    name = f"epoch-{meta['epoch']:04d}" if at_epoch_end else f"iter-{meta['iteration']:08d}"
    final = os.path.join(directory, name)
    tmp = os.path.join(directory, f".tmp-{name}-{os.getpid()}")
    os.makedirs(tmp)
    tf.train.Checkpoint(model=model, optimizer=optimizer or model.optimizer).write(os.path.join(tmp, _PREFIX))
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f)
    _fsync_tree(tmp)
    if os.path.exists(final):  # the same epoch or iteration again, after a resume
        shutil.rmtree(final)
    os.rename(tmp, final)
    pointer_tmp = os.path.join(directory, f".{_LATEST}.tmp")
    with open(pointer_tmp, "w") as f:
        f.write(name)
        f.flush()
        os.fsync(f.fileno())
    os.replace(pointer_tmp, os.path.join(directory, _LATEST))
    _fsync_dir(directory)
    # The `keep` newest up to this one (a resumed run may find newer folders of an abandoned run: left alone).
    saved = sorted((_iteration_of(os.path.join(directory, e)), e.startswith("epoch-"), e)
                   for e in os.listdir(directory) if e.startswith(("epoch-", "iter-")))
    older = [entry for entry in saved if entry[:2] <= (meta["iteration"], at_epoch_end)]
    for _, _, entry in older[:-keep]:
        shutil.rmtree(os.path.join(directory, entry), ignore_errors=True)
    return final


def restore_latest(directory, model, optimizer=None, *, lr_rule=None):
    """Restore the newest complete checkpoint of `directory` into `model` (and its optimizer) on every rank.

    Every rank reads the checkpoint (a shared or copied directory); under Horovod rank 0's metadata and then
    its variables are broadcast as well, so ranks that could not read it, or read a different one, agree.
    Continue with the fits of `resume_plan(meta, ...)`: for an epoch-end checkpoint that is
    `model.fit(..., initial_epoch=meta["epoch"] + 1)`; a checkpoint saved inside an epoch first needs the rest
    of that epoch (a fit that does otherwise is stopped before its first step, naming the fix).

    A checkpoint written at another world size (a 2-rank job fine-tuned in one process), or whose schedule gave
    another LR at its iteration than this optimizer's, is refused unless `lr_rule` says how the LR goes on (the
    momentum slots carry the LR of the last update, so a silent change would train with a wrong momentum):

    - `"linear"`: the checkpoint's schedule and iteration continue (build the optimizer as the job did) with the
      LR scaled by new world size / old (the linear scaling rule, `ElasticLRScaler`'s), the momentum slots
      rescaled by the same factor;
    - `"schedule"`: this optimizer's own schedule (a new one for fine-tuning) from the checkpoint's iteration, the
      slots rescaled as Detectron's rule does when the LR goes from the checkpoint's last LR to this schedule's.

    Args:
        directory: the TrainingCheckpoint directory.
        model: the compiled model to restore into.
        optimizer: default `model.optimizer`.
        lr_rule: None (the same world size and schedule as the checkpoint's, else a ValueError naming the two
            rules), "linear" or "schedule" (`LR_RULES`).

    Returns:
        The checkpoint's metadata dict ("epoch", "step", "steps_per_epoch", "iteration", "micro_batches",
        "signal", "path", "world_size", "lr", "last_lr"), or None if there is none yet.
        Its keys: "iteration" is the updates made (Detectron's iteration); "epoch" the Keras epoch (0-based) the
        checkpoint was saved in and "step" the updates made in it, out of "steps_per_epoch" (an epoch-end checkpoint has
        step == steps_per_epoch); "micro_batches" the micro-batches per update; "signal" the signal that stopped the job
        ("SIGTERM"), or null; "world_size" the ranks that wrote it; "lr" and "last_lr" the ScheduledOptimizer's LR of
        the next update and of the last one (null where there is none); with an `lr_rule`, "slot_factor", the factor
        the momentum slots were rescaled by.

    Raises:
        ValueError: `lr_rule` is none of the above, or None where the world size or the schedule changed, or
            "linear" where this optimizer's schedule is not the checkpoint's.

    Examples:
        ```python
        meta = hvd_sched.keras.restore_latest("runs/ckpt", model)   # every rank; None on a first run
        for part in hvd_sched.keras.resume_plan(meta, steps_per_epoch=22, epochs=8):
            model.fit(make_dataset(skip=part.skip_batches), initial_epoch=part.initial_epoch,
                      epochs=part.epochs, steps_per_epoch=part.steps_per_epoch, callbacks=callbacks)
        ```
    """
    _horovod.check_launcher(require_init=False)
    if lr_rule is not None and lr_rule not in LR_RULES:
        raise ValueError(f"lr_rule must be None, 'linear' or 'schedule', got {lr_rule!r}")
    optimizer = optimizer or model.optimizer
    if lr_rule is not None and scheduled_of(optimizer) is None:
        raise ValueError(f"lr_rule={lr_rule!r} needs a ScheduledOptimizer (its schedule gives the LR), got "
                         f"{type(optimizer).__name__}")
    meta = latest_checkpoint(directory)
    if meta is not None:
        _backend.build_slots(optimizer, model.trainable_variables)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        checkpoint.read(os.path.join(meta["path"], _PREFIX)).assert_existing_objects_matched()
    hvd = _initialized_horovod()
    if hvd is not None and hvd.size() > 1:
        meta = hvd.broadcast_object(meta, root_rank=0, name="hvd_sched_restore_meta")
        if meta is not None:
            _backend.build_slots(optimizer, model.trainable_variables)
            variables = list(model.variables) + _backend.optimizer_variables(optimizer)
            hvd.broadcast_variables(_backend.backing_variables(variables), root_rank=0)
    if meta is not None:
        _continue_lr(meta, scheduled_of(optimizer), lr_rule)
    note_restored(model, meta)
    return meta


def schedule_meta(optimizer, iteration):
    """The checkpoint metadata that says how its LR goes on: {"world_size", "lr", "last_lr"} (see
    `restore_latest`); the LRs are null where `optimizer` is not scheduled, "last_lr" at iteration 0."""
    scheduled = scheduled_of(optimizer)
    iteration = int(iteration)
    return {"world_size": int(_horovod.size()),
            "lr": None if scheduled is None else scheduled.lr_at(iteration),
            "last_lr": None if scheduled is None or iteration == 0 else scheduled.lr_at(iteration - 1)}


def _continue_lr(meta, scheduled, lr_rule):
    """Check or apply `lr_rule` (see restore_latest) on the restored `scheduled` optimizer; fills
    meta["slot_factor"] where a rule was applied."""
    if scheduled is None:
        return
    iteration = int(meta["iteration"])
    saved_size, size = meta.get("world_size"), int(_horovod.size())
    where = f"the checkpoint {meta.get('path', '')} (iteration {iteration}"
    saved_last, own_last = meta.get("last_lr"), (scheduled.lr_at(iteration - 1) if iteration > 0 else None)
    same_schedule = saved_last is None or np.float32(saved_last) == np.float32(own_last)
    choices = ("restore_latest(..., lr_rule='linear') to continue its schedule with the LR scaled by the world "
               "sizes (the linear scaling rule; build the optimizer with the job's schedule), or "
               "lr_rule='schedule' to follow this optimizer's schedule from that iteration (a new one for "
               "fine-tuning); either rescales the momentum slots to match (docs/how-to/off-cluster.md)")
    if lr_rule is None:
        if saved_size is not None and saved_size != size:
            raise ValueError(f"{where}) was written by {saved_size} ranks and this job has {size}: its momentum "
                             f"slots carry the LR of {saved_size} ranks. Choose how the LR goes on: {choices}")
        if not same_schedule:
            raise ValueError(f"{where}) last updated with LR {saved_last:g} and this optimizer's schedule gives "
                             f"{own_last:g} there: another schedule. Build the optimizer as the job did, or use "
                             f"{choices}")
        return
    if lr_rule == "linear":
        if saved_size is None:
            raise ValueError(f"{where}) does not record its world size (written before hvd_sched recorded it): "
                             "lr_rule='linear' cannot know the old size; use lr_rule='schedule' with a schedule "
                             "built for this world size")
        if not same_schedule:
            raise ValueError(f"{where}) last updated with LR {saved_last:g}, and this optimizer's schedule gives "
                             f"{own_last:g} there: lr_rule='linear' continues the checkpoint's own schedule, so "
                             "build the optimizer with the job's schedule (its config and world_size), or use "
                             "lr_rule='schedule' to follow this one")
        old_scale = scheduled.lr_scale
        factor = scheduled.set_lr_scale(old_scale * size / saved_size)
        change = f"LR scale {old_scale:g} -> {scheduled.lr_scale:g}"
    else:
        if iteration > 0 and saved_last is None and "last_lr" not in meta:
            raise ValueError(f"{where}) does not record its last LR (written before hvd_sched recorded it): "
                             "lr_rule='schedule' cannot correct the momentum slots; resume it with the job's "
                             "schedule and world size")
        factor = scheduled.follow_schedule_from(saved_last, iteration)
        change = f"this optimizer's schedule from LR {scheduled.lr_at(iteration):g}"
    meta["slot_factor"] = factor
    if _horovod.rank() == 0:
        print(f"hvd_sched: resumed {where}, {saved_size or '?'} ranks) on {size}: {change}, momentum slots "
              f"scaled by {factor:g}", flush=True)


def _initialized_horovod():
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return None
    return hvd if hvd.is_initialized() else None


FitPart = collections.namedtuple("FitPart", ["initial_epoch", "epochs", "steps_per_epoch", "skip_batches"])
"""One `model.fit` of a resumed run, as `resume_plan` returns them (a named tuple).

Its fields: `initial_epoch` and `epochs` (`model.fit`'s), `steps_per_epoch` (Keras batches, i.e.
micro-batches, for `model.fit(steps_per_epoch=...)`) and `skip_batches`, the micro-batches of the data stream
consumed before it (`dataset.skip(part.skip_batches)`).
"""


def resume_plan(meta, steps_per_epoch, epochs, micro_batches=1):
    """The `model.fit` calls that continue a run from checkpoint `meta` (None: from scratch) to `epochs`.

    A checkpoint saved inside an epoch (a periodic one, or a signal's) needs two fits: the rest of its epoch, then
    the next epochs; an epoch-end checkpoint one. `skip_batches` counts the micro-batches of a data stream that
    starts at iteration 0 and runs on across epochs (the example's `dataset.skip(n)`), so a resumed run sees the
    batches the uninterrupted one would have.

    Examples:
        ```python
        meta = hvd_sched.keras.restore_latest("runs/ckpt", model)
        for part in hvd_sched.keras.resume_plan(meta, steps_per_epoch=22, epochs=8):
            model.fit(make_dataset(skip=part.skip_batches), initial_epoch=part.initial_epoch,
                      epochs=part.epochs, steps_per_epoch=part.steps_per_epoch, callbacks=callbacks)
        ```

    Args:
        meta: what `restore_latest` returned.
        steps_per_epoch: iterations (updates) per epoch, as the checkpoint was trained with.
        epochs: the epochs of the whole run.
        micro_batches: micro-batches per update (ITER_SIZE / backward_passes_per_step).

    Returns:
        A list of `FitPart` (empty where the checkpoint already ends the run).

    Raises:
        ValueError: the checkpoint was saved inside an epoch of another length or accumulation (the data and the
            schedule could not continue exactly).
    """
    steps = _validation.integer("steps_per_epoch", steps_per_epoch, low=1, label="steps_per_epoch")
    epochs = _validation.integer("epochs", epochs, low=0, label="epochs")
    k = _validation.integer("micro_batches", micro_batches, low=1, label="micro_batches")
    parts = []
    start = 0
    if meta is not None:
        step, saved_steps = meta.get("step"), meta.get("steps_per_epoch")
        if step is not None and 0 < step and (saved_steps is None or step < saved_steps):
            if (saved_steps or steps, meta.get("micro_batches", 1)) != (steps, k) or step >= steps:
                raise ValueError(
                    f"the checkpoint {meta.get('path', '')} was saved at step {step} of an epoch of {saved_steps} "
                    f"iterations of {meta.get('micro_batches', 1)} micro-batches; this run has {steps} of {k}, so "
                    "its data and schedule cannot continue exactly; resume with the same data, batch size, ranks "
                    "and ITER_SIZE (or from an epoch-end checkpoint)")
            epoch = int(meta["epoch"])
            if epoch < epochs:
                parts.append(FitPart(epoch, epoch + 1, (steps - step) * k, (epoch * steps + step) * k))
            start = epoch + 1
        else:
            start = int(meta["epoch"]) + 1
    if start < epochs:
        parts.append(FitPart(start, epochs, steps * k, start * steps * k))
    return parts


class TrainingInterrupted(SystemExit):
    """Raised on every rank by `TrainingCheckpoint` once the ranks have agreed to stop and the checkpoint is
    saved: it leaves `model.fit` and, uncaught, ends the process with status `128 + signal number` (143 for
    SIGTERM, 130 for SIGINT, 138 for SIGUSR1 on Linux), as a shell reports a process the signal ended, so
    launchers and schedulers see an unfinished job. A subclass of SystemExit: `except Exception` does not catch
    it; `except TrainingInterrupted` does.

    Attributes:
        signal: the signal's name ("SIGTERM").
        iteration: the iteration stopped at.
        path: the checkpoint saved (None where the loss was not finite and the previous checkpoint stays the
            latest).
    """

    def __init__(self, signal, iteration, path, code):
        super().__init__(code)
        self.signal, self.iteration, self.path = signal, iteration, path

    def __reduce__(self):
        return type(self), (self.signal, self.iteration, self.path, self.code)


class TrainingCheckpoint(_backend.keras.callbacks.Callback):
    """Checkpoints at epoch ends, every `period` iterations, and when the job is asked to stop by a signal.

    Rank `root_rank` writes; the others hold the same state. The saved
    state is the model's and the optimizer's variables (weights, slots, iteration): a resumed run continues the
    schedule, its momentum corrections and the accumulation exactly (`resume_plan` for the data position).

    Signals (`stop_signals`, default SIGTERM and SIGINT): the handler only records the signal. At update
    boundaries (never inside a gradient accumulation) the ranks agree with one Horovod allgather whether any
    rank received one; they do so at the same iterations, about every `agree_every` seconds (rank 0 measures the
    step time and proposes the next iteration; at least every iteration where a step is slower). When one did,
    `root_rank` saves, every rank waits for the save, and every rank raises `TrainingInterrupted` (exit status
    128 + the signal's number). Signals are handled from train begin to train end (across several fits inside
    `with checkpoint.handling_signals():`); outside, they act as they did before.

    Rank 0 writes each checkpoint into a temporary folder, fsyncs it, renames the folder into place, and only then
    replaces `latest` (write a temporary file, fsync, `os.replace`). A process killed at any moment therefore leaves
    `latest` naming a complete checkpoint; the torn temporary folder is removed at the next save.

    Layout of a checkpoint directory:

    ```text
    DIR/epoch-0003/ckpt.index, ckpt.data-*   a complete `tf.train.Checkpoint(model=, optimizer=)` at an epoch end
    DIR/iter-00000100/...                    the same, inside an epoch (a periodic or a signal's checkpoint)
    DIR/*/meta.json                          {"epoch": 4, "step": 12, "steps_per_epoch": 22, "iteration": 100, ...}
    DIR/latest                               "iter-00000100": the newest complete checkpoint
    ```

    Examples:
        ```python
        checkpoint = hvd_sched.keras.TrainingCheckpoint("runs/ckpt", period=500)
        meta = hvd_sched.keras.restore_latest("runs/ckpt", model)
        with checkpoint.handling_signals():
            for part in hvd_sched.keras.resume_plan(meta, steps_per_epoch=steps, epochs=10):
                model.fit(make_dataset(skip=part.skip_batches), initial_epoch=part.initial_epoch,
                          epochs=part.epochs, steps_per_epoch=part.steps_per_epoch,
                          callbacks=hvd_sched.keras.horovod_callbacks(checkpoint=checkpoint))
        ```

    Args:
        directory: where checkpoints go (created on rank 0).
        keep: how many complete checkpoints to keep (oldest removed first), int >= 1.
        period: also save every `period` iterations (Detectron's TRAIN.SNAPSHOT_ITERS / NUM_GPUS,
            detectron2's CHECKPOINT_PERIOD: `hvd_sched.snapshot_period(config)`); None: epoch ends only.
        stop_signals: the signals that stop the job with a checkpoint (names or numbers); () handles none.
        agree_every: seconds between two agreements (a float > 0); the stop lands within about this time plus
            one step after the signal.
        root_rank: the rank that writes.
        peer_timeout: seconds without a heartbeat from another rank after which this rank exits with status
            `PEER_LOST_STATUS` (75), naming the rank and host that stopped answering, the iteration and the newest
            checkpoint (a dead, frozen or cut-off node: docs/how-to/preemption.md, "When a node dies"), and
            writing that message to `directory/peer_lost.txt` too (srun and horovodrun exit with a status of their
            own: a job script tests that file); a slow rank keeps beating and never counts; a rank whose own
            code raised makes the others exit 1 at once, with no file (a failure, not to be requeued). None: no
            heartbeat.
            Not in elastic jobs (Horovod drops the host).
    """

    def __init__(self, directory, keep=3, period=None, stop_signals=_stop.DEFAULT_SIGNALS, agree_every=0.25,
                 root_rank=0, peer_timeout=DEFAULT_PEER_TIMEOUT):
        super().__init__()
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}")
        if period is not None:
            period = _validation.integer("period", period, low=1, label="period")
        if isinstance(agree_every, bool) or not isinstance(agree_every, (int, float)) or not agree_every > 0:
            raise ValueError(f"agree_every must be a number of seconds > 0, got {agree_every!r}")
        if isinstance(root_rank, bool) or not isinstance(root_rank, int) or root_rank < 0:
            raise ValueError(f"root_rank must be an int >= 0, got {root_rank!r}")
        if peer_timeout is not None and (isinstance(peer_timeout, bool) or not isinstance(peer_timeout, (int, float))
                                         or not 1 <= peer_timeout < float("inf")):
            raise ValueError(f"peer_timeout must be a number of seconds >= 1 (or None: no heartbeat), got "
                             f"{peer_timeout!r}")
        self.peer_timeout = None if peer_timeout is None else float(peer_timeout)
        self._watchdog = None
        self.directory = os.fspath(directory)
        self.keep, self.period, self.root_rank = keep, period, root_rank
        self.stop_signals = _stop.signal_numbers(stop_signals)
        self.agree_every = float(agree_every)
        self._requests = _stop.StopRequests(self.stop_signals)
        self._k, self._reads_count = 1, False
        self._epoch = self._epoch_start = self._epoch_count = self._step0 = self._steps = None
        self._supports_tf_logs = True  # Keras 2: no per-batch copy of the logs to numpy for this callback
        self._first_epoch = True
        self._next_agreement = self._last_agreement = None
        self._last_period = None
        if period is None and not self.stop_signals:
            # Nothing to do between batches: Keras skips batch hooks still marked as the default (a faster loop).
            self.on_train_batch_end = _backend.keras.callbacks.Callback.on_train_batch_end.__get__(self)

    # ------------------------------------------------------------------------------------------ Keras hooks

    def on_train_begin(self, logs=None):
        # Processes that each believe they are rank 0 (a launcher's N processes that Horovod did not join) would
        # all write this directory: stop them before the first step.
        _horovod.check_launcher()
        optimizer = self.model.optimizer
        calls, batches = _backend.steps_per_execution(self.model), (self.params or {}).get("steps")
        if _backend.KERAS_MAJOR == 3 and calls > 1 and batches and int(batches) % calls:
            # Keras 3 runs whole calls: an epoch of 6 batches at 4 per call runs 8 (Keras 2 runs 4 + 2).
            raise ValueError(f"hvd_sched: Keras 3 runs whole calls of steps_per_execution={calls} batches, so an "
                             f"epoch of {batches} batches runs {-(-int(batches) // calls) * calls}, and the "
                             f"checkpoints' epoch and step would not be where the data is; make the batches per "
                             f"epoch a multiple of {calls} (steps_per_epoch={int(batches) // calls * calls}) or "
                             "compile with steps_per_execution=1")
        self._k = _backend.micro_batches(optimizer)
        # Read once per epoch and counted on from Keras' batch index (a read costs ~25-50 us per batch), except
        # where a step may be skipped without counting (Keras 3's loss scaling) or Keras runs several steps per
        # call (the index of the last one differs between Keras 2 and 3): then read at each call.
        self._reads_count = _backend.skips_iterations(optimizer) or calls != 1
        self._first_epoch = True
        self._next_agreement = self._last_agreement = None
        self._requests.install()
        if self._requests.signals:
            # Every rank: the agreement's first allgather sets itself up here, not inside the first batch, where
            # Keras times the batch hooks (and would warn that on_train_batch_end is slow).
            _stop.agree(0, 1)
        if self.period is not None:
            self._last_period = iteration_count(optimizer) // self.period
        self._watch(iteration_count(optimizer))

    def on_train_end(self, logs=None):
        if self._watchdog is not None:
            self._watchdog.watching = False
        self._requests.uninstall()

    def _watch(self, iteration):
        """Start (once per process, on every rank) or resume the peers' heartbeat."""
        if self.peer_timeout is None or _horovod.size() == 1 or _horovod.is_elastic():
            return
        self._watchdog = _watchdog.shared(self.peer_timeout, self._newest,  # one heartbeat per process
                                          os.path.join(self.directory, PEER_LOST_NOTE))
        self._watchdog.iteration = iteration
        if not self._watchdog.started:
            self._watchdog.start(_horovod.rank(), _horovod.size())
        self._watchdog.watching = True

    def _newest(self):
        meta = latest_checkpoint(self.directory)
        return "none yet" if meta is None else f"{meta['path']} (iteration {meta['iteration']})"

    def on_epoch_begin(self, epoch, logs=None):
        batches = (self.params or {}).get("steps")
        offset = 0
        if self._first_epoch:
            problem, offset = resume_offset(self.model, epoch, batches)
            if problem:
                self._requests.uninstall(everything=True)
                raise ValueError(problem)
            self._first_epoch = False
        self._epoch, self._step0 = epoch, offset
        self._epoch_count = _backend.micro_batch_count(self.model.optimizer)
        self._epoch_start = self._epoch_count // self._k
        if self._watchdog is not None:
            self._watchdog.iteration = self._epoch_start
        self._steps = None if batches is None else offset + int(batches) // self._k

    def on_train_batch_end(self, batch, logs=None):
        count = (_backend.micro_batch_count(self.model.optimizer) if self._reads_count
                 else self._epoch_count + int(batch) + 1)  # Keras' batch: the index of the last one run
        if count % self._k:
            return  # inside an update: the accumulators are in no checkpoint
        iteration = count // self._k
        if self._watchdog is not None:
            self._watchdog.iteration = iteration
        if self._requests.signals and (self._next_agreement is None or iteration >= self._next_agreement):
            self._agree(iteration, logs)
        if self.period is not None and iteration // self.period > self._last_period:
            self._last_period = iteration // self.period
            step = self._step(iteration)
            if step != self._steps and _horovod.rank() == self.root_rank and _finite(logs):
                self._save(iteration, step, self._steps)

    def on_epoch_end(self, epoch, logs=None):
        # An epoch end is an update boundary on every rank: agree there too (one allgather per epoch), so a signal
        # that came during validation stops the job before the next epoch, with this epoch's checkpoint.
        received = _stop.agree(self._requests.received, 1)[0] if self._requests.signals else 0
        iteration = iteration_count(self.model.optimizer)
        path = None
        if _horovod.rank() == self.root_rank:
            if _finite(logs):
                step = self._step(iteration)
                path = self._save(iteration, step, step, signal=_stop.signal_name(received))
            else:
                print(f"hvd_sched: epoch {epoch} ended with loss {logs['loss']}; not saving it, the latest "
                      f"checkpoint stays {latest_checkpoint(self.directory)}", file=sys.stderr, flush=True)
        if received:
            self._stop_now(received, iteration, logs, saved=path)

    @contextlib.contextmanager
    def handling_signals(self):
        """Keep the stop signals handled across several `fit` calls (a resume's rest of an epoch, then the next
        epochs): between two fits a signal is then recorded, not fatal, and the next fit stops at once.

        Examples:
            ```python
            checkpoint = hvd_sched.keras.TrainingCheckpoint("runs/ckpt")
            meta = hvd_sched.keras.restore_latest("runs/ckpt", model)
            with checkpoint.handling_signals():          # a signal between two fits stops the next one at once
                for part in hvd_sched.keras.resume_plan(meta, steps_per_epoch=steps, epochs=10):
                    model.fit(make_dataset(skip=part.skip_batches), initial_epoch=part.initial_epoch,
                              epochs=part.epochs, steps_per_epoch=part.steps_per_epoch,
                              callbacks=hvd_sched.keras.horovod_callbacks(checkpoint=checkpoint))
            ```
        """
        self._requests.install()
        try:
            yield self
        finally:
            self._requests.uninstall()

    # ------------------------------------------------------------------------------------------ the work

    def save(self, epoch):
        """Write the checkpoint of the end of `epoch` and point `latest` at it.

        Args:
            epoch: the Keras epoch (0-based) that ended.

        Returns:
            The checkpoint's path.
        """
        self._epoch = epoch
        steps = self._steps or 0
        return self._save(iteration_count(self.model.optimizer), steps, steps)

    def _step(self, iteration):
        """Updates made in the current epoch after `iteration`."""
        return self._step0 + iteration - self._epoch_start

    def _save(self, iteration, step, steps, signal=None):
        meta = {"epoch": int(self._epoch), "step": int(step),
                "steps_per_epoch": None if steps is None else int(steps), "iteration": int(iteration),
                "micro_batches": self._k, "signal": signal, "time": time.time(),
                **schedule_meta(self.model.optimizer, iteration)}
        return write_checkpoint(self.directory, self.model, meta, self.keep)

    def _agree(self, iteration, logs):
        now = time.monotonic()
        proposal = 1
        if _horovod.rank() == 0 and self._last_agreement is not None:
            then, at = self._last_agreement
            if iteration > at and now > then:
                proposal = int(min(max(self.agree_every / ((now - then) / (iteration - at)), 1), 100000))
        received, interval = _stop.agree(self._requests.received, proposal)
        self._last_agreement = (now, iteration)
        self._next_agreement = iteration + max(int(interval), 1)
        if received:
            self._stop_now(received, iteration, logs)

    def _stop_now(self, number, iteration, logs, saved=None):
        name = _stop.signal_name(number)
        started = time.monotonic()
        path = saved
        if path is None and _horovod.rank() == self.root_rank and _finite(logs):
            step = self._step(iteration)
            path = self._save(iteration, step, self._steps, signal=name)
        path = _stop.share_from_root(path, self.root_rank)  # no rank leaves before the save is on disk
        seconds = time.monotonic() - started
        self._requests.uninstall(everything=True)
        self._requests.received = None  # answered: a caller that catches the stop may fit again
        code = 128 + int(number)
        if _horovod.rank() == self.root_rank:
            where = (f"saved {path} in {seconds:.2f} s" if path else
                     f"the loss is not finite: not saved, the latest checkpoint stays "
                     f"{latest_checkpoint(self.directory)}")
            print(f"hvd_sched: {name}: every rank stopped at iteration {iteration} (step {self._step(iteration)} "
                  f"of epoch {self._epoch}); {where}; exiting with status {code}", file=sys.stderr, flush=True)
        self.model.stop_training = True
        if self._watchdog is not None:
            self._watchdog.watching = False
        raise TrainingInterrupted(name, iteration, path, code)


def _finite(logs):
    loss = (logs or {}).get("loss")
    return loss is None or bool(np.isfinite(float(loss)))


class EpochCheckpoint(TrainingCheckpoint):
    """`TrainingCheckpoint` at epoch ends only, handling no signal unless asked (the form of earlier releases).

    Training state is the optimizer's iteration counter and slots, so a restored model continues the schedule
    exactly. An epoch whose loss is NaN/Inf is not saved: the latest checkpoint stays the last good one.

    Examples:
        ```python
        meta = hvd_sched.keras.restore_latest("runs/ckpt", model)
        start = 0 if meta is None else meta["epoch"] + 1
        model.fit(x, y, initial_epoch=start, epochs=10,
                  callbacks=horovod_callbacks() + [EpochCheckpoint("runs/ckpt")])
        ```

    Args:
        directory: where checkpoints go (created on rank 0).
        keep: how many complete checkpoints to keep (oldest removed first).
        root_rank: the rank that writes.
        period: as `TrainingCheckpoint` (default: None, epoch ends only).
        stop_signals: as `TrainingCheckpoint` (default: `()`, no signal handled).
        agree_every: as `TrainingCheckpoint` (default 0.25).
        peer_timeout: as `TrainingCheckpoint` (default 60 s).
    """

    def __init__(self, directory, keep=3, root_rank=0, period=None, stop_signals=(), agree_every=0.25,
                 peer_timeout=DEFAULT_PEER_TIMEOUT):
        super().__init__(directory, keep=keep, period=period, stop_signals=stop_signals, agree_every=agree_every,
                         root_rank=root_rank, peer_timeout=peer_timeout)
