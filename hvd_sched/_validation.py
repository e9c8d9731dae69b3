"""The validators every layer uses (the bottom layer: numpy and the standard library, nothing else of hvd_sched).

Two wordings, one per audience:

- **Config keys** (`number`, `integer`, `int_list`, ...): the error names the Detectron key, upper case,
  and the value, e.g. `WARM_UP_FACTOR must be in (0, 1], got 1.5`. `Schedule`, `from_detectron` and the
  dialects use these, so a message reads the same whichever door a value came in by.
- **Function arguments** (`argument_number`, `name_rules`): Keras' own wording for argument errors
  (``Argument `x` must be ... Received: x=...``), for the Keras glue.

Every validator returns the value as the plain Python type it checked (`float`, `int`, a new `list`), so
callers never keep, nor mutate, the caller's objects.

Example:
    >>> integer("max_iter", 90000, low=1)
    90000
    >>> number("warm_up_factor", 1.5, low=0, high=1, low_open=True)
    Traceback (most recent call last):
    ...
    ValueError: WARM_UP_FACTOR must be in (0, 1], got 1.5
"""

import difflib
import math
import numbers
import re

import numpy as np

__all__ = [
    "MAX_INT",
    "key",
    "safe_repr",
    "to_float",
    "number",
    "integer",
    "sequence",
    "int_list",
    "float_list",
    "string",
    "choice",
    "boolean",
    "close_match_hint",
    "argument_number",
    "name_rules",
]

# The largest int accepted for an iteration count, a world size or steps per epoch (MAX_ITER, STEP_SIZE, each STEPS
# entry and sum(STEP_SIZES), WARM_UP_ITERS, REFERENCE_WORLD_SIZE, world_size, ...): 2**53, about 9e15 iterations.
# Every such int is exact as a float64, so Detectron's float(cur_iter) / MAX_ITER sees the true iteration, and the
# int64 arithmetic of lr_at (sums, it // STEP_SIZE, hold_iter + 1) cannot overflow.
MAX_INT = 2**53


def key(name):
    """The Detectron key of a `Schedule` argument: `'warm_up_iters'` -> `'WARM_UP_ITERS'`."""
    return name.upper()


def safe_repr(value):
    """`repr(value)`, or a summary when it holds an int too long to print (`sys.get_int_max_str_digits`)."""
    try:
        return repr(value)
    except ValueError:
        return f"<{type(value).__name__} too large to print>"


def to_float(value):
    """`float(value)`, or nan for a real beyond float64 (`10**400`), which the callers reject as not finite."""
    try:
        return float(value)
    except OverflowError:
        return math.nan


def _is_bool(value):
    return isinstance(value, (bool, np.bool_))


def _is_real(value):
    """A real number that is not a bool (`True` is an int to Python, never a number to a config)."""
    return not _is_bool(value) and isinstance(value, numbers.Real)


def _is_int(value):
    return not _is_bool(value) and isinstance(value, numbers.Integral)


def number(name, value, *, low=None, high=None, low_open=False):
    """A finite real (not bool) `>= low` (`> low` if `low_open`) and `<= high`, as a Python float.

    Args:
        name: the `Schedule` argument; the message names its key (upper case).
        value: the value to check.
        low: the lower bound (required).
        high: the upper bound, or None.
        low_open: exclude `low` itself.

    Raises:
        TypeError: `BASE_LR must be a number, got '0.1' (str)`.
        ValueError: `WARM_UP_FACTOR must be in (0, 1], got 1.5` (also for nan and inf).
    """
    if not _is_real(value):
        raise TypeError(f"{key(name)} must be a number, got {safe_repr(value)} ({type(value).__name__})")
    if high is not None:
        bound = f"in {'(' if low_open else '['}{low}, {high}]"
    else:
        bound = f"{'>' if low_open else '>='} {low}"
    as_float = to_float(value)
    too_low = as_float <= low if low_open else as_float < low
    if not math.isfinite(as_float) or too_low or (high is not None and as_float > high):
        raise ValueError(f"{key(name)} must be {bound}, got {safe_repr(value)}")
    return as_float


def integer(name, value, *, low=0, high=MAX_INT, label=None):
    """An int (not bool, not float) in `[low, high]` (`high` None: unbounded), as a Python int.

    `label` replaces the upper-cased key in the message (for function arguments such as `world_size`).

    Raises:
        TypeError: `MAX_ITER must be an int, got 1.5 (float)`.
        ValueError: `MAX_ITER must be >= 1, got 0`.
    """
    label = label or key(name)
    if not _is_int(value):
        raise TypeError(f"{label} must be an int, got {safe_repr(value)} ({type(value).__name__})")
    if value < low:
        raise ValueError(f"{label} must be >= {low}, got {safe_repr(int(value))}")
    if high is not None and value > high:
        raise ValueError(f"{label} must be <= {high}, got {safe_repr(int(value))}")
    return int(value)


def sequence(name, value):
    """A list, tuple or 1-d array as a new list; the entries are not checked."""
    # A 0-d or 2-d array is not a list of entries (list() of a 0-d array would raise numpy's unnamed TypeError).
    if not (isinstance(value, (list, tuple)) or isinstance(value, np.ndarray) and value.ndim == 1):
        raise TypeError(f"{key(name)} must be a list, got {safe_repr(value)} ({type(value).__name__})")
    return list(value)


def int_list(name, value, *, low=0, high=MAX_INT):
    """A sequence of ints in `[low, high]`, as a new list of Python ints; the message shows the whole list."""
    items = sequence(name, value)
    for item in items:
        if not _is_int(item):
            raise TypeError(f"{key(name)} must be a list of ints, got {safe_repr(items)}")
        if item < low:
            raise ValueError(f"{key(name)} entries must be >= {low}, got {safe_repr(items)}")
        if item > high:
            raise ValueError(f"{key(name)} entries must be <= {high}, got {safe_repr(items)}")
    return [int(item) for item in items]


def float_list(name, value):
    """A sequence of finite reals > 0, as a new list of Python floats; the message shows the whole list."""
    items = sequence(name, value)
    for item in items:
        if not _is_real(item):
            raise TypeError(f"{key(name)} must be a list of numbers, got {safe_repr(items)}")
        if not (math.isfinite(to_float(item)) and item > 0):
            raise ValueError(f"{key(name)} entries must be finite and > 0, got {safe_repr(items)}")
    return [float(item) for item in items]


def string(label, value):
    """A `str`; `label` is the key as the message names it (`LR_POLICY`)."""
    if not isinstance(value, str):
        raise TypeError(f"{label} must be a string, got {value!r} ({type(value).__name__})")
    return value


def choice(name, value, choices):
    """A string among `choices`; the message lists them."""
    string(key(name), value)
    if value not in choices:
        raise ValueError(f"unknown {key(name)} {value!r}; expected one of {list(choices)}")
    return value


def boolean(label, value):
    """A Python `bool` (not 0/1, not a numpy bool); `label` is the key as the message names it."""
    if not isinstance(value, bool):
        raise TypeError(f"{label} must be a bool, got {value!r} ({type(value).__name__})")
    return value


def close_match_hint(name, valid):
    """The end of an "unknown key" message: `; did you mean 'MAX_ITER'?`, else `; valid keys: [...]`."""
    close = difflib.get_close_matches(name.upper(), valid, n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; valid keys: {sorted(valid)}"


def _bound_text(low):
    # 0.0 reads "0" as Keras writes it; a fractional bound keeps its repr.
    return repr(int(low)) if float(low).is_integer() else repr(low)


def argument_number(argument, value, *, low=0.0, low_open=False, allow_none=False, say_none=None):
    """A function argument that is a finite real `>= low` (`> low` if `low_open`), as a float, in Keras'
    wording.

    Args:
        argument: the argument's name.
        value: the value received.
        low: the lower bound.
        low_open: exclude `low` itself.
        allow_none: return None for None instead of raising.
        say_none: whether the message says `or None` (default: `allow_none`). False keeps None out of the
            message of an argument whose None means "the default", not a value a user would write.

    Returns:
        A Python float, or None.

    Raises:
        TypeError: ``Argument `decay` must be a number. Received: decay='0' (str)`` (bools included).
        ValueError: ``Argument `decay` must be a finite number >= 0. Received: decay=nan``.
    """
    say_none = allow_none if say_none is None else say_none
    or_none = " or None" if say_none else ""
    if value is None and allow_none:
        return None
    if not _is_real(value):
        raise TypeError(f"Argument `{argument}` must be a number{or_none}. "
                        f"Received: {argument}={safe_repr(value)} ({type(value).__name__})")
    as_float = to_float(value)
    too_low = as_float <= low if low_open else as_float < low
    if not math.isfinite(as_float) or too_low:
        raise ValueError(f"Argument `{argument}` must be a finite number {'>' if low_open else '>='} "
                         f"{_bound_text(low)}{or_none}. Received: {argument}={safe_repr(value)}")
    return as_float


def name_rules(argument, rules, value_name):
    """Rules that map variable-name regexes to a number each (a factor, a decay), first match wins.

    Args:
        argument: the argument's name (`'lr_multipliers'`).
        rules: a dict of regex -> finite number >= 0 (in the order they are tried), or None (no rule).
        value_name: what a value is, for the message (`'factor'`, `'decay'`).

    Returns:
        A tuple of `(pattern, compiled regex, float)`, in the dict's order; `()` for None.

    Raises:
        TypeError: for a non-dict or a non-string key.
        ValueError: for a key that is not a valid regex, or a value that is not a finite number >= 0.
    """
    if rules is None:
        return ()
    if not isinstance(rules, dict):
        raise TypeError(f"{argument} must be a dict of variable-name regex -> {value_name}, got "
                        f"{type(rules).__name__}: {rules!r}")
    pairs = []
    for pattern, value in rules.items():
        if not isinstance(pattern, str):
            raise TypeError(f"{argument} keys must be regex strings, got {pattern!r}")
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{argument} key {pattern!r} is not a valid regex: {exc}") from None
        if not _is_real(value) or not math.isfinite(to_float(value)) or value < 0:
            raise ValueError(f"{argument}[{pattern!r}] must be a finite number >= 0, got {safe_repr(value)}")
        pairs.append((pattern, compiled, float(value)))
    return tuple(pairs)
