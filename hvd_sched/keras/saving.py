"""`load_model`: Horovod's `hvd.load_model`, a saved model back with its optimizer distributed."""

import os

import tensorflow as tf

from .. import _compat
from . import _backend
from .distributed import DistributedOptimizer
from .optimizer import custom_objects as scheduled_objects
from .optimizer import scheduled_class, scheduled_of

__all__ = ["load_model"]


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
    know the scheduled classes. Horovod is initialised here if it is not yet (`hvd.init()`). Where Horovod is not
    installed (one process off the cluster: fine-tuning, evaluation), the optimizer comes back as it was saved, with
    its schedule, slots and iteration, and no DistributedOptimizer around it. To load where hvd_sched is not
    installed either: `tf.keras.models.load_model(path, custom_objects=hvd_sched.keras.custom_objects())`.

    Examples:
        ```python
        hvd.init()
        model = hvd_sched.keras.load_model("runs/model.keras")   # every rank
        model.fit(x, y, initial_epoch=2, epochs=3, callbacks=hvd_sched.keras.horovod_callbacks())
        ```

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
    if _compat.HOROVOD:
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
    if not _compat.HOROVOD:
        # One process without Horovod (fine-tuning or evaluating off the cluster): the optimizer as saved, its
        # schedule, iteration and slots, with nothing to average.
        _backend.build_slots(optimizer, model.trainable_variables)
        return model
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
