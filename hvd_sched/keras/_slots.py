"""Which optimizers carry the LR in their slots, and the correction mode that follows.

Only SGD with momentum keeps a buffer that carries the learning rate inside it (Keras: m = mu*m - lr*g, the
negative of Detectron's V = mu*V + lr*g, in Keras 2 and Keras 3 alike), so only there does rescaling the slots by
new_lr/old_lr mean anything.
"""

from ..momentum import MODES
from . import _backend

__all__ = ["slots_carry_lr", "resolve_correction_mode"]


def slots_carry_lr(optimizer):
    """True when the optimizer's slots accumulate lr * grad (SGD with momentum > 0)."""
    optimizer = _backend.unwrap(optimizer)
    return _backend.is_sgd(optimizer) and _backend.momentum_of(optimizer) > 0


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
