"""Learning-rate policies of Detectron's solver, vectorised over iteration arrays (layer 1: numpy only).

Every function takes `its`, a 1-D `int64` array of non-negative 0-based iterations, and returns the policy LR
as a `float64` array, computed with the same floating-point operations, in the same order, as Detectron's
`detectron/utils/lr_policy.py` does on one Python `int` at a time (so that, once rounded to float32, every
value is bit-identical to Detectron's `get_lr_at_iter`). Decay tables such as `BASE_LR * GAMMA ** k` are
built with Python floats, as Detectron does, and then indexed; numpy's vectorised `power` is not used for them
because it may differ from Python's `**` in the last bit.

Past the end of training (`it > MAX_ITER`) the policies that depend on `MAX_ITER` or grow without bound
(`step`, `cosine_decay`, `exp_decay`, `poly`) hold their `MAX_ITER` value; inside `[0, MAX_ITER]` they
are Detectron's. The step-list policies are constant after their last step and are Detectron's everywhere.

Example:
    >>> import numpy as np
    >>> step(np.arange(5), base_lr=0.1, gamma=0.1, step_size=2, max_iter=4).round(6).tolist()
    [0.1, 0.1, 0.01, 0.01, 0.001]
"""

import numpy as np

__all__ = [
    "POLICIES",
    "HELD_AT_MAX_ITER",
    "WARM_UP_METHODS",
    "step",
    "steps_with_decay",
    "steps_with_lrs",
    "steps_with_relative_lrs",
    "cosine_decay",
    "exp_decay",
    "poly",
    "variable_stepsize",
    "step_index",
    "stage_ends",
    "decay_table",
    "warmup_factor",
]

POLICIES = (
    "step",
    "steps_with_decay",
    "steps_with_lrs",
    "cosine_decay",
    "exp_decay",
    "steps_with_relative_lrs",
    "poly",
    "variable_stepsize",
)
"""Every value of `SOLVER.LR_POLICY` hvd_sched understands (Detectron's five, then hvd_sched's additions); their
formulas are in `Schedule`'s docstring."""

HELD_AT_MAX_ITER = frozenset({"step", "cosine_decay", "exp_decay", "poly"})
"""Policies evaluated at `min(it, MAX_ITER)`: past the end of training they hold the `MAX_ITER` value."""

WARM_UP_METHODS = ("constant", "linear")
"""The values of `SOLVER.WARM_UP_METHOD` (Detectron's `get_lr_at_iter`; the factors: `Schedule`)."""


def decay_table(base_lr, gamma, first, last):
    """`[BASE_LR * GAMMA ** k for k in first..last]` in Python float arithmetic, as Detectron computes it.

    Args:
        base_lr: `SOLVER.BASE_LR`.
        gamma: `SOLVER.GAMMA`.
        first: smallest exponent (int).
        last: largest exponent (int), `>= first - 1` (an empty table when `last < first`).

    Returns:
        A float64 array of `last - first + 1` values.

    Raises:
        OverflowError: if `GAMMA ** k` overflows (`GAMMA > 1` with many steps).
    """
    return np.array([base_lr * gamma**k for k in range(int(first), int(last) + 1)], dtype=np.float64)


def _decayed(base_lr, gamma, exponents):
    """`BASE_LR * GAMMA ** exponents` for an int array, through a table of the exponents' range.

    For a few exponents spread over a wide range (`step` at iterations 0 and 10**12, STEP_SIZE 1) the table holds
    only the exponents present, so its size never exceeds the array's.
    """
    if exponents.size == 0:
        return np.empty(0, dtype=np.float64)
    first, last = int(exponents.min()), int(exponents.max())
    if last - first < exponents.size:
        return decay_table(base_lr, gamma, first, last)[exponents - first]
    present, index = np.unique(exponents, return_inverse=True)
    table = np.array([base_lr * gamma**exponent for exponent in present.tolist()], dtype=np.float64)
    return table[index]


def step_index(its, steps):
    """Detectron's `get_step_index`: the index of the last entry of `STEPS` that is `<= it`.

    Detectron appends `MAX_ITER` to `STEPS` and walks the list; for increasing `STEPS` starting at 0 this is
    `bisect_right(STEPS, it) - 1` for every `it >= 0`, with or without steps beyond `MAX_ITER`, and past the
    last step the last index holds.

    Args:
        its: int64 array of iterations.
        steps: increasing ints, `steps[0] == 0`.

    Returns:
        An int64 array of indices into `steps`.
    """
    return np.searchsorted(np.asarray(steps, dtype=np.int64), its, side="right") - 1


def stage_ends(step_sizes):
    """The running sums of `STEP_SIZES`: the iteration at which each stage of `variable_stepsize` ends.

    Example: `STEP_SIZES [30, 30, 20]` -> `[30, 60, 80]` (the seed's `get_lr_steps`).
    """
    ends, total = [], 0
    for size in step_sizes:
        total += int(size)
        ends.append(total)
    return ends


def step(its, base_lr, gamma, step_size, max_iter):
    """`'step'`: `BASE_LR * GAMMA ** (it // STEP_SIZE)`, held at `it = MAX_ITER` past the end."""
    return _decayed(base_lr, gamma, np.minimum(its, max_iter) // step_size)


def steps_with_decay(its, base_lr, gamma, steps):
    """`'steps_with_decay'`: `BASE_LR * GAMMA ** k`, `k` the index of the last `STEPS` entry `<= it`.

    Example: `STEPS [0, 60, 80]`, `BASE_LR 0.02`, `GAMMA 0.1`: 0.02 on [0, 59], 0.002 on [60, 79], 0.0002
    from 80 on (also past `MAX_ITER`).
    """
    return _decayed(base_lr, gamma, step_index(its, steps))


def steps_with_lrs(its, steps, lrs):
    """`'steps_with_lrs'`: `LRS[k]`, `k` the index of the last `STEPS` entry `<= it`."""
    return np.asarray(lrs, dtype=np.float64)[step_index(its, steps)]


def steps_with_relative_lrs(its, base_lr, steps, lrs):
    """`'steps_with_relative_lrs'` (video-nonlocal-net, SlowFast): `LRS[k] * BASE_LR`."""
    table = np.array([float(lr) * base_lr for lr in lrs], dtype=np.float64)
    return table[step_index(its, steps)]


def _iter_frac(its, max_iter):
    """Detectron's `float(cur_iter) / MAX_ITER` for `it` clamped to `MAX_ITER`."""
    return np.minimum(its, max_iter).astype(np.float64) / max_iter


def cosine_decay(its, base_lr, max_iter):
    """`'cosine_decay'`: `BASE_LR * (0.5 * (cos(pi * it / MAX_ITER) + 1))`, 0 from `MAX_ITER` on.

    Same operation order as Detectron: `iter_frac = it / MAX_ITER`, `cos_frac = 0.5 * (cos(pi * iter_frac) +
    1)`, `BASE_LR * cos_frac`.
    """
    cos_frac = np.cos(np.pi * _iter_frac(its, max_iter))
    cos_frac += 1
    cos_frac *= 0.5
    return base_lr * cos_frac


def exp_decay(its, base_lr, gamma, max_iter):
    """`'exp_decay'`: `BASE_LR * exp(it / MAX_ITER * ln GAMMA)`; GAMMA is the final/initial LR ratio.

    Same operation order as Detectron: `exp_frac = np.exp(iter_frac * np.log(GAMMA))`, `BASE_LR * exp_frac`;
    held at `BASE_LR * GAMMA` (to rounding) from `MAX_ITER` on.
    """
    return base_lr * np.exp(_iter_frac(its, max_iter) * np.log(gamma))


def poly(its, base_lr, max_iter, power=1.0):
    """`'poly'` (hvd_sched addition): `BASE_LR * (1 - it / MAX_ITER) ** POWER`, 0 from `MAX_ITER` on.

    The definition of mmcv's `PolyLrUpdaterHook` (with `min_lr = 0`) and detectron2's `WarmupPolyLR` (without
    its `constant_ending`); POWER defaults to 1.0 (linear decay, mmcv's default; detectron2 uses 0.9). For
    `POWER == 1` no power is taken, so the decay is exact.
    """
    remaining = 1.0 - _iter_frac(its, max_iter)
    if power != 1.0:
        # Python's float ** (C's pow), as mmcv and detectron2 compute it, and as TensorFlow's scalar pow does
        # in-graph; numpy's vectorised power differs from it in the last bit for about half the arguments.
        remaining = np.fromiter((value**power for value in remaining.tolist()), dtype=np.float64,
                                count=remaining.size)
    return base_lr * remaining


def variable_stepsize(its, base_lr, gamma, step_sizes):
    """`'variable_stepsize'` (the seed's `add_variable_stepsize_lr`): `BASE_LR * GAMMA ** k`.

    `STEP_SIZES` are the lengths of consecutive stages; `k` counts the stage ends (running sums) `<= it`.
    The seed counts 1-based iterations and the ends strictly below them, which is the same. Past the last stage
    end `k = len(STEP_SIZES)` holds.
    """
    ends = np.asarray(stage_ends(step_sizes), dtype=np.int64)
    return _decayed(base_lr, gamma, np.searchsorted(ends, its, side="right"))


def warmup_factor(its, method, warm_up_iters, warm_up_factor):
    """The factor Detectron's `get_lr_at_iter` multiplies the policy LR by: 1.0 from `WARM_UP_ITERS` on.

    While `it < WARM_UP_ITERS`: `'constant'` gives `WARM_UP_FACTOR`; `'linear'` gives `WARM_UP_FACTOR *
    (1 - alpha) + alpha` with `alpha = it / WARM_UP_ITERS` (Goyal et al.'s gradual warmup, arXiv:1706.02677).
    Multiplying by the 1.0 outside the warmup is exact, so `lr * factor` is Detectron's `lr *= warmup_factor`.

    Args:
        its: int64 array of iterations.
        method: `'constant'` or `'linear'`.
        warm_up_iters: `SOLVER.WARM_UP_ITERS` (0 disables the warmup).
        warm_up_factor: `SOLVER.WARM_UP_FACTOR`.

    Returns:
        A float64 array like `its`.

    Raises:
        ValueError: for an unknown method.
    """
    if method not in WARM_UP_METHODS:
        raise ValueError(f"WARM_UP_METHOD must be one of {list(WARM_UP_METHODS)}, got {method!r}")
    factor = np.ones(its.shape, dtype=np.float64)
    warming = its < warm_up_iters
    if warm_up_iters > 0 and warming.any():
        if method == "constant":
            factor[warming] = warm_up_factor
        else:
            alpha = its[warming].astype(np.float64) / warm_up_iters
            factor[warming] = warm_up_factor * (1 - alpha) + alpha
    return factor
