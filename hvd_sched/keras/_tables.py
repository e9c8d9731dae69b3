"""The schedule inside a TensorFlow graph: the LR and the momentum-correction factor at a step, no LR table.

The Keras glue does no schedule arithmetic: `Schedule.graph_lr` gives the policy's float64 formula (with the
same operations as `Schedule.lr_at`) rounded to float32. The correction factor comes from the schedule's
corrections (`Schedule.momentum_corrections`, found from its pieces without a walk) looked up at the step, or,
for a rule that fires more than `MAX_CORRECTION_TABLE` times, from `hvd_sched.momentum.graph_correction_factor`
on the LRs of this iteration and the one before. The graph holds a handful of constants (the STEPS, the decay
values, the corrections), never one per iteration, so its size and build time do not depend on MAX_ITER.
"""

import numpy as np
import tensorflow as tf

from ..momentum import graph_correction_factor
from ..schedules import Schedule

__all__ = ["as_schedule", "graph_lr", "graph_factor", "graph_factor_since", "correction_table",
           "MAX_CORRECTION_TABLE"]


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


#: A schedule with at most this many corrections gets them as a graph constant (a lookup per step); more (an
#: `every_change` rule on a long continuous policy corrects at every float32 LR change), the rule in-graph.
MAX_CORRECTION_TABLE = 65536
#: Up to this many, the lookup compares the step with every correction iteration (3 ops on a short vector);
#: beyond, a binary search.
_MAX_COMPARED = 64


def correction_table(schedule, mode, threshold, limit=MAX_CORRECTION_TABLE):
    """`(iterations int64, factors float32)` of every correction of the rule, or None if more than `limit`.

    `Schedule.momentum_corrections` over `[0, hold_iter]` (none later: the LR is held), found from the
    schedule's pieces: the cost grows with the pieces and the corrections, not with MAX_ITER.
    """
    if mode == "off":
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    found = schedule.momentum_corrections(schedule.hold_iter + 1, mode=mode, threshold=threshold,
                                          limit=limit + 1)
    if len(found) > limit:
        return None
    return (np.array([it for it, _ in found], dtype=np.int64),
            np.array([factor for _, factor in found], dtype=np.float32))


def graph_factor(schedule, step, mode, threshold, table=None):
    """The float32 factor the momentum slots are multiplied by before the update of iteration `step`.

    Detectron's walk: the LR before iteration 0 is 0 (no correction there); otherwise the rule compares the LR
    of `step - 1` with that of `step`. 1.0 on every step where the rule does not fire.

    With `table` (`correction_table`'s result), the factor is looked up among the corrections (the same
    iterations and float32 factors as the rule gives, found without a walk); without it the rule runs
    in-graph on the float64 LRs of both iterations.
    """
    step = tf.cast(tf.convert_to_tensor(step), tf.int64)  # a variable is read once
    if table is not None:
        return _lookup_factor(step, *table)
    new64 = schedule.graph_lr64(step, tf)
    cur64 = schedule.graph_lr64(tf.maximum(step - 1, 0), tf)
    new, cur = tf.cast(new64, tf.float32), tf.cast(cur64, tf.float32)
    factor = graph_correction_factor(cur, new, mode, threshold, tf, cur64, new64)
    return tf.where(step > 0, factor, tf.constant(1.0, tf.float32))


def _lookup_factor(step, iterations, factors, max_compared=_MAX_COMPARED):
    """The factor of `step` in the sorted correction `iterations`, 1.0 where it is none of them."""
    if iterations.size == 0:
        return tf.constant(1.0, tf.float32)
    if iterations.size <= max_compared:
        # At most one iteration matches: the product is that factor, or 1.0, exactly.
        hits = tf.equal(tf.constant(iterations), step)
        return tf.reduce_prod(tf.where(hits, tf.constant(factors), tf.constant(1.0, tf.float32)))
    # The first correction >= step. One sorted constant: padded with the largest int64, which no step reaches, so
    # a step past the last correction finds that pad (and 1.0) instead of an index out of range.
    keys = tf.constant(np.append(iterations, np.iinfo(np.int64).max).astype(np.int64))
    values = tf.constant(np.append(factors, 1.0).astype(np.float32))
    index = tf.searchsorted(keys, tf.reshape(step, [1]), side="left")[0]
    return tf.where(tf.equal(tf.gather(keys, index), step), tf.gather(values, index), tf.constant(1.0, tf.float32))


def graph_factor_since(schedule, last, step, mode, threshold, table=None):
    """The factor of every correction due after iteration `last` up to `step`, for a step applied after skipped ones.

    A Keras 2 LossScaleOptimizer that skips a step (non-finite gradients) still advances `iterations`, so a
    correction due at a skipped iteration would never reach the slots; the next applied step takes it instead:
    the product of the corrections at `last < it <= step` (the slots did not move in between). `last` < 0 means
    unknown (a fresh or restored optimizer): `step - 1`, i.e. `graph_factor`. Without a table, the rule compares
    the LRs of `last` and `step`.
    """
    step = tf.cast(tf.convert_to_tensor(step), tf.int64)
    last = tf.cast(tf.convert_to_tensor(last), tf.int64)
    last = tf.where(last < 0, step - 1, last)
    if table is None:
        new64 = schedule.graph_lr64(step, tf)
        cur64 = schedule.graph_lr64(tf.maximum(last, 0), tf)
        new, cur = tf.cast(new64, tf.float32), tf.cast(cur64, tf.float32)
        factor = graph_correction_factor(cur, new, mode, threshold, tf, cur64, new64)
        return tf.where(last >= 0, factor, tf.constant(1.0, tf.float32))
    iterations, factors = table
    if iterations.size == 0:
        return tf.constant(1.0, tf.float32)
    if iterations.size <= _MAX_COMPARED:
        keys = tf.constant(iterations)
        due = tf.logical_and(keys > last, keys <= step)
        return tf.reduce_prod(tf.where(due, tf.constant(factors), tf.constant(1.0, tf.float32)))
    # The corrections in (last, step] are a contiguous run of the sorted table: two binary searches, one product.
    keys = tf.constant(iterations)
    bounds = tf.searchsorted(keys, tf.stack([last, step]), side="right")
    return tf.reduce_prod(tf.slice(tf.constant(factors), bounds[:1], bounds[1:] - bounds[:1]))
