"""A schedule as a short sequence of segments (layer 1: numpy only; TensorFlow is passed in, never imported).

Each LR policy is one small class here: its keys, its LR in numpy (bit-identical to Detectron, through
`hvd_sched.policies`) and as TensorFlow ops (`graph_lr(it, tf)`: the float64 formula with the same
operations in the same order, then the caller rounds to float32), the iteration from which it never changes
(`hold_iter`), its phase boundaries, and its *pieces*: the intervals where its LR is constant, a staircase,
or smooth. `join_warmup` joins Detectron's warmup onto a policy's pieces (fvcore's
`CompositeParamScheduler`, detectron2's `WarmupParamScheduler`, optax's `join_schedules`), so the
knowledge of a policy lives in one place and adding one is one class.

Pieces let the momentum-correction rule be found without walking every iteration (`find_corrections`):

- `constant`: the LR can change only at the piece's first iteration;
- `stairs`: constant between multiples of `stride` (`step`): only those multiples can correct;
- `smooth`: `log(LR)` is concave in the iteration (cosine, exp, poly, and any of them or a constant times
  a linear warmup: products of log-concave functions), so `|log(LR(it) / LR(it - 1))|` over a range is
  largest at its ends. A range whose end ratios are below the threshold (with a margin for the float32
  rounding of the LRs) holds no correction and is skipped; what is left is walked exactly, in small chunks.

The walk of the survivors evaluates the same float32 LRs and the same rule as a plain walk, so the result is
exactly the plain walk's, at a cost that grows with the number of pieces and corrections, not with MAX_ITER.
"""

import math

import numpy as np

from . import momentum, policies

__all__ = ["Piece", "POLICY_CLASSES", "policy_for", "join_warmup", "find_corrections", "tf_divide"]

# A range of at most this many candidate iterations is walked exactly instead of split further.
_LEAF = 2048
# Relative margin on the change ratio: the float32 rounding of two LRs moves their ratio by < 2.4e-7.
_RATIO_MARGIN = 1e-6
# A linear warmup over a staircase becomes one smooth piece per stair, up to this many; beyond, one walked piece.
_MAX_WARMUP_STAIRS = 4096
# `step` gathers its decays from a table up to this many, and uses pow(GAMMA, k) in-graph beyond.
_MAX_DECAY_TABLE = 4096


class Piece:
    """An interval `[start, stop)` of iterations (`stop` None: to infinity) and how the LR behaves there.

    Args:
        start: first iteration (int >= 0).
        stop: one past the last iteration, or None.
        kind: `'constant'`, `'stairs'` (constant between multiples of `stride`), `'smooth'`
            (log-concave) or `'walk'` (no structure known: walked).
        stride: the stair length for `'stairs'`.
    """

    __slots__ = ("start", "stop", "kind", "stride")

    def __init__(self, start, stop, kind, stride=1):
        self.start, self.stop, self.kind, self.stride = int(start), stop, kind, int(stride)

    def clipped(self, start, stop):
        """The same piece restricted to `[start, stop)` (`stop` None: unbounded), or None if empty."""
        lo = max(self.start, start)
        hi = stop if self.stop is None else (self.stop if stop is None else min(self.stop, stop))
        if hi is not None and hi <= lo:
            return None
        return Piece(lo, hi, self.kind, self.stride)

    def __repr__(self):
        stride = f", stride={self.stride}" if self.kind == "stairs" else ""
        return f"Piece({self.start}, {self.stop}, {self.kind!r}{stride})"


def tf_divide(numerator, denominator, tf):
    """`numerator / denominator` (float64, `denominator` a nonzero Python number), correctly rounded.

    Not `/`: Grappler rewrites a division by a constant into a multiplication by its reciprocal, which is off
    by one bit for about one iteration in ten; `divide_no_nan` is not rewritten.
    """
    return tf.math.divide_no_nan(numerator, tf.constant(float(denominator), tf.float64))


def _tf_frac(it, max_iter, tf):
    """Detectron's `float(cur_iter) / MAX_ITER` for `it` clamped to MAX_ITER, in float64 ops."""
    return tf_divide(tf.cast(tf.minimum(it, np.int64(max_iter)), tf.float64), max_iter, tf)


def _tf_index(it, points, tf):
    """`bisect_right(points, it)`: how many of the sorted int `points` are <= `it`.

    A count of `points <= it` (three small ops on the scalar step: compare, cast, sum) rather than
    `tf.searchsorted`, whose reshapes and slices around the search cost more per step than the search itself
    for the few STEPS a schedule has (the counts are equal for any int list).
    """
    table = tf.constant(np.asarray(points, dtype=np.int64))
    return tf.reduce_sum(tf.cast(table <= it, tf.int64))


def _tf_gather(values, index, tf):
    return tf.gather(tf.constant(np.asarray(values, dtype=np.float64)), index)


class _Policy:
    """One LR policy: the keys it reads, its LR in numpy and in-graph, its pieces, hold_iter and boundaries."""

    name = None
    keys = ()

    def __init__(self, schedule):
        self.s = schedule

    def lr(self, its):
        """float64 LR of the policy (no warmup) at the int64 array `its`: hvd_sched.policies' formula."""
        raise NotImplementedError

    def graph_lr(self, it, tf):
        """The same as TensorFlow float64 ops on a scalar int64 tensor `it`."""
        raise NotImplementedError

    def pieces(self):
        """Pieces covering `[0, inf)`, in order."""
        raise NotImplementedError

    def last_change(self):
        """The last iteration at which the policy LR can change (before any warmup)."""
        raise NotImplementedError

    def boundaries(self):
        """The policy's own phase starts in `[0, MAX_ITER]` and beyond (each step / stage start)."""
        return []

    def decays(self):
        """The largest GAMMA exponent the policy reaches (overflow check), or None."""
        return None

    def critical_starts(self, warm_up_iters):
        """Phase starts around which the LR and the ratio of consecutive LRs take their extreme values (see
        `Schedule._check_float32_lrs`): the boundaries, for every policy but `step`."""
        return self.boundaries()

    def held_from(self):
        """Iteration from which the policy's LR is held whatever the warmup (cosine/poly: 0 from MAX_ITER)."""
        return None


class _StepList(_Policy):
    """`steps_with_decay` / `steps_with_lrs` / `steps_with_relative_lrs`: one constant per STEPS entry."""

    def values(self):
        raise NotImplementedError

    def lr(self, its):
        return np.asarray(self.values(), dtype=np.float64)[policies.step_index(its, self.s.steps)]

    def graph_lr(self, it, tf):
        # STEPS[0] == 0, so the count is >= 1: a leading copy of the first value saves the `- 1`.
        values = np.asarray(self.values(), dtype=np.float64)
        return _tf_gather(np.concatenate([values[:1], values]), _tf_index(it, self.s.steps, tf), tf)

    def pieces(self):
        steps = self.s.steps
        return [Piece(start, stop, "constant") for start, stop in zip(steps, steps[1:] + [None])]

    def last_change(self):
        return self.s.steps[-1]

    def boundaries(self):
        return list(self.s.steps)


class StepsWithDecay(_StepList):
    name, keys = "steps_with_decay", ("base_lr", "gamma", "steps")

    def values(self):
        return policies.decay_table(self.s.base_lr, self.s.gamma, 0, len(self.s.steps) - 1)

    def lr(self, its):
        return policies.steps_with_decay(its, self.s.base_lr, self.s.gamma, self.s.steps)

    def decays(self):
        return len(self.s.steps) - 1


class StepsWithLrs(_StepList):
    name, keys = "steps_with_lrs", ("steps", "lrs")

    def values(self):
        return np.asarray(self.s.lrs, dtype=np.float64)


class StepsWithRelativeLrs(_StepList):
    name, keys = "steps_with_relative_lrs", ("base_lr", "steps", "lrs")

    def values(self):
        return np.array([float(lr) * self.s.base_lr for lr in self.s.lrs], dtype=np.float64)


class VariableStepsize(_Policy):
    """`variable_stepsize`: `BASE_LR * GAMMA ** k`, k the number of stage ends <= it."""

    name, keys = "variable_stepsize", ("base_lr", "gamma", "step_sizes")

    def ends(self):
        return policies.stage_ends(self.s.step_sizes)

    def lr(self, its):
        return policies.variable_stepsize(its, self.s.base_lr, self.s.gamma, self.s.step_sizes)

    def graph_lr(self, it, tf):
        table = policies.decay_table(self.s.base_lr, self.s.gamma, 0, len(self.s.step_sizes))
        return _tf_gather(table, _tf_index(it, self.ends(), tf), tf)

    def pieces(self):
        starts = [0] + self.ends()
        return [Piece(start, stop, "constant") for start, stop in zip(starts, starts[1:] + [None])]

    def last_change(self):
        return sum(self.s.step_sizes)

    def boundaries(self):
        return self.ends()

    def decays(self):
        return len(self.s.step_sizes)


class Step(_Policy):
    """`step`: `BASE_LR * GAMMA ** (min(it, MAX_ITER) // STEP_SIZE)`: one staircase piece, whatever its length."""

    name, keys = "step", ("base_lr", "gamma", "step_size", "max_iter")

    def lr(self, its):
        return policies.step(its, self.s.base_lr, self.s.gamma, self.s.step_size, self.s.max_iter)

    def graph_lr(self, it, tf):
        s = self.s
        exponent = tf.minimum(it, np.int64(s._max_iter)) // np.int64(s._step_size)
        if self.decays() < _MAX_DECAY_TABLE:  # the exact Python-float table, as Detectron computes it
            return _tf_gather(policies.decay_table(s._base_lr, s._gamma, 0, self.decays()), exponent, tf)
        # glibc's pow, as Python's float ** int: TF's scalar pow agrees with it after the float32 rounding.
        return s._base_lr * tf.pow(tf.constant(s._gamma, tf.float64), tf.cast(exponent, tf.float64))

    def pieces(self):
        if self.decays() == 0 or self.s.gamma == 1.0:
            return [Piece(0, None, "constant")]
        return [Piece(0, self.last_change() + 1, "stairs", self.s.step_size),
                Piece(self.last_change() + 1, None, "constant")]

    def last_change(self):
        return self.decays() * self.s.step_size

    def decays(self):
        return self.s.max_iter // self.s.step_size

    def boundaries(self):
        return list(range(self.s.step_size, self.s.max_iter + 1, self.s.step_size))

    def critical_starts(self, warm_up_iters):
        # All decays last STEP_SIZE iterations, so the concavity in the decay count leaves the first and last
        # decays and those around WARM_UP_ITERS: a handful, whatever MAX_ITER / STEP_SIZE.
        last = self.decays()
        around_warmup = warm_up_iters // self.s.step_size
        decays = {1, last, around_warmup - 1, around_warmup, around_warmup + 1}
        return [decay * self.s.step_size for decay in decays if 1 <= decay <= last]


class _Continuous(_Policy):
    """A policy smooth (log-concave) on `[0, MAX_ITER)` and held from MAX_ITER on."""

    def pieces(self):
        return [Piece(0, self.s.max_iter, "smooth"), Piece(self.s.max_iter, None, "constant")]

    def last_change(self):
        return self.s.max_iter


class CosineDecay(_Continuous):
    name, keys = "cosine_decay", ("base_lr", "max_iter")

    def lr(self, its):
        return policies.cosine_decay(its, self.s.base_lr, self.s.max_iter)

    def graph_lr(self, it, tf):
        cos_frac = tf.cos(np.pi * _tf_frac(it, self.s.max_iter, tf))
        cos_frac = (cos_frac + 1) * 0.5
        return self.s.base_lr * cos_frac

    def held_from(self):
        return self.s.max_iter


class ExpDecay(_Continuous):
    name, keys = "exp_decay", ("base_lr", "gamma", "max_iter")

    def lr(self, its):
        return policies.exp_decay(its, self.s.base_lr, self.s.gamma, self.s.max_iter)

    def graph_lr(self, it, tf):
        log_gamma = float(np.log(self.s.gamma))  # numpy's log, as Detectron's np.log(GAMMA)
        return self.s.base_lr * tf.exp(_tf_frac(it, self.s.max_iter, tf) * log_gamma)


class Poly(_Continuous):
    name, keys = "poly", ("base_lr", "power", "max_iter")

    def lr(self, its):
        return policies.poly(its, self.s.base_lr, self.s.max_iter, self.s.power)

    def graph_lr(self, it, tf):
        remaining = 1.0 - _tf_frac(it, self.s.max_iter, tf)
        if self.s.power != 1.0:
            remaining = tf.pow(remaining, tf.constant(self.s.power, tf.float64))
        return self.s.base_lr * remaining

    def held_from(self):
        return self.s.max_iter


#: Every policy class by its LR_POLICY name.
POLICY_CLASSES = {cls.name: cls for cls in (Step, StepsWithDecay, StepsWithLrs, CosineDecay, ExpDecay,
                                             StepsWithRelativeLrs, Poly, VariableStepsize)}


def policy_for(schedule):
    """The policy object of a `Schedule` (reads its private validated fields)."""
    return POLICY_CLASSES[schedule.lr_policy](schedule)


def join_warmup(pieces, warm_up_iters, method, held_from=None):
    """Join Detectron's warmup onto a policy's pieces: split at WARM_UP_ITERS and mark what the factor changes.

    A constant factor keeps each piece's kind; a linear factor (log-concave) makes constant pieces smooth,
    keeps smooth ones smooth, and cuts a staircase into one smooth piece per stair (a walked piece beyond
    `_MAX_WARMUP_STAIRS` stairs). From `held_from` on (cosine and poly: 0 from MAX_ITER) the LR is held
    whatever the factor, so those pieces stay as they are.
    """
    if held_from is not None:
        warm_up_iters = min(warm_up_iters, held_from)
    if warm_up_iters <= 0:
        return list(pieces)
    joined = []
    for piece in pieces:
        below = piece.clipped(0, warm_up_iters)
        above = piece.clipped(warm_up_iters, None)
        if below is not None:
            if method == "constant":
                joined.append(below)
            elif below.kind == "stairs":
                cuts = list(range((below.start // below.stride + 1) * below.stride, below.stop, below.stride))
                if len(cuts) > _MAX_WARMUP_STAIRS:
                    joined.append(Piece(below.start, below.stop, "walk"))
                else:
                    edges = [below.start] + cuts + [below.stop]
                    joined += [Piece(a, b, "smooth") for a, b in zip(edges, edges[1:])]
            else:
                joined.append(Piece(below.start, below.stop, "smooth" if below.kind == "constant" else below.kind))
        if above is not None:
            joined.append(above)
    return joined


def find_corrections(pieces, lr32, lr64, start, stop, mode, threshold, limit=None):
    """The iterations in `[start, stop)` where the correction rule fires, and the factors, without a full walk.

    Args:
        pieces: the schedule's pieces (`Schedule.pieces()`), covering `[0, inf)`.
        lr32: the schedule's float32 LR of an int64 array (`Schedule.lr_at`).
        lr64: the float64 LR before the float32 rounding (for the bounds only).
        start: first iteration considered (>= 0).
        stop: one past the last.
        mode: `'threshold'`, `'every_change'` or `'off'`.
        threshold: SCALE_MOMENTUM_THRESHOLD.
        limit: stop once this many are found (the first `limit` are returned), or None.

    Returns:
        `(iterations int64 array, factors float32 array)`, sorted; exactly what a walk of every iteration gives.
    """
    found_its, found_factors = [], []
    count = [0]
    if mode == "off" or stop <= max(start, 1):
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    start = max(start, 1)  # the LR before iteration 0 is 0: iteration 0 never corrects

    def walk(its):
        if its.size:
            mask, factors = momentum.correction_factors(lr32(its - 1), lr32(its), mode, threshold,
                                                        lr64(its - 1), lr64(its))
            found_its.append(its[mask])
            found_factors.append(factors[mask])
            count[0] += int(mask.sum())
        return limit is not None and count[0] >= limit

    for piece in pieces:
        part = piece.clipped(start, stop)
        if part is None:
            continue
        # The piece's first iteration compares with the previous piece: always checked.
        if piece.start >= start and walk(np.array([piece.start], dtype=np.int64)):
            break
        lo = max(part.start, piece.start + 1)
        if part.kind == "constant" or lo >= part.stop:
            continue
        if part.kind == "stairs":
            first = -(-lo // part.stride)  # the first multiple of the stride >= lo
            last = (part.stop - 1) // part.stride
            done = _search(first, last + 1, lambda k, s=part.stride: k * s, lr64, walk, mode, threshold, True)
        else:
            done = _search(lo, part.stop, lambda k: k, lr64, walk, mode, threshold, part.kind == "smooth")
        if done:
            break
    if not found_its:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    its, factors = np.concatenate(found_its), np.concatenate(found_factors).astype(np.float32)
    return (its, factors) if limit is None else (its[:limit], factors[:limit])


def _search(lo, hi, iteration, lr64, walk, mode, threshold, pruned):
    """Walk the candidates `iteration(k)` for `k` in `[lo, hi)`, skipping ranges that cannot correct.

    Iterative bisection (no recursion limit); ranges are visited in order, so the output stays sorted. Returns
    True as soon as `walk` does (the limit is reached).
    """
    stack = [(lo, hi)]
    while stack:
        a, b = stack.pop()
        if a >= b:
            continue
        if pruned and _quiet(a, b, iteration, lr64, mode, threshold):
            continue
        if b - a <= _LEAF:
            if walk(iteration(np.arange(a, b, dtype=np.int64))):
                return True
            continue
        middle = (a + b) // 2
        stack += [(middle, b), (a, middle)]
    return False


def _quiet(a, b, iteration, lr64, mode, threshold):
    """True when no candidate in `[a, b)` can correct, from the LR at the two ends of the range.

    On a log-concave piece the log-ratio of consecutive LRs decreases along the piece, so its absolute value is
    largest at one end of any range, and the LR is monotone over a range whose end log-ratios do not change sign.
    """
    ends = np.array([iteration(a), iteration(b - 1)], dtype=np.int64)
    with np.errstate(all="ignore"):
        before, after = lr64(ends - 1), lr64(ends)
        if not (np.all(before > 0) and np.all(after > 0) and np.all(np.isfinite(after))):
            return False
        log_ratios = np.log(after) - np.log(before)
    if mode == "threshold" and threshold * (1 - _RATIO_MARGIN) > 1 \
            and float(np.max(np.abs(log_ratios))) < math.log(threshold * (1 - _RATIO_MARGIN)):
        return True
    # Any mode: nothing changes inside a monotone range whose float32 LR is the same at both ends.
    tolerance = 1e-12
    monotone = log_ratios[0] <= -tolerance or log_ratios[1] >= tolerance or bool(np.all(log_ratios == 0))
    if mode == "any_change":  # Large-Scale-VRD compares the unrounded LRs
        return bool(monotone and before[0] == after[1])
    return bool(monotone and np.float32(before[0]) == np.float32(after[1]))


# ---------------------------------------------------------------------------------------------- warmups
# Each warmup is joined onto a policy: it changes the LR on its own iterations and leaves the rest alone.


class _WarmupUntil:
    """A warmup over `[0, iters)`: where it ends and the phase start it adds."""

    iters = 0

    def end(self):
        return self.iters

    def starts(self):
        return [self.iters]


class DetectronWarmup(_WarmupUntil):
    """Detectron's `get_lr_at_iter`: the policy LR times `WARM_UP_FACTOR` (constant) or `WARM_UP_FACTOR *
    (1 - alpha) + alpha`, `alpha = it / WARM_UP_ITERS` (linear), while `it < WARM_UP_ITERS`."""

    keys = ("warm_up_method", "warm_up_factor", "warm_up_iters")

    def __init__(self, schedule, policy):
        self.method, self.iters, self.factor = (schedule.warm_up_method, schedule.warm_up_iters,
                                                schedule.warm_up_factor)
        self.held_from = policy.held_from()

    def lr64(self, its, policy_lr64):
        warming = np.flatnonzero(its < self.iters)
        if warming.size:
            policy_lr64[warming] *= policies.warmup_factor(its[warming], self.method, self.iters, self.factor)
        return policy_lr64

    def graph_lr64(self, it, policy_lr64, tf):
        if self.iters <= 0:
            return policy_lr64
        if self.method == "constant":
            factor = tf.constant(self.factor, tf.float64)
        else:
            alpha = tf_divide(tf.cast(it, tf.float64), self.iters, tf)
            factor = self.factor * (1 - alpha) + alpha
        return tf.where(it < np.int64(self.iters), policy_lr64 * factor, policy_lr64)

    def join(self, pieces):
        return join_warmup(pieces, self.iters, self.method, self.held_from)


def _replace(pieces, start, stop, kind):
    """`pieces` with `[start, stop)` replaced by one piece of `kind`."""
    if stop <= start:
        return list(pieces)
    kept = [part for piece in pieces for part in (piece.clipped(0, start), piece.clipped(stop, None)) if part]
    return sorted(kept + [Piece(start, stop, kind)], key=lambda piece: piece.start)


class VrdWarmup:
    """Large-Scale-VRD's `check_and_apply_warmup(i, lr)` on the 1-based `i = it + 1`; each case replaces the
    step LR (`model_builder_rel.py`):

    - `i <= WARM_UP_ITERS`: the absolute `WARM_UP_LR`;
    - else, with GRADUAL_INCREASE_LR and WARM_UP_ITERS > 0, for `i <= W + n` (`n = ceil((BASE_LR -
      WARM_UP_LR) / GRADUAL_LR_STEP)`): `min(BASE_LR, WARM_UP_LR + GRADUAL_LR_STEP * (i - W))`;
    - else, with GRADUAL_INCREASE_LR, for `i <= n` (`n = ceil((BASE_LR - GRADUAL_LR_START) /
      GRADUAL_LR_STEP)`): `min(BASE_LR, GRADUAL_LR_START + GRADUAL_LR_STEP * (i - 1))`.
    """

    keys = ("warm_up_iters", "warm_up_lr", "gradual_increase_lr", "gradual_lr_step", "gradual_lr_start")

    def __init__(self, schedule, policy):
        self.iters, self.lr, self.base = schedule.warm_up_iters, schedule.warm_up_lr, schedule.base_lr
        self.step, self.start = schedule.gradual_lr_step, schedule.gradual_lr_start
        self.ramp_from, self.ramp_stop, self.ramp_lr = 0, 0, None  # 0-based [ramp_from, ramp_stop)
        if schedule.gradual_increase_lr:
            if self.iters > 0:
                count = int(math.ceil((self.base - self.lr) / self.step))
                self.ramp_from, self.ramp_stop, self.ramp_lr = self.iters, self.iters + max(count, 0), self.lr
            else:
                count = int(math.ceil((self.base - self.start) / self.step))
                self.ramp_from, self.ramp_stop, self.ramp_lr = 0, max(count, 0), self.start

    def end(self):
        return max(self.iters, self.ramp_stop)

    def starts(self):
        return [self.iters, self.ramp_from, self.ramp_stop]

    def _ramp_offset(self, its):
        """`i - W` (after the warmup) or `i - 1` (from the start) of the 1-based `i = it + 1`."""
        return its + 1 - (self.iters if self.iters > 0 else 1)

    def lr64(self, its, policy_lr64):
        policy_lr64[its < self.iters] = self.lr
        ramp = np.flatnonzero((its >= self.ramp_from) & (its < self.ramp_stop))
        if ramp.size:
            ramped = self.ramp_lr + self.step * self._ramp_offset(its[ramp]).astype(np.float64)
            policy_lr64[ramp] = np.minimum(self.base, ramped)
        return policy_lr64

    def graph_lr64(self, it, policy_lr64, tf):
        lr = policy_lr64
        if self.ramp_stop > self.ramp_from:
            offset = tf.cast(self._ramp_offset(it), tf.float64)
            ramped = tf.minimum(tf.constant(self.base, tf.float64), self.ramp_lr + self.step * offset)
            lr = tf.where(tf.logical_and(it >= self.ramp_from, it < self.ramp_stop), ramped, lr)
        if self.iters > 0:
            lr = tf.where(it < np.int64(self.iters), tf.constant(self.lr, tf.float64), lr)
        return lr

    def join(self, pieces):
        pieces = _replace(pieces, 0, self.iters, "constant")
        return _replace(pieces, self.ramp_from, self.ramp_stop, "smooth")


class VnlWarmup(_WarmupUntil):
    """video-nonlocal-net's `get_lr_at_iter`: while `it < WARMUP_END_ITER` the LR is replaced by
    `it * (lr_end - lr_start) / (WARMUP_END_ITER - 1) + lr_start` with `lr_start = float32(WARMUP_START_LR)`,
    `lr_end = float32(policy LR at WARMUP_END_ITER)`, the difference in float32 and the rest in float64 (NumPy
    1.x promotes `int * np.float32` to float64), then float32 (`lib/utils/lr_policy.py`)."""

    keys = ("warm_up_iters", "warm_up_lr")

    def __init__(self, schedule, policy):
        self.iters = schedule.warm_up_iters
        if self.iters > 0:
            self.start32 = np.float32(schedule.warm_up_lr)
            end32 = np.float32(policy.lr(np.array([self.iters], dtype=np.int64))[0])
            self.diff = float(np.float32(end32 - self.start32))

    def lr64(self, its, policy_lr64):
        warming = np.flatnonzero(its < self.iters)
        if warming.size:
            ramp = its[warming].astype(np.float64) * self.diff / float(self.iters - 1) + float(self.start32)
            policy_lr64[warming] = ramp
        return policy_lr64

    def graph_lr64(self, it, policy_lr64, tf):
        if self.iters <= 0:
            return policy_lr64
        ramp = tf_divide(tf.cast(it, tf.float64) * self.diff, self.iters - 1, tf) + float(self.start32)
        return tf.where(it < np.int64(self.iters), ramp, policy_lr64)

    def join(self, pieces):
        return _replace(pieces, 0, self.iters, "smooth")


#: The warmup of each dialect.
WARMUPS = {"detectron": DetectronWarmup, "large_scale_vrd": VrdWarmup, "video_nonlocal": VnlWarmup}
