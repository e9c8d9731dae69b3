"""Exact lookup tables built from a pure schedule, for use inside a TensorFlow graph.

The Keras glue does no schedule arithmetic: it evaluates `Schedule.lr_at` once, in numpy, over every iteration
up to `schedule.hold_iter` (after which the LR never changes), and the momentum-correction rule over the same
range. The training graph then only gathers from these tables, so the LR and the correction factors used in
training are bit-for-bit the float32 values `lr_at` and `momentum_corrections` report.
"""

import numpy as np

from ..momentum import MODES, correction_factors
from ..schedules import Schedule

__all__ = ["as_schedule", "lr_table", "correction_table"]


def as_schedule(schedule):
    """Accept a Schedule or its `get_config()` dict (as Horovod's `from_config` rebuild passes it)."""
    if isinstance(schedule, Schedule):
        return schedule
    if isinstance(schedule, dict):
        return Schedule.from_config(schedule)
    raise TypeError(
        f"schedule must be an hvd_sched.Schedule (e.g. from hvd_sched.from_detectron) or its get_config() dict, "
        f"got {type(schedule).__name__}: {schedule!r}")


def lr_table(schedule):
    """float32 LR for iterations 0..hold_iter; index min(it, hold_iter) gives lr_at(it) for every it >= 0."""
    return np.asarray(schedule.lr_at(np.arange(schedule.hold_iter + 1, dtype=np.int64)), dtype=np.float32)


def correction_table(schedule, mode, threshold):
    """Iterations where the rule rescales the momentum slots, and the float32 factor at each.

    Walks 0..hold_iter as Detectron's loop does (the LR before iteration 0 is 0, so iteration 0 never
    corrects); past hold_iter the LR is constant and nothing is rescaled.

    Returns:
        (iterations int64 array, factors float32 array), both sorted by iteration and possibly empty.
    """
    if mode not in MODES:
        raise ValueError(f"momentum_correction must be one of {MODES}, got {mode!r}")
    if mode == "off":
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    lrs = lr_table(schedule)
    prev = np.concatenate([np.zeros(1, np.float32), lrs[:-1]])
    mask, factors = correction_factors(prev, lrs, mode=mode, threshold=threshold)
    iterations = np.nonzero(mask)[0].astype(np.int64)
    return iterations, np.asarray(factors, np.float32)[iterations]
