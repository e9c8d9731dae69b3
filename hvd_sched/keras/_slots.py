"""What the Keras glue needs to know about an optimizer: its family, its momentum slots, the Horovod rank.

Only SGD with momentum keeps a buffer that carries the learning rate inside it (Keras: m = mu*m - lr*g, the
negative of Detectron's V = mu*V + lr*g), so only there does rescaling the slots by new_lr/old_lr mean anything.
"""

import tensorflow as tf

from ..momentum import MODES

__all__ = ["is_legacy", "slots_carry_lr", "build_slots", "momentum_slots", "all_momentum_slots", "resolve_correction_mode",
           "rank", "is_horovod_wrapped"]

_NEW_SGD = tf.keras.optimizers.SGD
_LEGACY_SGD = tf.keras.optimizers.legacy.SGD
_LEGACY_BASE = tf.keras.optimizers.legacy.Optimizer


def is_legacy(optimizer):
    """True for `tf.keras.optimizers.legacy.*` (OptimizerV2), False for the TF 2.11+ optimizers."""
    return isinstance(optimizer, _LEGACY_BASE)


def is_horovod_wrapped(optimizer):
    """True for the dynamic class `hvd.DistributedOptimizer` returns."""
    return type(optimizer).__module__.startswith("horovod.") or hasattr(optimizer, "_allreduce_grads")


def _momentum_value(optimizer):
    if is_legacy(optimizer):
        # OptimizerV2 SGD decides at construction whether it creates "momentum" slots.
        return 1.0 if getattr(optimizer, "_momentum", False) else 0.0
    momentum = optimizer.momentum
    return float(momentum) if isinstance(momentum, (int, float)) else 1.0


def slots_carry_lr(optimizer):
    """True when the optimizer's slots accumulate lr * grad (SGD with momentum > 0)."""
    return isinstance(optimizer, (_NEW_SGD, _LEGACY_SGD)) and _momentum_value(optimizer) > 0


def resolve_correction_mode(optimizer, schedule, momentum_correction):
    """The correction mode to use for this optimizer, or a ValueError saying what to change.

    None follows the schedule (SCALE_MOMENTUM / SCALE_MOMENTUM_MODE) where the slots carry the LR, and is a
    documented no-op elsewhere (Adam and friends normalise the gradient; their slots hold no LR). An explicit
    "threshold" or "every_change" on such an optimizer is an error rather than a silent no-op.
    """
    carries = slots_carry_lr(optimizer)
    if momentum_correction is None:
        return schedule.correction_mode if carries else "off"
    if isinstance(momentum_correction, bool):
        momentum_correction = (schedule.scale_momentum_mode if momentum_correction else "off")
    if momentum_correction not in MODES:
        raise ValueError(f"momentum_correction must be None, a bool or one of {MODES}, got {momentum_correction!r}")
    if momentum_correction != "off" and not carries:
        raise ValueError(
            f"momentum_correction={momentum_correction!r} rescales SGD momentum slots by new_lr/old_lr, but "
            f"{type(optimizer).__name__} (momentum={getattr(optimizer, 'momentum', None)!r}) has no slots that "
            "carry the learning rate; use tf.keras.optimizers.SGD(momentum=0.9) or pass momentum_correction='off'")
    return momentum_correction


def momentum_slots(optimizer, variables):
    """The momentum slot of each variable (same order), creating none; [] when there are none yet."""
    if is_legacy(optimizer):
        slots = []
        for var in variables:
            try:
                slots.append(optimizer.get_slot(var, "momentum"))
            except KeyError:
                continue
        return slots
    momentums = getattr(optimizer, "momentums", None)
    index = getattr(optimizer, "_index_dict", None)
    if not momentums or index is None:
        return []
    return [momentums[index[optimizer._var_key(var)]] for var in variables if optimizer._var_key(var) in index]


def build_slots(optimizer, variables, name=None):
    """Create the optimizer's slots for `variables` now (idempotent), as its first apply_gradients would.

    The name scope matches the one Keras opens there, so slot names do not depend on who built them first.
    """
    scope = name or (optimizer._name if is_legacy(optimizer) else optimizer.name) or "optimizer"
    with tf.name_scope(scope):
        with tf.init_scope():
            if is_legacy(optimizer):
                optimizer._create_all_weights(variables)
            else:
                optimizer.build(variables)


def all_momentum_slots(optimizer):
    """Every momentum slot a built optimizer has (none before its first step)."""
    if is_legacy(optimizer):
        return [slots["momentum"] for slots in optimizer._slots.values() if "momentum" in slots]
    return list(getattr(optimizer, "momentums", None) or [])


def rank():
    """This process's Horovod rank, or 0 when Horovod is not initialised (single-process Keras)."""
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return 0
    try:
        return hvd.rank() if hvd.is_initialized() else 0
    except ValueError:
        return 0
