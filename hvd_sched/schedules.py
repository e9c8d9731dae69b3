"""`Schedule`: Detectron's solver as one small, stateless, serializable object (layer 1: numpy only).

A schedule joins a decay policy (`hvd_sched.policies`), a warmup and a momentum-correction rule
(`hvd_sched.momentum`); everything is a function of the iteration number, so resuming is free and a million
iterations evaluate at once. The arguments are Detectron's `SOLVER` keys in lower case; `hvd_sched.from_detectron`
builds one from the upper-case keys or a YAML file. An iteration is one optimizer update (Detectron's ITER; with
`iter_size` > 1, Caffe's iteration of ITER_SIZE micro-batches), whatever a framework's own counter counts.

`Schedule`'s docstring has the formulas, the arguments and the examples.
"""

import inspect
import numbers

import numpy as np

from . import momentum, policies, segments
from ._validation import MAX_INT, choice, float_list, int_list, integer, key, number

__all__ = ["Schedule"]

_SCALE_MOMENTUM_MODES = ("threshold", "every_change", *momentum.DIALECT_MODES)
_STEP_LIST_POLICIES = ("steps_with_decay", "steps_with_lrs", "steps_with_relative_lrs")
_LRS_POLICIES = ("steps_with_lrs", "steps_with_relative_lrs")
_ZERO_AT_MAX_ITER = ("cosine_decay", "poly")
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def _as_iterations(it, hold_iter):
    """`(int64 1-D array, output shape or None for a scalar)`; rejects bools, floats and negatives.

    Scalars and unsigned arrays are clamped to `hold_iter` (exact: the LR is constant from there), so that
    Python ints beyond int64 work too.
    """
    if isinstance(it, (bool, np.bool_)):
        raise TypeError(f"iteration must be an int or an integer array, got {it!r}")
    if isinstance(it, numbers.Integral):
        if it < 0:
            raise ValueError(f"iteration must be >= 0, got {int(it)}")
        return np.array([min(int(it), hold_iter)], dtype=np.int64), None
    array = np.asarray(it)
    if array.dtype.kind not in "iu" and not (array.size == 0 and array.dtype.kind == "f"):
        raise TypeError(f"iteration must be an int or an integer array, got dtype {array.dtype}")
    if array.dtype.kind == "u":
        array = np.minimum(array, np.uint64(hold_iter))
    elif array.size and array.min() < 0:
        raise ValueError(f"iterations must be >= 0, got {int(array.min())}")
    return array.astype(np.int64, copy=False).reshape(-1), array.shape


class Schedule:
    """Detectron's SOLVER learning-rate schedule: a policy, a warmup, and the momentum-correction rule.

    The arguments are Detectron's SOLVER keys in lower case (`hvd_sched.from_detectron` reads the upper-case
    keys or a YAML file). `lr(it) = float32(policy(it) * warmup(it))` exactly as Detectron's `get_lr_at_iter`:
    the policy LR in float64, then rounded to float32, bit-identical to Detectron's `lr_policy.py`. The
    policies (`LR_POLICY`, one of `hvd_sched.POLICIES`), with `it` the 0-based iteration:

    | policy | LR |
    |---|---|
    | `step` | `BASE_LR * GAMMA ** (it // STEP_SIZE)` |
    | `steps_with_decay` | `BASE_LR * GAMMA ** k`, `k` the index of the last STEPS entry `<= it` |
    | `steps_with_lrs` | `LRS[k]` |
    | `steps_with_relative_lrs` | `LRS[k] * BASE_LR` |
    | `cosine_decay` | `BASE_LR * 0.5 * (cos(pi * it / MAX_ITER) + 1)` |
    | `exp_decay` | `BASE_LR * exp(it / MAX_ITER * ln(GAMMA))` |
    | `poly` | `BASE_LR * (1 - it / MAX_ITER) ** POWER` |
    | `variable_stepsize` | `BASE_LR * GAMMA ** k`, `k` the number of stage ends (running sums of STEP_SIZES) `<= it` |

    The warmup multiplies the policy LR while `it < WARM_UP_ITERS`: `'constant'` by `WARM_UP_FACTOR`,
    `'linear'` by `WARM_UP_FACTOR * (1 - alpha) + alpha`, `alpha = it / WARM_UP_ITERS`. Past the end of
    training the LR holds (`hold_iter`). The momentum-correction rule is `momentum_corrections`'.

    An iteration is one optimizer update (Detectron's ITER; with `iter_size` > 1, Caffe's iteration of ITER_SIZE
    micro-batches), whatever a framework's own counter counts. Everything is a function of the iteration
    number, so resuming is free, and `lr_at` is vectorised: 10 million iterations evaluate in 0.19 s
    (`bench/lr_at_speed.py`). `get_config()` / `from_config()` round-trip every argument, also through JSON.

    Args:
        base_lr: BASE_LR, > 0.
        lr_policy: LR_POLICY, one of `hvd_sched.policies.POLICIES`.
        gamma: GAMMA, > 0 (`step`, `steps_with_decay`, `exp_decay`, `variable_stepsize`).
        step_size: STEP_SIZE, int > 0 (`step`).
        steps: STEPS, increasing ints starting at 0 (`steps_with_*`; required non-empty there).
        lrs: LRS, one LR (absolute, or relative to BASE_LR) per STEPS entry (`steps_with_lrs` / `_relative_lrs`).
        max_iter: MAX_ITER, int > 0: the end of `cosine_decay`, `exp_decay`, `poly`; `step` holds after it.
        warm_up_iters: WARM_UP_ITERS, int >= 0 (0: no warmup). Every iteration int (also each STEPS entry and the
            sum of STEP_SIZES) is at most 2**53, so that it is exact as a float64.
        warm_up_factor: WARM_UP_FACTOR in (0, 1].
        warm_up_method: WARM_UP_METHOD, `'constant'` or `'linear'`.
        scale_momentum: SCALE_MOMENTUM (bool); False turns the correction off.
        scale_momentum_threshold: SCALE_MOMENTUM_THRESHOLD, >= 1 (`'threshold'` mode).
        scale_momentum_mode: SCALE_MOMENTUM_MODE (hvd_sched): `'threshold'` (Detectron) or `'every_change'`.
        log_lr_change_threshold: LOG_LR_CHANGE_THRESHOLD, >= 1: the glue logs LR changes whose ratio exceeds it.
        momentum: MOMENTUM in [0, 1], carried for the optimizer.
        weight_decay: WEIGHT_DECAY >= 0, carried for the optimizer.
        lr_factor: LR_FACTOR > 0 (the seed's), carried for the optimizer glue; `lr_at` does not apply it.
        step_sizes: STEP_SIZES, positive ints: the stage lengths of `variable_stepsize` (required there).
        power: POWER > 0, the exponent of `poly`.
        weight_decay_gn: WEIGHT_DECAY_GN >= 0, the weight decay of norm-layer scales, carried for the optimizer
            (`hvd_sched.keras.build_optimizer`).
        dialect: whose semantics the LR, warmup and correction follow: `'detectron'`, `'large_scale_vrd'` or
            `'video_nonlocal'` (`from_detectron(..., dialect=...)` sets it and the keys below;
            docs/explanation/dialects.md).
        warm_up_lr: WARM_UP_LR > 0 (Large-Scale-VRD): the absolute LR while warming up.
        gradual_increase_lr: GRADUAL_INCREASE_LR (Large-Scale-VRD, bool): the ramp after the warmup.
        gradual_lr_step: GRADUAL_LR_STEP > 0 (Large-Scale-VRD): the ramp's step.
        gradual_lr_start: GRADUAL_LR_START > 0 (Large-Scale-VRD): the ramp's first LR.
        nesterov: NESTEROV (bool), carried for the optimizer.
        weight_decay_bn: WEIGHT_DECAY_BN >= 0 (video-nonlocal-net), carried for the optimizer.
        iter_size: ITER_SIZE (hvd_sched; Caffe's `iter_size`), int >= 1: micro-batches per iteration. Each
            iteration, one optimizer update (Detectron's ITER), averages the gradients of ITER_SIZE micro-batches
            on every rank (Horovod's `backward_passes_per_step` with `average_aggregated_gradients=True`,
            Keras 3's `gradient_accumulation_steps`), so the global batch is `world_size * ITER_SIZE *
            per-rank batch`. Carried for the optimizer glue, like MOMENTUM: every iteration-valued argument
            (MAX_ITER, STEPS, WARM_UP_ITERS, ...) counts updates, and `lr_at` does not depend on it.

    Raises:
        ValueError: for an invalid value; the message names the key and the value. Also for values valid one by
            one whose float32 LR overflows to inf, or underflows to 0 (before MAX_ITER for `cosine_decay` and
            `poly`, which reach 0 there; everywhere for the others), or whose momentum-correction factor is not
            a finite float32 > 0 (the message names the keys the LR depends on, and the iteration).
        TypeError: for a value of the wrong type (bool is not a number).

    Examples:
        >>> s = Schedule(base_lr=0.02, lr_policy="steps_with_decay", steps=[0, 60, 80], max_iter=90,
        ...              warm_up_iters=0)
        >>> s.lr_at(70), s.hold_iter, s.momentum_corrections(90)
        (0.0020000000949949026, 80, [(60, 0.10000000894069672), (80, 0.09999999403953552)])
        >>> s.lr_at(np.array([0, 60, 10**9]))
        array([0.02  , 0.002 , 0.0002], dtype=float32)

        Plain Keras, LR only (`hvd_sched.keras.ScheduledOptimizer` adds the momentum correction and Horovod):

        ```python
        s = hvd_sched.Schedule(base_lr=0.02, lr_policy="steps_with_decay", steps=[0, 60, 80], max_iter=90,
                               warm_up_iters=0)
        model.compile(tf.keras.optimizers.SGD(learning_rate=0.02, momentum=0.9), "sparse_categorical_crossentropy")
        set_lr = tf.keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: model.optimizer
                                                   .learning_rate.assign(s.lr_at(int(model.optimizer.iterations))))
        model.fit(x, y, epochs=12, callbacks=[set_lr])
        ```
    """

    def __init__(self, base_lr=0.001, lr_policy="step", gamma=0.1, step_size=30000, steps=(), lrs=(),
                 max_iter=40000, warm_up_iters=500, warm_up_factor=1.0 / 3.0, warm_up_method="linear",
                 scale_momentum=True, scale_momentum_threshold=1.1, scale_momentum_mode="threshold",
                 log_lr_change_threshold=1.1, momentum=0.9, weight_decay=0.0005, lr_factor=1.0,
                 step_sizes=(), power=1.0, weight_decay_gn=0.0, dialect="detectron", warm_up_lr=0.1,
                 gradual_increase_lr=False, gradual_lr_step=0.005, gradual_lr_start=0.1, nesterov=False,
                 weight_decay_bn=0.0, iter_size=1):
        self._base_lr = number("base_lr", base_lr, low=0, low_open=True)
        self._lr_policy = choice("lr_policy", lr_policy, policies.POLICIES)
        self._gamma = number("gamma", gamma, low=0, low_open=True)
        self._step_size = integer("step_size", step_size, low=1)
        self._steps = int_list("steps", steps)
        self._lrs = float_list("lrs", lrs)
        self._max_iter = integer("max_iter", max_iter, low=1)
        self._warm_up_iters = integer("warm_up_iters", warm_up_iters, low=0)
        self._warm_up_factor = number("warm_up_factor", warm_up_factor, low=0, high=1, low_open=True)
        self._warm_up_method = choice("warm_up_method", warm_up_method, policies.WARM_UP_METHODS)
        if not isinstance(scale_momentum, (bool, np.bool_)):
            raise TypeError(f"SCALE_MOMENTUM must be a bool, got {scale_momentum!r}")
        self._scale_momentum = bool(scale_momentum)
        self._scale_momentum_threshold = number("scale_momentum_threshold", scale_momentum_threshold, low=1)
        self._scale_momentum_mode = choice("scale_momentum_mode", scale_momentum_mode, _SCALE_MOMENTUM_MODES)
        self._log_lr_change_threshold = number("log_lr_change_threshold", log_lr_change_threshold, low=1)
        self._momentum = number("momentum", momentum, low=0, high=1)
        self._weight_decay = number("weight_decay", weight_decay, low=0)
        self._lr_factor = number("lr_factor", lr_factor, low=0, low_open=True)
        self._step_sizes = int_list("step_sizes", step_sizes, low=1)
        self._power = number("power", power, low=0, low_open=True)
        self._weight_decay_gn = number("weight_decay_gn", weight_decay_gn, low=0)
        self._dialect = choice("dialect", dialect, tuple(segments.WARMUPS))
        self._warm_up_lr = number("warm_up_lr", warm_up_lr, low=0, low_open=True)
        for name, value in (("gradual_increase_lr", gradual_increase_lr), ("nesterov", nesterov)):
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{key(name)} must be a bool, got {value!r}")
        self._gradual_increase_lr = bool(gradual_increase_lr)
        self._gradual_lr_step = number("gradual_lr_step", gradual_lr_step, low=0, low_open=True)
        self._gradual_lr_start = number("gradual_lr_start", gradual_lr_start, low=0, low_open=True)
        self._nesterov = bool(nesterov)
        self._weight_decay_bn = number("weight_decay_bn", weight_decay_bn, low=0)
        self._iter_size = integer("iter_size", iter_size, low=1)
        self._check_dialect()
        self._check_policy_keys()

    def _check_dialect(self):
        """The policies and warmups each dialect's own code can run (see docs/explanation/dialects.md)."""
        if self._dialect == "large_scale_vrd" and self._lr_policy != "variable_stepsize":
            raise ValueError(f"LR_POLICY must be 'variable_stepsize' for dialect 'large_scale_vrd' (its training "
                             f"loop always uses add_variable_stepsize_lr), got {self._lr_policy!r}")
        if self._dialect == "video_nonlocal":
            allowed = ("steps_with_lrs", "steps_with_relative_lrs", "steps_with_decay")
            if self._lr_policy not in allowed:
                raise ValueError(f"LR_POLICY must be one of {list(allowed)} for dialect 'video_nonlocal' (its "
                                 f"'step' reads SOLVER.STEP_SIZE, which its config lacks), got {self._lr_policy!r}")
            if self._warm_up_iters == 1:
                raise ValueError("WARMUP.WARMUP_END_ITER must be >= 2 (video-nonlocal-net divides by "
                                 "WARMUP_END_ITER - 1), got 1")

    def _check_policy_keys(self):
        steps = self._steps
        if steps and steps[0] != 0:
            raise ValueError(f"STEPS must start at 0, got {steps!r}")
        if any(later <= earlier for earlier, later in zip(steps, steps[1:])):
            raise ValueError(f"STEPS must be strictly increasing, got {steps!r}")
        policy = self._lr_policy
        if policy in _STEP_LIST_POLICIES and not steps:
            raise ValueError(f"STEPS must be non-empty for LR_POLICY {policy!r}, got {steps!r}")
        if policy in _LRS_POLICIES and len(self._lrs) != len(steps):
            raise ValueError(f"LRS must have one entry per STEPS entry ({len(steps)}) for LR_POLICY {policy!r}, "
                             f"got {self._lrs!r}")
        if policy == "variable_stepsize" and not self._step_sizes:
            raise ValueError(f"STEP_SIZES must be non-empty for LR_POLICY {policy!r}, got {self._step_sizes!r}")
        if sum(self._step_sizes) > MAX_INT:  # the last stage end is an iteration too
            raise ValueError(f"STEP_SIZES must sum to <= {MAX_INT}, got {self._step_sizes!r}")
        self._policy = segments.policy_for(self)
        self._warmup = segments.WARMUPS[self._dialect](self, self._policy)
        self._pieces = None
        decays = self._policy.decays()
        if decays is not None:  # GAMMA > 1: the largest exponent gives the largest LR
            try:
                largest = policies.decay_table(self._base_lr, self._gamma, decays, decays)
            except OverflowError:
                largest = np.array([np.inf])
            if not np.isfinite(largest).all():
                raise ValueError(f"GAMMA {self._gamma!r} overflows BASE_LR * GAMMA ** {decays} for "
                                 f"LR_POLICY {policy!r}")
        self._check_float32_lrs()

    def _critical_iterations(self):
        """The iterations where the LR, and the ratio of consecutive LRs, take their extreme values.

        Between phase starts (0, WARM_UP_ITERS, each step or stage start, MAX_ITER) the policy LR is constant or
        monotone and log-concave (cosine, exp, poly), and the warmup factor constant or linear, so log(LR) is
        concave there: the smallest LR of a phase is at its first or last iteration, the largest policy LR too (it
        is monotone), and the ratio LR(it) / LR(it - 1) is extreme at its first or last two iterations. For
        `step`, whose decays all last STEP_SIZE iterations, the same concavity in the decay count leaves the
        first and last decays and those around WARM_UP_ITERS. Returns a sorted list in `[0, hold_iter]`.
        """
        hold_iter = self.hold_iter
        starts = {0, self._max_iter, hold_iter, *self._warmup.starts(),
                  *self._policy.critical_starts(self._warm_up_iters)}
        return sorted({it for start in starts for it in range(start - 2, start + 2) if 0 <= it <= hold_iter})

    def _lr_keys(self, it):
        """`KEY=value, ...` of the keys the LR at `it` depends on (the warmup keys only while warming up)."""
        names = ["lr_policy", *self._policy.keys]
        if it < self._warm_up_iters:
            names += list(self._warmup.keys)
        return ", ".join(f"{key(name)}={getattr(self, '_' + name)!r}" for name in names)

    def _check_float32_lrs(self):
        """Reject a schedule whose float32 LR is not finite, or is 0 where it must be > 0 (everywhere, except at
        and after MAX_ITER for `cosine_decay` and `poly`, which are exactly 0 there by Detectron's formula), or
        whose momentum correction factor `new / cur` is not a finite float32 > 0.

        The LR is at most the policy LR (the warmup factor is <= 1), so checking the policy LR, and the LR, at the
        `_critical_iterations` covers every iteration: a handful of evaluations, not a table.
        """
        its = np.array(self._critical_iterations(), dtype=np.int64)
        with np.errstate(all="ignore"):
            policy_lrs = self._policy_lr(its)
            lrs = self.lr_at(its)
            may_be_zero = its >= self._max_iter if self._lr_policy in _ZERO_AT_MAX_ITER else np.zeros(its.shape, bool)
            too_large = ~np.isfinite(policy_lrs.astype(np.float32))
            # Subnormal float32 LRs are out too: TensorFlow flushes them to 0 on the CPU, so training would not see
            # the schedule's value.
            not_positive = ~(lrs >= _FLOAT32_TINY) & ~may_be_zero
            news = np.flatnonzero(np.diff(its) == 1) + 1  # consecutive iterations: (its[new - 1], its[new])
            applies, factors = momentum.correction_factors(lrs[news - 1], lrs[news], self.correction_mode,
                                                           self._scale_momentum_threshold)
            bad_factor = applies & ~(np.isfinite(factors) & (factors > 0)) & ~may_be_zero[news]
        bad_lrs = np.flatnonzero(too_large | not_positive)
        if bad_lrs.size:
            index = bad_lrs[0]
            it = int(its[index])
            if too_large[index]:
                warming = " (before the warmup factor)" if it < self._warm_up_iters else ""
                raise ValueError(f"the learning rate must be a finite float32 (<= {_FLOAT32_MAX!r}), got "
                                 f"{float(policy_lrs[index])!r}{warming} at iteration {it} from {self._lr_keys(it)}")
            where = " before MAX_ITER" if self._lr_policy in _ZERO_AT_MAX_ITER else ""
            raise ValueError(f"the float32 learning rate must be > 0{where} and a normal float32 (>= "
                             f"{_FLOAT32_TINY!r}: TensorFlow flushes smaller values to 0), got {float(lrs[index])!r} "
                             f"at iteration {it} from {self._lr_keys(it)}")
        if bad_factor.any():
            index = news[bad_factor][0]
            it = int(its[index])
            raise ValueError(f"the momentum correction factor must be a finite float32 > 0, got "
                             f"{float(factors[bad_factor][0])!r} at iteration {it} (learning rate "
                             f"{float(lrs[index - 1])!r} -> {float(lrs[index])!r}) from {self._lr_keys(it - 1)}, "
                             f"SCALE_MOMENTUM_MODE={self._scale_momentum_mode!r}")

    # ------------------------------------------------------------------ the schedule

    def _policy_lr(self, its):
        return self._policy.lr(its)

    def _lr64(self, its):
        """The float64 LR before its float32 rounding: the policy LR times the warmup factor while warming up."""
        return self._warmup.lr64(its, self._policy.lr(its))

    def lr_at(self, it):
        """The learning rate at 0-based iteration `it`, as Detectron's `get_lr_at_iter(it)`.

        Args:
            it: an int, or an integer array (vectorised: no Python loop).

        Returns:
            A Python float (the value of the float32) for an int; a float32 array of `it`'s shape for an array.
            Past `hold_iter` the LR holds.

        Raises:
            ValueError: for a negative iteration.
            TypeError: for a bool, a float or a non-integer array.
        """
        its, shape = _as_iterations(it, self.hold_iter)
        lr32 = self._lr64(its).astype(np.float32)
        return float(lr32[0]) if shape is None else lr32.reshape(shape)

    @property
    def hold_iter(self):
        """The iteration from which the LR never changes: `lr_at(it) == lr_at(hold_iter)` for every `it >=
        hold_iter`, so `lr_at(np.arange(hold_iter + 1))` is a complete lookup table.

        It is the last phase boundary at which the LR can change: the last multiple of STEP_SIZE up to MAX_ITER
        (`step`), the last STEPS entry, the last stage end, or MAX_ITER (continuous policies), and WARM_UP_ITERS
        if later (except for `cosine_decay` and `poly`, which hold 0 past MAX_ITER whatever the warmup). It is
        the smallest such iteration unless the values themselves repeat (GAMMA 1, equal LRS entries).
        """
        held_from = self._policy.held_from()
        if held_from is not None:
            return held_from
        return max(self._policy.last_change(), self._warmup.end())

    @property
    def warmup_end(self):
        """The first iteration the warmup no longer changes (WARM_UP_ITERS; Large-Scale-VRD: after its ramp)."""
        return self._warmup.end()

    @property
    def correction_mode(self):
        """`'off'` if not SCALE_MOMENTUM, else SCALE_MOMENTUM_MODE (`'threshold'` or `'every_change'`)."""
        return self._scale_momentum_mode if self._scale_momentum else "off"

    def momentum_corrections(self, stop, start=0, *, mode=None, threshold=None, limit=None):
        """Where the momentum-correction rule rescales the momentum buffers in `start..stop-1`.

        The result is that of a walk of every iteration, found from the pieces without one
        (`hvd_sched.segments.find_corrections`): the cost grows with the pieces and the corrections.

        As Detectron's training loop (`UpdateWorkspaceLr` / `_SetNewLr`): at each iteration `cur` is the LR
        of the previous iteration (0 before iteration 0, so iteration 0 never corrects) and `new = lr_at(it)`.
        For `start > 0` (a resumed run) `cur` at `start` is `lr_at(start - 1)`, as in an uninterrupted run;
        Detectron's LR blob restarts at 0 after a resume and so skips a correction due at `start`, hvd_sched
        deliberately does not.

        Args:
            stop: one past the last iteration walked (int >= 0), e.g. MAX_ITER.
            start: the first iteration walked (0 <= start <= stop).
            mode: the correction mode (default `correction_mode`; ScheduledOptimizer may override it).
            threshold: the ratio threshold (default SCALE_MOMENTUM_THRESHOLD).
            limit: return only the first `limit` (an `every_change` rule on a long continuous policy
                corrects at every float32 LR change: tens of millions of iterations), or None for all.

        Returns:
            A list of `(iteration, factor)`: `factor` is `new / cur` in float32, as a Python float.

        Raises:
            ValueError: for a negative `stop` or `start` outside `[0, stop]`.
            TypeError: for non-int arguments.
        """
        stop = integer("stop", stop, low=0, high=None, label="stop")
        start = integer("start", start, low=0, high=None, label="start")
        if start > stop:
            raise ValueError(f"start must be <= stop, got start={start}, stop={stop}")
        mode = self.correction_mode if mode is None else mode
        threshold = self._scale_momentum_threshold if threshold is None else threshold
        momentum.correction_factors([], [], mode, threshold)  # validates the rule
        # Past hold_iter the LR does not change, so no iteration after it can correct.
        if limit is not None:
            limit = integer("limit", limit, low=1, high=None, label="limit")
        its, factors = segments.find_corrections(self.pieces(), self.lr_at, self._lr64, start,
                                                 min(stop, self.hold_iter + 1), mode, threshold, limit)
        return [(int(it), float(factor)) for it, factor in zip(its.tolist(), factors.tolist())]

    def pieces(self):
        """The schedule as a short list of `hvd_sched.segments.Piece`: the policy's pieces joined with the
        warmup. Their number depends on the policy and its lists (STEPS, STEP_SIZES), never on MAX_ITER."""
        if self._pieces is None:
            self._pieces = self._warmup.join(self._policy.pieces())
        return list(self._pieces)

    def graph_lr(self, it, tf):
        """The LR at the scalar int64 tensor `it` as TensorFlow ops: `lr_at` in-graph, no table.

        The float64 formula of the policy and the warmup with the same operations as `lr_at`, then float32.

        Args:
            it: a scalar integer tensor, the iteration.
            tf: the `tensorflow` module (passed in: this layer imports no TensorFlow).

        Returns:
            A float32 scalar tensor.
        """
        return tf.cast(self.graph_lr64(it, tf), tf.float32)

    def graph_lr64(self, it, tf):
        """`graph_lr` before its float32 rounding (the `'any_change'` rule compares these).

        Args:
            it: a scalar integer tensor, the iteration.
            tf: the `tensorflow` module.

        Returns:
            A float64 scalar tensor.
        """
        it = tf.cast(it, tf.int64)
        return self._warmup.graph_lr64(it, self._policy.graph_lr(it, tf), tf)

    def boundaries(self):
        """Sorted unique iterations where a phase starts or ends: 0, WARM_UP_ITERS (if > 0), each step or stage
        end of the policy (`step`: the multiples of STEP_SIZE up to MAX_ITER), and MAX_ITER."""
        points = {0, self._max_iter, *self._policy.boundaries()}
        points.update(start for start in self._warmup.starts() if start > 0)
        return sorted(points)

    # ------------------------------------------------------------------ serialization

    def get_config(self):
        """Every constructor argument, JSON-friendly (lists, not tuples); `from_config` rebuilds an equal one.

        Returns:
            A new dict of the lower-case keys of `Schedule`'s arguments.

        Examples:
            >>> import json
            >>> s = Schedule(base_lr=0.1, lr_policy="cosine_decay", max_iter=1000)
            >>> Schedule.from_config(json.loads(json.dumps(s.get_config()))) == s
            True
        """
        return {
            "base_lr": self._base_lr, "lr_policy": self._lr_policy, "gamma": self._gamma,
            "step_size": self._step_size, "steps": list(self._steps), "lrs": list(self._lrs),
            "max_iter": self._max_iter, "warm_up_iters": self._warm_up_iters,
            "warm_up_factor": self._warm_up_factor, "warm_up_method": self._warm_up_method,
            "scale_momentum": self._scale_momentum, "scale_momentum_threshold": self._scale_momentum_threshold,
            "scale_momentum_mode": self._scale_momentum_mode,
            "log_lr_change_threshold": self._log_lr_change_threshold, "momentum": self._momentum,
            "weight_decay": self._weight_decay, "lr_factor": self._lr_factor,
            "step_sizes": list(self._step_sizes), "power": self._power, "weight_decay_gn": self._weight_decay_gn,
            "dialect": self._dialect, "warm_up_lr": self._warm_up_lr, "gradual_increase_lr": self._gradual_increase_lr,
            "gradual_lr_step": self._gradual_lr_step, "gradual_lr_start": self._gradual_lr_start,
            "nesterov": self._nesterov, "weight_decay_bn": self._weight_decay_bn, "iter_size": self._iter_size,
        }

    @classmethod
    def from_config(cls, config):
        """`cls(**config)`: the inverse of `get_config` (also after a JSON round trip).

        Args:
            config: a dict of `get_config()` keys (lower case; `from_detectron` reads the upper-case SOLVER keys).

        Returns:
            A new `Schedule`.
        """
        return cls(**config)

    def __eq__(self, other):
        if not isinstance(other, Schedule):
            return NotImplemented
        return self.get_config() == other.get_config()

    __hash__ = None

    def __repr__(self):
        arguments = ", ".join(f"{name}={value!r}" for name, value in self.get_config().items())
        return f"{type(self).__name__}({arguments})"


def _read_only(name):
    def getter(self):
        value = getattr(self, "_" + name)
        return list(value) if isinstance(value, list) else value

    return property(getter, doc=f"{name.upper()} (read-only; see the class docstring).")


for _name in inspect.signature(Schedule.__init__).parameters:
    if _name != "self":
        setattr(Schedule, _name, _read_only(_name))
del _name
