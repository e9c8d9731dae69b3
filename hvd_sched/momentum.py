"""The momentum-correction rule of Detectron's solver (layer 2: numpy only, no state).

Caffe2's `MomentumSGDUpdate` (and Keras' SGD) keep the update history `V := mu * V + lr * grad` with the
learning rate folded in, so when the LR changes from `cur` to `new` the history is rescaled by `new / cur`
to stay compatible with `lr * grad` (Detectron's `DetectionModelHelper._SetNewLr` / `_CorrectMomentum`;
Goyal et al., arXiv:1706.02677, section 2.1 "momentum correction").

The rule, its modes and its precision are documented once, in `correction_factors`.
"""

import numbers

import numpy as np

__all__ = ["MODES", "DIALECT_MODES", "lr_change_ratio", "correction_factor", "correction_factors", "graph_correction_factor"]

MODES = ("threshold", "every_change", "off")
"""The values of `SOLVER.SCALE_MOMENTUM_MODE` (`'off'` is what `SCALE_MOMENTUM: False` means); the rules:
`correction_factors`."""
DIALECT_MODES = ("any_change", "relative_change")
"""The modes of the other Detectron-family dialects (`from_detectron(..., dialect=...)` picks them)."""
_ALL_MODES = MODES + DIALECT_MODES

# Detectron's _get_lr_change_ratio eps and _SetNewLr guard.
_RATIO_EPS = 1e-10
_MIN_CUR_LR = 1e-7
# video-nonlocal-net's relative guard: abs(new - cur) > abs(1e-7 * new).
_RELATIVE_CHANGE = 1e-7


def _as_float32(values, name):
    array = np.asarray(values)
    if array.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be numbers, got {values!r}")
    return array.astype(np.float32)


def _check_rule(mode, threshold):
    if not isinstance(mode, str) or mode not in _ALL_MODES:
        raise ValueError(f"SCALE_MOMENTUM_MODE must be one of {list(_ALL_MODES)}, got {mode!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
        raise TypeError(f"SCALE_MOMENTUM_THRESHOLD must be a number, got {threshold!r}")
    if not threshold >= 1.0 or threshold == float("inf"):
        raise ValueError(f"SCALE_MOMENTUM_THRESHOLD must be a finite number >= 1, got {threshold!r}")


def _ratio64(cur32, new32):
    cur64 = cur32.astype(np.float64)
    new64 = new32.astype(np.float64)
    return np.maximum(new64 / np.maximum(cur64, _RATIO_EPS), cur64 / np.maximum(new64, _RATIO_EPS))


def lr_change_ratio(cur_lr, new_lr):
    """Detectron's `_get_lr_change_ratio`: `max(new / max(cur, 1e-10), cur / max(new, 1e-10))`.

    Args:
        cur_lr: the LR before the change (scalar or array; converted to float32).
        new_lr: the LR after the change (same shape).

    Returns:
        A Python float for scalars, else a float64 array.

    Examples:
        >>> lr_change_ratio(0.02, 0.002)
        9.999999301508103
        >>> lr_change_ratio([0.0, 0.1], [0.1, 0.1]).tolist()
        [1000000014.9011612, 1.0]
    """
    cur32 = _as_float32(cur_lr, "cur_lr")
    new32 = _as_float32(new_lr, "new_lr")
    ratio = _ratio64(cur32, new32)
    return float(ratio) if ratio.ndim == 0 else ratio


def correction_factors(cur_lrs, new_lrs, mode="threshold", threshold=1.1, cur_lrs64=None, new_lrs64=None):
    """Where the momentum-correction rule rescales the momentum buffers, and by how much (vectorised).

    The rule alone, as Detectron's `_SetNewLr` applies it; `correction_factor` is its scalar form, and
    `Schedule.momentum_corrections` applies it to `lr_at(it - 1)` and `lr_at(it)`.

    Modes (`SOLVER.SCALE_MOMENTUM` / `SOLVER.SCALE_MOMENTUM_MODE`):

    - `'threshold'` (Detectron): rescale when `cur > 1e-7` and `max(new / max(cur, 1e-10), cur / max(new,
      1e-10)) > SCALE_MOMENTUM_THRESHOLD`, both strict.
    - `'every_change'` (the seed's `add_variable_stepsize_lr`): rescale whenever `new != cur`, keeping the
      `cur > 1e-7` guard (before the first iteration `cur` is 0 and there is nothing to rescale).
    - `'any_change'` (Large-Scale-VRD's `add_variable_stepsize_lr`): rescale whenever the unrounded (float64)
      LR changes, by `new / prev` of the unrounded LRs; no threshold and no guard (its LRs are never 0).
    - `'relative_change'` (video-nonlocal-net's `_SetNewLr`): rescale when the float32 LR changes and
      `abs(new - cur) > abs(1e-7 * new)` (the float32 difference compared in float64, as under NumPy 1.x).
    - `'off'`: never.

    The LRs are float32, as Detectron's LR blob is: inputs are converted to float32 first, the ratio is computed in
    float64 from those float32 values (NumPy 1.x promotes `np.max((float32, 1e-10))` to float64), the `1e-7`
    guard compares in float64 (as `np.float32 > float` does), and the factor is `new / cur` in float32.

    Args:
        cur_lrs: LRs before each change (the previous iteration's LR, 0 before the first).
        new_lrs: LRs after each change (same shape).
        mode: one of `MODES` (or a dialect's `'any_change'` / `'relative_change'`).
        threshold: `SCALE_MOMENTUM_THRESHOLD` (`>= 1`), used by `'threshold'` only.
        cur_lrs64: the unrounded float64 LRs before (`'any_change'` only; default `cur_lrs`).
        new_lrs64: the unrounded float64 LRs after (`'any_change'` only; default `new_lrs`).

    Returns:
        `(mask, factors)`: a bool array, True where the rule rescales, and a float32 array holding `new / cur`
        there and 1.0 elsewhere.

    Raises:
        ValueError: for an unknown mode, a threshold below 1, or arrays of different shapes.
        TypeError: for non-numeric input.

    Examples:
        >>> mask, factors = correction_factors([0.0, 0.02, 0.02, 0.002], [0.02, 0.02, 0.002, 0.0019])
        >>> mask.tolist(), factors.tolist()
        ([False, False, True, False], [1.0, 1.0, 0.10000000894069672, 1.0])
        >>> correction_factors([0.002], [0.0019], mode="every_change")[1].tolist()
        [0.949999988079071]
    """
    _check_rule(mode, threshold)
    cur32 = _as_float32(cur_lrs, "cur_lrs")
    new32 = _as_float32(new_lrs, "new_lrs")
    if cur32.shape != new32.shape:
        raise ValueError(f"cur_lrs and new_lrs must have the same shape, got {cur32.shape} and {new32.shape}")
    factors = np.ones(new32.shape, dtype=np.float32)
    if mode == "off":
        return np.zeros(new32.shape, dtype=bool), factors
    if mode == "any_change":
        cur64 = np.asarray(cur_lrs if cur_lrs64 is None else cur_lrs64, dtype=np.float64)
        new64 = np.asarray(new_lrs if new_lrs64 is None else new_lrs64, dtype=np.float64)
        mask = new64 != cur64
        with np.errstate(divide="ignore", invalid="ignore"):
            factors[mask] = (new64[mask] / cur64[mask]).astype(np.float32)
        return mask, factors
    # Detectron calls _SetNewLr only when the float32 LR changes; the guards compare in float64.
    mask = new32 != cur32
    if mode == "relative_change":
        delta = np.abs((new32 - cur32).astype(np.float32)).astype(np.float64)
        mask &= delta > np.abs(_RELATIVE_CHANGE * new32.astype(np.float64))
    else:
        mask &= cur32.astype(np.float64) > _MIN_CUR_LR
        if mode == "threshold":
            mask &= _ratio64(cur32, new32) > threshold
    factors[mask] = new32[mask] / cur32[mask]
    return mask, factors


def correction_factor(cur_lr, new_lr, mode="threshold", threshold=1.1):
    """The factor the rule rescales the momentum buffers by when the LR goes from `cur_lr` to `new_lr`.

    The scalar form of `correction_factors`, which states the rule and its modes.

    Args:
        cur_lr: the LR before (scalar; Detectron's LR blob starts at 0).
        new_lr: the LR after (scalar).
        mode: one of `MODES`.
        threshold: `SCALE_MOMENTUM_THRESHOLD`.

    Returns:
        `np.float32(new / cur)` where the rule rescales, else None.

    Raises:
        ValueError: for an unknown mode or a threshold below 1.
        TypeError: for non-scalar or non-numeric input.

    Examples:
        >>> float(correction_factor(0.02, 0.002))
        0.10000000894069672
        >>> print(correction_factor(0.0200, 0.0199))   # a ratio below SCALE_MOMENTUM_THRESHOLD 1.1
        None
    """
    for name, value in (("cur_lr", cur_lr), ("new_lr", new_lr)):
        if isinstance(value, (bool, np.bool_)) or np.ndim(value) != 0:
            raise TypeError(f"{name} must be a number, got {value!r}")
    mask, factors = correction_factors(np.array([cur_lr]), np.array([new_lr]), mode, threshold)
    return factors[0] if mask[0] else None


def graph_correction_factor(cur_lr, new_lr, mode, threshold, tf, cur_lr64=None, new_lr64=None):
    """`correction_factors` for one step as TensorFlow ops: the factor, 1.0 where the rule does not fire.

    The same comparisons in the same precisions: float32 `new != cur`, the float64 guards and ratio, and the
    float32 quotient `new / cur` (`'any_change'`: the float64 LRs and their quotient rounded to float32).
    `tf` is the TensorFlow module (passed in: this layer imports no TensorFlow).

    Args:
        cur_lr: float32 scalar tensor, the LR of the previous iteration.
        new_lr: float32 scalar tensor, this iteration's LR.
        mode: one of `MODES`.
        threshold: `SCALE_MOMENTUM_THRESHOLD` (`'threshold'` mode).
        tf: the `tensorflow` module.
        cur_lr64: float64 scalar tensor, the unrounded previous LR (`'any_change'`).
        new_lr64: float64 scalar tensor, the unrounded LR (`'any_change'`).

    Returns:
        A float32 scalar tensor.
    """
    _check_rule(mode, threshold)
    one = tf.constant(1.0, tf.float32)
    if mode == "off":
        return one
    if mode == "any_change":
        fires = tf.not_equal(new_lr64, cur_lr64)
        safe = tf.where(fires, cur_lr64, tf.constant(1.0, tf.float64))
        return tf.where(fires, tf.cast(new_lr64 / safe, tf.float32), one)
    cur64, new64 = tf.cast(cur_lr, tf.float64), tf.cast(new_lr, tf.float64)
    fires = tf.not_equal(new_lr, cur_lr)
    if mode == "relative_change":
        delta = tf.cast(tf.abs(new_lr - cur_lr), tf.float64)
        fires = tf.logical_and(fires, delta > tf.abs(_RELATIVE_CHANGE * new64))
    else:
        fires = tf.logical_and(fires, cur64 > _MIN_CUR_LR)
        if mode == "threshold":
            ratio = tf.maximum(new64 / tf.maximum(cur64, _RATIO_EPS), cur64 / tf.maximum(new64, _RATIO_EPS))
            fires = tf.logical_and(fires, ratio > float(threshold))
    return tf.where(fires, new_lr / tf.where(fires, cur_lr, one), one)
