"""`ScheduledOptimizer`: Detectron's solver inside a Keras optimizer, composable with `DistributedOptimizer`.

Like Horovod's `DistributedOptimizer`, `ScheduledOptimizer(opt, schedule)` returns an instance of a subclass of
`type(opt)` rebuilt from `opt.get_config()` (Keras 2 and Keras 3 alike; the per-version half lives in
`_keras2` / `_keras3`, the rest in `_scheduled.ScheduledBase`). The subclass

- sets the learning rate to `ScheduleLR(schedule)`: the LR at `optimizer.iterations`, computed in the training
  graph from the schedule's segments with the same float operations as `schedule.lr_at` (no table, no Python per
  batch), once per step by Keras;
- before the update of a step whose LR jumped (Detectron's `_SetNewLr` rule, or every change, or never),
  multiplies every momentum slot by new_lr/old_lr inside the same compiled step. Keras' SGD slot is
  m = mu*m - lr*g, the negative of Detectron's V = mu*V + lr*g, so the same factor applies (also for Nesterov,
  whose update reads the same slot). For SGD the step's momentum x factor (the momentum itself on steps without
  a correction) is assigned once per step to a variable that each variable's update reads in place of the
  momentum: no `tf.cond`, no extra pass over the slots, and it works inside the per-variable XLA update Keras 2
  compiles on a GPU. Other optimizers with slots (Keras 2's legacy SGD) rescale behind a `tf.cond`;
- applies `lr_multipliers` (variable-name regex -> factor): matching variables use lr * factor, as the seed's
  lr_x = lr * LR_FACTOR (Detectron's own convention gives biases 2x the LR);
- applies `weight_decays` (variable-name regex -> decay): coupled L2, `grad += decay * w` before the update, as
  Caffe2's `WeightedSum([grad, ONE, param, WD], grad)` ahead of `MomentumSGDUpdate` (`hvd_sched.keras.
  build_optimizer` derives both rule sets from a model's layers, Detectron's way);
- serializes every option in `get_config()`, so `DistributedOptimizer`'s `from_config` rebuild, `model.save` and
  `load_model` keep the schedule.

Wrap in this order: `DistributedOptimizer(ScheduledOptimizer(SGD(...), schedule))`; the gradients are averaged
first and this class's update runs on the averaged gradients.

What users see (the one owner of the LR, serialization, the optimizers it wraps) is `ScheduledOptimizer`'s
docstring.
"""

import sys

from . import _backend, _slots
from ._scheduled import BOTH_DECAYS, NO_LEARNING_RATE, ScheduledBase, lr_conflict
from ._tables import as_schedule

__all__ = ["ScheduledOptimizer", "is_scheduled", "scheduled_of", "scheduled_class", "custom_objects"]


_CLASSES = {}


def scheduled_class(base):
    """The scheduled subclass of a Keras optimizer class (one per class, registered for `load_model`).

    Args:
        base: a Keras optimizer class, e.g. `tf.keras.optimizers.SGD`.

    Returns:
        The class `Scheduled<Name>` (`ScheduledOptimizer` builds its instances); a scheduled class itself.
    """
    if base in _CLASSES:
        return _CLASSES[base]
    if issubclass(base, ScheduledBase):
        return base
    mixin, legacy_named = _backend.scheduled_mixin(base)
    name = "Scheduled" + ("Legacy" if legacy_named else "") + base.__name__
    cls = type(name, (mixin, ScheduledBase, base), {
        "__module__": __name__,
        "__doc__": f"{base.__name__} following an hvd_sched schedule; see hvd_sched.keras.ScheduledOptimizer.",
    })
    _CLASSES[base] = cls
    setattr(sys.modules[__name__], name, cls)  # Keras can also find it by module + class name
    # Registered as "hvd_sched>ScheduledSGD", not under the plain name: Horovod's subclass keeps the plain name,
    # and a global registration of it would shadow the custom_objects `hvd.load_model` passes, silently loading
    # a model without its DistributedOptimizer. `hvd_sched.keras.load_model` picks the right one.
    _backend.register(cls)
    twin = _backend.legacy_twin(base)
    if twin is not None:
        # Keras 2's convert_to_legacy_optimizer(<ScheduledAdam>) rebuilds the optimizer from its config under the
        # lower-cased class name ("scheduledadam") among the legacy optimizers: that name is the scheduled legacy
        # class, so the conversion keeps the schedule and every option.
        _backend.register_name(name.lower(), scheduled_class(twin))
    return cls


def ScheduledOptimizer(optimizer, schedule, *, momentum_correction=None, correction_threshold=None,
                       lr_multipliers=None, weight_decays=None, log_corrections=True):
    """Wrap a Keras optimizer so it follows `schedule` in-graph, with Detectron's momentum correction.

    The LR at step `it` is `schedule.lr_at(it)`; on the iterations of `schedule.momentum_corrections` the
    momentum slots are multiplied by new_lr/old_lr before that step's update (Goyal et al. 2017, sec. 2.1;
    Detectron `SOLVER.SCALE_MOMENTUM`). The optimizer's own learning_rate is replaced by the schedule, computed in
    the compiled step; the slots are rescaled in the same step.

    Works with `SGD` (with and without `nesterov`), Keras 2's `optimizers.legacy.SGD`, and every other Keras
    optimizer (LR only). Any Keras optimizer class can be wrapped, also one of your own whose `__init__` takes
    no `learning_rate` (it is built as it is and its LR replaced by the schedule), as long as it has a learning
    rate its update reads (a class without one is a TypeError saying what it needs).

    The schedule is the one owner of the LR. Reading it outside the compiled step (`opt.learning_rate`, `opt.lr`,
    `backend.get_value(opt.lr)`, `float(...)`) gives `schedule.lr_at(iteration)` of the next step on every Keras;
    every write (`opt.lr = x`, `opt.learning_rate = x`, `backend.set_value(opt.lr, x)`, `opt.learning_rate.assign(x)`,
    so also Keras' `LearningRateScheduler` and `ReduceLROnPlateau` and Horovod's `LearningRateWarmupCallback` and
    `LearningRateScheduleCallback`) raises a TypeError at the write that names the caller and what to put in the
    SOLVER config instead. ReduceLROnPlateau is refused rather than applied as a factor on the schedule: the LR is a
    function of the iteration alone, which is what makes resume, elastic resets and rank agreement exact with no
    further state; a plateau factor would be state of its own (checkpointed, broadcast, logged), and Detectron has
    none.

    Serializes fully: every option is in `get_config()`, so `DistributedOptimizer`'s rebuild, `model.save` +
    `load_model`, `tf.train.Checkpoint` and Keras 2's `convert_to_legacy_optimizer` keep it; on Keras 3
    `set_weights` takes a plain optimizer's weights (its LR weight left out).

    Examples:
        ```python
        import hvd_sched, hvd_sched.keras, horovod.tensorflow.keras as hvd
        hvd.init()
        schedule = hvd_sched.from_detectron("examples/configs/digits_warmup_steps.yaml", world_size=hvd.size(),
                                            steps_per_epoch=steps_per_epoch)
        opt = hvd_sched.keras.DistributedOptimizer(
            hvd_sched.keras.ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule,
                                               lr_multipliers={"bias": 2.0}))
        model.compile(opt, "sparse_categorical_crossentropy")
        model.fit(x, y, callbacks=hvd_sched.keras.horovod_callbacks())
        ```

    Args:
        optimizer: a Keras optimizer (`tf.keras.optimizers.*`, or Keras 2's `tf.keras.optimizers.legacy.*`), not
            yet distributed nor inside a LossScaleOptimizer (mixed precision wraps the scheduled one).
        schedule: an `hvd_sched.Schedule` (or its `get_config()` dict).
        momentum_correction: None (follow the schedule's SCALE_MOMENTUM / SCALE_MOMENTUM_MODE for SGD with
            momentum; a documented no-op for optimizers whose slots hold no LR, such as Adam), "threshold",
            "every_change", "off", or a bool. Asking for it on Adam and friends is a ValueError.
        correction_threshold: overrides the schedule's SCALE_MOMENTUM_THRESHOLD (>= 1).
        lr_multipliers: dict of variable-name regex -> factor; a variable uses lr * factor of the first pattern
            that `re.search`es its name (e.g. `{"bias": 2.0}`); a pattern that matches no variable fails before
            the first step. Names are Keras 2's `variable.name` (`dense/bias:0`) or Keras 3's `variable.path`
            (`sequential/dense/bias`).
        weight_decays: dict of variable-name regex -> decay >= 0, read like `lr_multipliers` (first match wins,
            unmatched variables get 0, every pattern must match some variable): coupled L2, the update of
            SGD with momentum mu is V = mu*V + lr*factor*(g + decay*w); w -= V (Detectron's
            `WeightedSum([grad, ONE, param, WD])` before `MomentumSGDUpdate`; the LR multiplier scales the
            decay term too, as Caffe2's WeightDecayBuilder, which rewrites the gradient before the optimizer
            and its LR). E.g. `{"bias": 0.0, "": 1e-4}`. Not the optimizer's own `weight_decay=` (decoupled,
            Loshchilov & Hutter; combining both is an error). `build_optimizer(solver, model)` writes both rule
            sets from a model's layers.
        log_corrections: `LearningRateLogger` (in `horovod_callbacks`) prints one line on rank 0 at each
            correction (iteration, old LR, new LR, factor); the compiled step itself prints nothing.

    Returns:
        A new optimizer of class `Scheduled<Name>`, a subclass of `type(optimizer)`.

    Raises:
        TypeError: `optimizer` is not a Keras optimizer, has no learning rate, or `schedule` is not a schedule.
        ValueError: the optimizer is already distributed, loss-scaled or scheduled, its learning_rate is itself a
            schedule or callable (which the schedule would replace), or an option is invalid.
    """
    if is_scheduled(optimizer):
        raise ValueError("this optimizer is already a ScheduledOptimizer; wrap the plain optimizer once")
    if not _backend.is_optimizer(optimizer):
        raise TypeError(f"ScheduledOptimizer wraps a tf.keras optimizer such as tf.keras.optimizers.SGD("
                        f"momentum=0.9), got {type(optimizer).__name__}: {optimizer!r}")
    if _backend.unwrap(optimizer) is not optimizer:
        raise ValueError("wrap in the other order: LossScaleOptimizer(ScheduledOptimizer(opt, schedule)) (or let "
                         "model.compile wrap it under the mixed_float16 policy); a LossScaleOptimizer cannot be "
                         "scheduled from the outside")
    if _backend.is_horovod_keras_wrapped(optimizer) or _backend.is_distributed(optimizer):
        raise ValueError("wrap in the other order: hvd_sched.keras.DistributedOptimizer(ScheduledOptimizer(opt, "
                         "schedule)); the distributed optimizer's class cannot be subclassed again")
    if _backend.learning_rate_of(optimizer) is None:
        raise TypeError(NO_LEARNING_RATE.format(cls=type(optimizer).__name__))
    conflict = lr_conflict(optimizer)
    if conflict:
        raise ValueError(f"hvd_sched: {conflict}")
    schedule = as_schedule(schedule)
    _slots.resolve_correction_mode(optimizer, schedule, momentum_correction)  # errors name the user's class
    config = optimizer.get_config()
    if weight_decays and config.get("weight_decay"):
        raise ValueError(BOTH_DECAYS.format(cls=type(optimizer).__name__, wd=config["weight_decay"]))
    config.update(schedule=schedule, momentum_correction=momentum_correction,
                  correction_threshold=correction_threshold, lr_multipliers=lr_multipliers,
                  weight_decays=weight_decays, log_corrections=log_corrections)
    return scheduled_class(type(optimizer)).from_config(config)


def is_scheduled(optimizer):
    """True when `optimizer` (possibly Horovod-wrapped, possibly inside a LossScaleOptimizer) is scheduled.

    Args:
        optimizer: any optimizer, e.g. `model.optimizer`.

    Returns:
        A bool: `scheduled_of(optimizer) is not None`.
    """
    return scheduled_of(optimizer) is not None


def scheduled_of(optimizer):
    """The ScheduledOptimizer that does the updates of `optimizer`, seen through its wrappers, or None.

    The wrappers: Horovod's or `DistributedOptimizer`, and a LossScaleOptimizer (mixed precision wraps the
    compiled optimizer in one).

    Args:
        optimizer: any optimizer, e.g. `model.optimizer`.

    Returns:
        The scheduled optimizer (its `schedule`, `lr_at`, ...), or None.
    """
    inner = _backend.unwrap(optimizer)
    return inner if isinstance(inner, ScheduledBase) else None


def custom_objects():
    """Every scheduled class by its plain name, for `tf.keras.models.load_model(..., custom_objects=...)`.

    Examples:
        Loading without Horovod (with Horovod: `hvd_sched.keras.load_model`):

        ```python
        model = tf.keras.models.load_model("runs/model.keras", custom_objects=hvd_sched.keras.custom_objects())
        ```
    """
    return {cls.__name__: cls for cls in _CLASSES.values()}


for _base in _backend.BUILTIN_OPTIMIZERS:
    scheduled_class(_base)
del _base
