"""The global iteration of each batch, for the callbacks, without reading the device every batch.

An iteration is one optimizer update (Detectron's ITER). With gradient accumulation a batch is a micro-batch:
Horovod's `backward_passes_per_step` (Keras 2) and Keras 3's `gradient_accumulation_steps` both count
micro-batches (Keras 2's `iterations`, Keras 3's `_iterations`), k of them per update, so the iteration of
micro-batch m is m // k.
"""

import weakref

from . import _backend

__all__ = ["IterationTracker", "iteration_count", "epoch_problem", "note_restored", "resume_offset"]

# model -> {"meta": the mid-epoch checkpoint it was restored from, "matched": whether a fit has started its rest}
_RESUMED = weakref.WeakKeyDictionary()


def iteration_count(optimizer):
    """The iteration of `optimizer` (as compiled: distributed, loss-scaled or not): the updates it has made.

    Detectron's iteration: one optimizer update. Under gradient accumulation Keras 2's `optimizer.iterations`
    counts micro-batches (Horovod's helper advances it on each) and Keras 3's counts updates; this is the updates
    on both (micro-batches // micro-batches per update).

    Args:
        optimizer: the model's optimizer, as compiled (`model.optimizer`).

    Returns:
        The number of updates made, an int.
    """
    return _backend.micro_batch_count(optimizer) // _backend.micro_batches(optimizer)


def epoch_problem(model, steps):
    """Why epochs of `steps` batches cannot be trained exactly with the model's accumulation, or None.

    An epoch must end on an update: Horovod's accumulators (Keras 2) are not in a checkpoint, and an
    epoch-end checkpoint, resume or LR log would otherwise fall inside an update.
    """
    k = _backend.micro_batches(model.optimizer)
    if k > 1 and steps is not None and int(steps) % k:
        return (f"hvd_sched: an epoch of {steps} batches does not end on an update of {k} micro-batches "
                f"(gradient accumulation: ITER_SIZE / backward_passes_per_step / gradient_accumulation_steps); "
                f"make the batches per epoch a multiple of {k} (steps_per_epoch={int(steps) // k * k}, or drop "
                "the remainder of the data set)")
    return None


def note_restored(model, meta):
    """Remember that `model` was restored from `meta`; only a checkpoint saved inside an epoch matters here."""
    _RESUMED.pop(model, None)
    if meta is not None and meta.get("step") and meta.get("steps_per_epoch") and \
            0 < int(meta["step"]) < int(meta["steps_per_epoch"]):
        _RESUMED[model] = {"meta": meta, "matched": False}


def resume_offset(model, epoch, batches):
    """(problem or None, updates of `epoch` already made) for a fit whose first epoch is `epoch`, of `batches`
    batches, on a model that `restore_latest` may have restored from inside an epoch.

    That fit must be the rest of the saved epoch: the saved epoch, with exactly its remaining batches; any other
    would run the schedule and the data out of step with the iteration (silently wrong), so it is a problem.
    """
    entry = _RESUMED.get(model)
    if entry is None:
        return None, 0
    meta = entry["meta"]
    saved_epoch, step, steps = int(meta["epoch"]), int(meta["step"]), int(meta["steps_per_epoch"])
    k = int(meta.get("micro_batches", 1))
    remaining = (steps - step) * k
    if epoch == saved_epoch and (batches is None or int(batches) == remaining):
        entry["matched"] = True
        return None, step
    if entry["matched"] and epoch > saved_epoch:
        _RESUMED.pop(model, None)
        return None, 0
    return (f"hvd_sched: the model was restored from {meta.get('path', 'a checkpoint')}, saved at step {step} of "
            f"{steps} in epoch {saved_epoch} (iteration {meta['iteration']}), but this fit starts epoch {epoch} "
            f"with {batches} batches per epoch: the schedule and the data would run out of step with the "
            f"iteration. Fit the rest of epoch {saved_epoch} first (initial_epoch={saved_epoch}, "
            f"epochs={saved_epoch + 1}, steps_per_epoch={remaining}, the data skipped by "
            f"{(saved_epoch * steps + step) * k} batches), then the next epochs: "
            f"hvd_sched.keras.resume_plan(meta, steps_per_epoch={steps}, epochs=...) gives each fit's arguments"), 0


class IterationTracker(_backend.keras.callbacks.Callback):
    """Knows the global iteration of each batch: (micro-batches run before the epoch + batch index) // k.

    Where a skipped step does not count (Keras 3's LossScaleOptimizer skips steps with non-finite gradients
    without advancing `iterations`; never with accumulation, which hvd_sched refuses there), the batch index runs
    ahead of the schedule, and the iteration is read from the optimizer instead: at batch begin the one the step
    will run at, at batch end the last applied one.
    """

    def __init__(self):
        super().__init__()
        self._epoch_start = 0  # micro-batches run before this epoch (updates where k = 1)
        self._micro_batches = 1

    def _read_iterations(self):
        """The updates made so far."""
        return iteration_count(self.model.optimizer)

    def on_epoch_begin(self, epoch, logs=None):
        self._micro_batches = _backend.micro_batches(self.model.optimizer)
        self._epoch_start = _backend.micro_batch_count(self.model.optimizer)

    def _first_iteration(self):
        """The first update that starts in this epoch."""
        return -(-self._epoch_start // self._micro_batches)

    def _iteration(self, batch):
        """The iteration of the step `batch` ran (at batch end: the last applied one)."""
        if _backend.skips_iterations(self.model.optimizer):
            return max(self._read_iterations() - 1, 0)
        return (self._epoch_start + int(batch)) // self._micro_batches

    def _iteration_begin(self, batch):
        """The iteration the step of `batch` is about to run."""
        if _backend.skips_iterations(self.model.optimizer):
            return self._read_iterations()
        return (self._epoch_start + int(batch)) // self._micro_batches
