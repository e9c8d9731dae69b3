"""The schedule inside a TensorFlow graph: the LR and the momentum-correction factor at a step, no tables.

The Keras glue does no schedule arithmetic: `Schedule.graph_lr` gives the policy's float64 formula (with the
same operations as `Schedule.lr_at`) rounded to float32, and `hvd_sched.momentum.graph_correction_factor` the
correction rule on the LRs of this iteration and the one before. The graph holds a handful of constants
(the STEPS, the decay values), never one per iteration, so its size and build time do not depend on MAX_ITER.
"""

import tensorflow as tf

from ..momentum import DIALECT_MODES, MODES, graph_correction_factor
from ..schedules import Schedule

__all__ = ["as_schedule", "graph_lr", "graph_factor", "has_corrections"]


def as_schedule(schedule):
    """Accept a Schedule or its `get_config()` dict (as Horovod's `from_config` rebuild passes it)."""
    if isinstance(schedule, Schedule):
        return schedule
    if isinstance(schedule, dict):
        return Schedule.from_config(schedule)
    raise TypeError(
        f"schedule must be an hvd_sched.Schedule (e.g. from hvd_sched.from_detectron) or its get_config() dict, "
        f"got {type(schedule).__name__}: {schedule!r}")


def graph_lr(schedule, step):
    """float32 `schedule.lr_at(step)` as graph ops on the int tensor `step`."""
    return schedule.graph_lr(step, tf)


def graph_factor(schedule, step, mode, threshold):
    """The float32 factor the momentum slots are multiplied by before the update of iteration `step`.

    Detectron's walk: the LR before iteration 0 is 0 (no correction there); otherwise the rule compares the LR
    of `step - 1` with that of `step`. 1.0 on every step where the rule does not fire.
    """
    step = tf.cast(step, tf.int64)
    new64 = schedule.graph_lr64(step, tf)
    cur64 = schedule.graph_lr64(tf.maximum(step - 1, 0), tf)
    new, cur = tf.cast(new64, tf.float32), tf.cast(cur64, tf.float32)
    factor = graph_correction_factor(cur, new, mode, threshold, tf, cur64, new64)
    return tf.where(step > 0, factor, tf.constant(1.0, tf.float32))


def has_corrections(schedule, mode, threshold):
    """True when the rule fires at least once (found from the schedule's pieces, without a walk)."""
    if mode not in MODES + DIALECT_MODES:
        raise ValueError(f"momentum_correction must be one of {MODES + DIALECT_MODES}, got {mode!r}")
    if mode == "off":
        return False
    return bool(schedule.momentum_corrections(schedule.hold_iter + 1, mode=mode, threshold=threshold, limit=1))
