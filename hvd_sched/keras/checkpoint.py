"""Per-epoch checkpoints that a killed process cannot tear, restoring the latest on every rank, and `load_model`
(Horovod's `hvd.load_model`: a saved model back with its optimizer distributed).

Layout of a checkpoint directory:

    DIR/epoch-0003/ckpt.index, ckpt.data-*   a complete `tf.train.Checkpoint(model=, optimizer=)`
    DIR/epoch-0003/meta.json                 {"epoch": 3, "iteration": 120, ...}
    DIR/latest                               "epoch-0003": the newest complete checkpoint

Rank 0 writes each checkpoint into a temporary folder, fsyncs it, renames the folder into place, and only then
replaces `latest` (write a temporary file, fsync, `os.replace`). A process killed at any moment therefore leaves
`latest` naming a complete checkpoint; the torn temporary folder is removed at the next save.
"""

import json
import os
import shutil
import sys
import time

import numpy as np
import tensorflow as tf

from . import _backend, _horovod
from ._tracking import iteration_count
from .distributed import DistributedOptimizer
from .optimizer import custom_objects as scheduled_objects
from .optimizer import scheduled_class, scheduled_of

__all__ = ["EpochCheckpoint", "latest_checkpoint", "restore_latest", "load_model"]

_LATEST = "latest"
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
    """The metadata of the newest complete checkpoint in `directory` (with its "path"), or None."""
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


def restore_latest(directory, model, optimizer=None):
    """Restore the newest complete checkpoint of `directory` into `model` (and its optimizer) on every rank.

    Every rank reads the checkpoint (a shared or copied directory); under Horovod rank 0's metadata and then
    its variables are broadcast as well, so ranks that could not read it, or read a different one, agree.
    Continue with `model.fit(..., initial_epoch=meta["epoch"] + 1)`.

    Args:
        directory: the EpochCheckpoint directory.
        model: the compiled model to restore into.
        optimizer: default `model.optimizer`.

    Returns:
        The checkpoint's metadata dict ("epoch", "iteration", "path", ...), or None if there is none yet.
    """
    _horovod.check_launcher(require_init=False)
    optimizer = optimizer or model.optimizer
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
    return meta


def _initialized_horovod():
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return None
    return hvd if hvd.is_initialized() else None


class EpochCheckpoint(_backend.keras.callbacks.Callback):
    """At each epoch end, rank 0 writes model + optimizer state atomically (see the module docstring).

    Training state is the optimizer's iteration counter and slots, so a restored model continues the schedule
    exactly. An epoch whose loss is NaN/Inf is not saved: the latest checkpoint stays the last good one.

    Example:
        >>> meta = hvd_sched.keras.restore_latest("runs/ckpt", model)
        >>> start = 0 if meta is None else meta["epoch"] + 1
        >>> model.fit(x, y, initial_epoch=start, epochs=10,
        ...           callbacks=horovod_callbacks() + [EpochCheckpoint("runs/ckpt")])

    Args:
        directory: where checkpoints go (created on rank 0).
        keep: how many complete checkpoints to keep (oldest removed first).
        root_rank: the rank that writes.
    """

    def __init__(self, directory, keep=3, root_rank=0):
        super().__init__()
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}")
        self.directory = os.fspath(directory)
        self.keep = keep
        self.root_rank = root_rank

    def on_train_begin(self, logs=None):
        # Processes that each believe they are rank 0 (a launcher's N processes that Horovod did not join) would
        # all write this directory: stop them before the first step.
        _horovod.check_launcher()

    def on_epoch_end(self, epoch, logs=None):
        if _horovod.rank() != self.root_rank:
            return
        loss = (logs or {}).get("loss")
        if loss is not None and not np.isfinite(loss):
            print(f"hvd_sched: epoch {epoch} ended with loss {loss}; not saving it, the latest checkpoint stays "
                  f"{latest_checkpoint(self.directory)}", file=sys.stderr, flush=True)
            return
        self.save(epoch)

    def save(self, epoch):
        """Write the checkpoint of `epoch` and point `latest` at it; returns its path."""
        os.makedirs(self.directory, exist_ok=True)
        self._remove_torn()
        name = f"epoch-{epoch:04d}"
        final = os.path.join(self.directory, name)
        tmp = os.path.join(self.directory, f".tmp-{name}-{os.getpid()}")
        os.makedirs(tmp)
        optimizer = self.model.optimizer
        tf.train.Checkpoint(model=self.model, optimizer=optimizer).write(os.path.join(tmp, _PREFIX))
        meta = {"epoch": int(epoch), "iteration": iteration_count(optimizer),
                "time": time.time()}
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f)
        _fsync_tree(tmp)
        if os.path.exists(final):  # re-running an epoch after a resume
            shutil.rmtree(final)
        os.rename(tmp, final)
        pointer_tmp = os.path.join(self.directory, f".{_LATEST}.tmp")
        with open(pointer_tmp, "w") as f:
            f.write(name)
            f.flush()
            os.fsync(f.fileno())
        os.replace(pointer_tmp, os.path.join(self.directory, _LATEST))
        _fsync_dir(self.directory)
        self._remove_old(name)
        return final

    def _remove_torn(self):
        for entry in os.listdir(self.directory):
            if entry.startswith(".tmp-"):
                shutil.rmtree(os.path.join(self.directory, entry), ignore_errors=True)

    def _remove_old(self, newest):
        complete = sorted(e for e in os.listdir(self.directory) if e.startswith("epoch-") and e <= newest)
        for entry in complete[:-self.keep]:
            shutil.rmtree(os.path.join(self.directory, entry), ignore_errors=True)


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=None, legacy_opts=False,
               **kwargs):
    """Horovod's `hvd.load_model`: a saved model back, its optimizer wrapped in `DistributedOptimizer`.

    The optimizer the model was saved with (a ScheduledOptimizer, distributed or not, or a plain one) comes back
    as `hvd_sched.keras.DistributedOptimizer(<it>, compression=compression)`, with its schedule, options, slots
    and iteration, so a resumed multi-rank job goes on where it stopped. Works for what `model.save` writes where
    Keras saves the optimizer: `.keras` (Keras 2 and 3), `.h5` and a SavedModel directory (Keras 2; its optimizer
    state is read back from the SavedModel's checkpoint, which Keras 2's loader leaves unread). Keras 3's `.h5`
    loader drops the optimizer's slots: refused there. Keras 2 records Horovod's
    module for the class of a distributed optimizer, so plain `tf.keras.models.load_model` cannot find it; and
    Horovod's own `hvd.load_model` fails on the `.keras` format (its factories have no `from_config`) and does not
    know the scheduled classes. Horovod is initialised here if it is not yet (`hvd.init()`). To load without
    Horovod: `tf.keras.models.load_model(path, custom_objects=hvd_sched.keras.custom_objects())`.

    Example:
        >>> hvd.init()
        >>> model = hvd_sched.keras.load_model("runs/model.keras")   # every rank
        >>> model.fit(x, y, initial_epoch=2, epochs=3, callbacks=hvd_sched.keras.horovod_callbacks())

    Args:
        filepath: the `.keras` / `.h5` file or SavedModel directory.
        custom_optimizers: optimizer classes of your own the model may have been saved with (their scheduled
            classes are found too), as Horovod's argument.
        custom_objects: name -> class or function for the model's own layers, losses, ...; they take precedence.
        compression: Horovod's gradient compression for the DistributedOptimizer (None: `Compression.none`).
        legacy_opts: Horovod's flag for Keras 2's legacy optimizers; accepted for its signature (the optimizer is
            wrapped whatever its family). Keras 3 has no legacy optimizers: True is a ValueError there.
        **kwargs: passed to Keras' `load_model` (`compile`, `safe_mode`, `options`, ...).

    Returns:
        The model; compiled with the distributed optimizer where it was saved with an optimizer.

    Raises:
        TypeError: a `custom_optimizers` entry is not an optimizer class.
        ValueError: `legacy_opts=True` or an `.h5` file on Keras 3; the loaded optimizer's state does not fit the
            distributed one.
    """
    if legacy_opts and _backend.KERAS_MAJOR == 3:
        raise ValueError("legacy_opts=True: Keras 3 has no legacy optimizers (tf.keras.optimizers.legacy); "
                         "leave legacy_opts out")
    objects = {}
    for cls in custom_optimizers or ():
        if not (isinstance(cls, type) and issubclass(cls, _backend.OPTIMIZER_TYPES)):
            raise TypeError(f"custom_optimizers must list optimizer classes (e.g. [MyOptimizer]), got {cls!r}")
        objects[cls.__name__] = cls
        scheduled = scheduled_class(cls)
        objects[scheduled.__name__] = scheduled
    objects.update(scheduled_objects())
    objects.update(custom_objects or {})
    path = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else None
    if _backend.KERAS_MAJOR == 3 and path is not None and path.endswith((".h5", ".hdf5")):
        raise ValueError(f"hvd_sched.keras.load_model({path!r}): Keras 3 does not restore an optimizer from .h5 "
                         "(its legacy loader builds the optimizer for none of the model's variables, so the slots "
                         "are dropped), and a resumed job would start from fresh slots; save with "
                         "model.save('model.keras'), or load the weights alone with keras.models.load_model")
    import horovod.tensorflow as hvd

    if not hvd.is_initialized():
        hvd.init()
    model = _backend.keras.models.load_model(filepath, custom_objects=objects, **kwargs)
    optimizer = getattr(model, "optimizer", None)
    if not _backend.is_optimizer(optimizer) or _backend.is_distributed(optimizer):
        return model
    if _backend.KERAS_MAJOR == 2 and path is not None and tf.saved_model.contains_saved_model(path):
        # Keras 2 compiles a fresh optimizer when it loads a SavedModel: the saved iteration and slots sit in the
        # SavedModel's checkpoint (the model is its root), which Keras does not read back. Read them from there.
        _backend.build_slots(optimizer, model.trainable_variables)
        tf.train.Checkpoint(root=model).read(os.path.join(path, "variables", "variables")).expect_partial()
    model.optimizer = _distributed_copy(optimizer, model.trainable_variables, compression)
    return model


def _distributed_copy(optimizer, variables, compression):
    """`DistributedOptimizer(optimizer)` (a new instance, as Horovod's), built and given `optimizer`'s state."""
    _backend.build_slots(optimizer, variables)  # a no-op where the loader built it (.keras, .h5)
    options = {} if compression is None else {"compression": compression}
    distributed = DistributedOptimizer(optimizer, **options)
    _backend.build_slots(distributed, variables)
    source, target = _backend.optimizer_variables(optimizer), _backend.optimizer_variables(distributed)
    if len(source) != len(target) or any(tuple(a.shape) != tuple(b.shape) for a, b in zip(source, target)):
        raise ValueError(f"hvd_sched.keras.load_model: the loaded optimizer {type(optimizer).__name__} has "
                         f"{len(source)} variables and its distributed copy {len(target)} (shapes differ); load "
                         "the model with tf.keras.models.load_model and wrap its optimizer yourself")
    for a, b in zip(source, target):
        b.assign(a)
    scheduled, copy = scheduled_of(optimizer), scheduled_of(distributed)
    if scheduled is not None and copy is not None:
        copy.copy_schedule_state(scheduled)
    return distributed
