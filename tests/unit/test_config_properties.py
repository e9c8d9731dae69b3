"""Property tests (hypothesis) over random SOLVER configs: a sound schedule, or ValueError/TypeError, nothing else.

``solvers()`` draws every key of ``SOLVER_KEYS`` / ``EPOCH_KEYS`` absent, valid or invalid (wrong type, out of
range, random lists), random policies, iteration or epoch units, linear scaling and the two keyword arguments. Then
either ``from_detectron`` raises ValueError/TypeError naming a key or argument, or the schedule it builds is sound:

- ``lr_at(np.arange(MAX_ITER + 1))`` is float32, finite, and > 0 on ``[0, MAX_ITER)``. At ``MAX_ITER`` itself
  ``cosine_decay`` and ``poly`` are exactly 0 (Detectron's ``0.5 * (cos(pi) + 1)``, and ``(1 - 1) ** POWER``; the
  warmup factor cannot lift a 0), every other policy is > 0;
- ``lr_at(int)`` is the array's value; every momentum correction is at an LR change whose previous LR is > 1e-7,
  and its factor is the finite, positive float32 ``lr[it] / lr[it - 1]``;
- ``Schedule.from_config`` of the JSON round trip of ``get_config()`` is an equal schedule.

Values are drawn well past float32 (BASE_LR and LRS from 1e-50 to 1e40, GAMMA ** decays over 100 decades,
WARM_UP_FACTOR down to 1e-300, POWER up to 1000) and past the 2**53 bound of the int keys, as well as in the usual
ranges: a schedule whose float32 LR would overflow or underflow must be rejected when it is built.
"""

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from detectron_scalar import reference_walk, valid_solvers, walk_stop
from hvd_sched import (
    EPOCH_KEYS,
    POLICIES,
    SOLVER_KEYS,
    WARM_UP_METHODS,
    Schedule,
    from_detectron,
    gradual_warmup_factor,
    linear_scaled_lr,
    linear_scaled_lr_for_batch,
)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NAN, INF = float("nan"), float("inf")
ZERO_AT_MAX_ITER = ("cosine_decay", "poly")
STEP_LIST_POLICIES = ("steps_with_decay", "steps_with_lrs", "steps_with_relative_lrs")
# What an error message must name: a key, an argument, or the SOLVER section.
NAMES = (*SOLVER_KEYS, *EPOCH_KEYS, "steps_per_epoch", "world_size", "SOLVER", "solver")

# ---------------------------------------------------------------------------- strategies

WRONG_TYPES = [None, True, False, "0.1", "", [1], (1, 2), {"a": 1}, 1j, b"1"]
HUGE = 10**400  # beyond float64
NUMBER_OUT_OF_RANGE = {"> 0": [0, -1.0, NAN, INF, -INF, HUGE], ">= 0": [-1e-3, NAN, INF, HUGE],
                       "(0, 1]": [0, 1.5, -0.5, NAN, HUGE], "[0, 1]": [-0.1, 1.01, NAN, INF, HUGE],
                       ">= 1": [0.5, 0, NAN, INF, HUGE]}
INT_INVALID = [-1, 1.5, 100.0, NAN, np.float64(3.0), 2**53 + 1, 2**64, HUGE]


def _usual_or_wide(low, high, low_exponent, high_exponent):
    """A float in the usual ``[low, high]``, or ``10 ** e`` for ``e`` in ``[low_exponent, high_exponent]``."""
    return st.one_of(st.floats(low, high), st.floats(low_exponent, high_exponent).map(lambda e: 10.0**e))


def _usual_or_huge(low, high):
    """An int in the usual ``[low, high]``, or up to the 2**53 bound."""
    return st.one_of(st.integers(low, high), st.integers(low, 2**53))


def _invalid_number(bound):
    return st.sampled_from(WRONG_TYPES + NUMBER_OUT_OF_RANGE[bound])


def _invalid_int(low):
    return st.sampled_from(WRONG_TYPES + INT_INVALID + ([0] if low == 1 else []))


def _invalid_list(entries):
    """Not a list, or a random list that may be unsorted, hold duplicates or bad entries."""
    return st.one_of(st.sampled_from(["0, 10", 10, None, {0: 1}, {0, 10}, True]),
                     st.lists(st.one_of(entries, st.sampled_from([-1, 0, 1.5, NAN, "1", None])), max_size=5))


_ABSENT = object()


def _mode(draw, required=False):
    """``'absent'`` (1 in 5, none if required; the shrink target), ``'invalid'`` (1 in 20) or ``'valid'``.

    The rare outcomes sit in the middle of the range, away from the endpoints hypothesis favours.
    """
    mode = draw(st.integers(0, 99))
    if mode < 20:
        return "valid" if required else "absent"
    return "invalid" if 50 <= mode < 55 else "valid"


def _pick(draw, valid, invalid, required=False):
    """A key's value, ``_ABSENT``, valid or invalid, as ``_mode`` says."""
    mode = _mode(draw, required)
    return _ABSENT if mode == "absent" else draw(invalid if mode == "invalid" else valid)


def _iterations_or_epochs(draw, solver, key, iterations, steps_per_epoch):
    """Put an iteration count (or list) under its iteration key, or its epoch key when steps_per_epoch is an int."""
    epoch_key = {value: key for key, value in EPOCH_KEYS.items()}[key]
    if isinstance(steps_per_epoch, int) and steps_per_epoch > 0 and draw(st.booleans()):
        def to_epochs(value):
            return value / steps_per_epoch if value % steps_per_epoch else value // steps_per_epoch
        solver[epoch_key] = [to_epochs(v) for v in iterations] if isinstance(iterations, list) else \
            to_epochs(iterations)
        if draw(st.integers(0, 99)) == 50:  # both units of one key: an error
            solver[key] = iterations
    else:
        solver[key] = iterations


@st.composite
def solvers(draw):
    """``(solver, kwargs)`` for ``from_detectron(solver, **kwargs)``."""
    solver, kwargs = {}, {}
    steps_per_epoch = _pick(draw, st.integers(1, 100), st.sampled_from([0, -1, 2.0, "10", True]))
    if steps_per_epoch is not _ABSENT:
        kwargs["steps_per_epoch"] = steps_per_epoch
    world_size = _pick(draw, st.integers(1, 16), st.sampled_from([0, -2, 4.0, "8", True]))
    if world_size is not _ABSENT:
        kwargs["world_size"] = world_size
    scaling = isinstance(world_size, int) and not isinstance(world_size, bool) and world_size > 0

    def put(key, valid, invalid, required=False):
        value = _pick(draw, valid, invalid, required)
        if value is not _ABSENT:
            solver[key] = value
        return value

    policy = put("LR_POLICY", st.sampled_from(POLICIES), st.sampled_from(WRONG_TYPES + ["cosine", "Step", "step "]))
    # MAX_ITER is always given (<= 5000, or an invalid value), so that lr_at(np.arange(MAX_ITER + 1)) stays small.
    max_iter = draw(_invalid_int(1)) if draw(st.integers(0, 19)) == 19 else draw(st.integers(1, 5000))
    if isinstance(max_iter, int) and not isinstance(max_iter, bool) and 1 <= max_iter <= 2**53:
        _iterations_or_epochs(draw, solver, "MAX_ITER", max_iter, steps_per_epoch)
    else:
        solver["MAX_ITER"] = max_iter
    decays = 1
    for key, low, high in (("STEP_SIZE", 1, 5000), ("WARM_UP_ITERS", 0, 6000)):
        value = _pick(draw, _usual_or_huge(low, high), _invalid_int(low))
        if value is _ABSENT:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= 2**53:
            _iterations_or_epochs(draw, solver, key, value, steps_per_epoch)
            if key == "STEP_SIZE" and isinstance(max_iter, int) and max_iter <= 5000:  # not an invalid 10**400
                decays = max(decays, max_iter // value)
        else:
            solver[key] = value
    steps = _pick(draw, st.lists(st.integers(1, 6000), unique=True, max_size=5).map(lambda xs: [0, *sorted(xs)]),
                  _invalid_list(st.integers(0, 6000)), required=policy in STEP_LIST_POLICIES)
    if steps is not _ABSENT:
        if isinstance(steps, list) and steps and steps[0] == 0 and all(isinstance(s, int) for s in steps):
            _iterations_or_epochs(draw, solver, "STEPS", steps, steps_per_epoch)
        else:
            solver["STEPS"] = steps
    n_steps = len(steps) if isinstance(steps, list) else 1
    lr_entries = _usual_or_wide(1e-4, 10, -50, 40)
    if draw(st.integers(0, 9)):  # usually one LRS entry per STEPS entry
        put("LRS", st.lists(lr_entries, min_size=n_steps, max_size=n_steps), _invalid_list(lr_entries),
            required=policy in STEP_LIST_POLICIES[1:])
    else:
        put("LRS", st.lists(lr_entries, max_size=6), _invalid_list(lr_entries))
    step_sizes = _pick(draw, st.lists(st.integers(1, 3000), min_size=1, max_size=5), _invalid_list(st.integers(1, 9)),
                       required=policy == "variable_stepsize")
    if step_sizes is not _ABSENT:
        if isinstance(step_sizes, list) and step_sizes and all(isinstance(s, int) and s > 0 for s in step_sizes):
            _iterations_or_epochs(draw, solver, "STEP_SIZES", step_sizes, steps_per_epoch)
        else:
            solver["STEP_SIZES"] = step_sizes
    # GAMMA ** decays spans up to 100 decades over all decays (exp_decay has one), well past float32's 83.
    decays = max(decays, n_steps, len(step_sizes) if isinstance(step_sizes, list) else 1)
    span = min(40.0, 100.0 / (2 * decays + 2)) if policy in (_ABSENT, "step") else min(40.0, 100.0 / (decays + 1))
    put("GAMMA", st.floats(-span, span).map(lambda exponent: 10.0**exponent), _invalid_number("> 0"))
    put("BASE_LR", _usual_or_wide(1e-4, 10, -50, 40), _invalid_number("> 0"))
    put("POWER", _usual_or_wide(0.1, 2, -3, 3), _invalid_number("> 0"))
    put("LR_FACTOR", st.floats(1e-2, 100), _invalid_number("> 0"))
    put("WEIGHT_DECAY", st.floats(0, 0.1), _invalid_number(">= 0"))
    put("MOMENTUM", st.floats(0, 1), _invalid_number("[0, 1]"))
    warm_up_factors = _usual_or_wide(1e-3, 1, -300, 0)
    put("WARM_UP_FACTOR", st.one_of(warm_up_factors, st.just("horovod")) if scaling else warm_up_factors,
        st.sampled_from([None, True, "gradual", [0.5]] + NUMBER_OUT_OF_RANGE["(0, 1]"]))
    put("WARM_UP_METHOD", st.sampled_from(WARM_UP_METHODS), st.sampled_from(WRONG_TYPES + ["gradual", "Linear"]))
    put("SCALE_MOMENTUM", st.booleans(), st.sampled_from([1, 0, "True", None, 1.0]))
    put("SCALE_MOMENTUM_THRESHOLD", st.floats(1, 5), _invalid_number(">= 1"))
    put("SCALE_MOMENTUM_MODE", st.sampled_from(["threshold", "every_change"]),
        st.sampled_from(WRONG_TYPES + ["off", "always"]))
    put("LOG_LR_CHANGE_THRESHOLD", st.floats(1, 5), _invalid_number(">= 1"))
    put("REFERENCE_WORLD_SIZE", st.integers(0, 16) if scaling else st.just(0), _invalid_int(0))

    extra = draw(st.integers(0, 99))
    if extra == 50:
        solver["WARMUP_ITERS"] = 100  # a typo
    elif extra == 51:
        solver["base_lr"] = 0.1  # lower case
    elif extra == 52:
        solver[3] = 1  # not a string
    elif extra == 53 and scaling:
        solver["REFERENCE_WORLD_SIZE"] = 8
        del kwargs["world_size"]  # REFERENCE_WORLD_SIZE without world_size
    if draw(st.booleans()):
        solver = {"SOLVER": solver, "MODEL": {"TYPE": "generalized_rcnn"}, "NUM_GPUS": 8}
    return solver, kwargs


# ---------------------------------------------------------------------------- the properties

FASTER_RCNN = {"BASE_LR": 0.02, "LR_POLICY": "steps_with_decay", "STEPS": [0, 600, 800], "MAX_ITER": 900}


@SETTINGS
@given(solvers(), st.lists(st.integers(0, 10**4), max_size=4))
@example((FASTER_RCNN, {}), [])
@example(({"SOLVER": {**FASTER_RCNN, "REFERENCE_WORLD_SIZE": 8, "WARM_UP_FACTOR": "horovod"}}, {"world_size": 16}),
         [])
@example(({"LR_POLICY": "cosine_decay", "MAX_EPOCHS": 10, "WARM_UP_EPOCHS": 1}, {"steps_per_epoch": 50}), [])
@example(({"LR_POLICY": "poly", "POWER": 0.9, "MAX_ITER": 1000, "WARM_UP_ITERS": 2000}, {}), [])
@example(({"LR_POLICY": "variable_stepsize", "STEP_SIZES_EPOCHS": [3, 3, 2], "MAX_EPOCHS": 9,
           "SCALE_MOMENTUM_MODE": "every_change"}, {"steps_per_epoch": 100}), [])
def test_random_config_builds_a_sound_schedule_or_raises_value_or_type_error(drawn, extra_iterations):
    solver, kwargs = drawn
    try:
        schedule = from_detectron(solver, **kwargs)
    except Exception as error:  # noqa: BLE001 - caught only to assert its type and message
        assert type(error) in (ValueError, TypeError), f"{type(error).__name__}: {error}"
        assert any(name in str(error) for name in NAMES), f"{type(error).__name__} names no key: {error}"
        event(f"rejected: {type(error).__name__}")
        return
    event(f"built: {schedule.lr_policy}")
    max_iter = schedule.max_iter
    its = np.arange(max_iter + 1)
    lrs = schedule.lr_at(its)
    assert lrs.dtype == np.float32 and lrs.shape == its.shape
    assert np.isfinite(lrs).all()
    assert (lrs[:max_iter] > 0).all(), f"lr_at is 0 at {np.flatnonzero(lrs[:max_iter] <= 0)[:5]}"
    if schedule.lr_policy in ZERO_AT_MAX_ITER:
        assert lrs[max_iter] == 0
    else:
        assert lrs[max_iter] > 0

    samples = {0, max_iter, max_iter - 1, *[it for it in schedule.boundaries()[:8] if it <= max_iter],
               *[it % (max_iter + 1) for it in extra_iterations]}
    for it in samples:
        assert schedule.lr_at(int(it)) == float(lrs[it])

    previous = np.concatenate([np.zeros(1, dtype=np.float32), lrs[:-1]])
    corrections = schedule.momentum_corrections(max_iter)
    if schedule.correction_mode == "off":
        assert corrections == []
    for it, factor in corrections:
        assert 0 < it < max_iter and lrs[it] != previous[it]
        assert float(previous[it]) > 1e-7
        assert math.isfinite(factor) and factor > 0
        assert factor == float(lrs[it] / previous[it])

    restored = Schedule.from_config(json.loads(json.dumps(schedule.get_config())))
    assert restored == schedule
    assert np.array_equal(restored.lr_at(its), lrs)


@SETTINGS
@given(base_lr=st.floats(1e-6, 1e3), world_size=st.integers(1, 4096), reference=st.integers(1, 4096))
def test_linear_scaling_and_gradual_warmup(base_lr, world_size, reference):
    lr = linear_scaled_lr(base_lr, world_size, reference)
    assert lr == base_lr * (world_size / reference) and math.isfinite(lr) and lr > 0
    assert linear_scaled_lr(base_lr, world_size + 1, reference) >= lr  # monotone in the world size
    assert linear_scaled_lr(base_lr, world_size) == base_lr * world_size
    assert linear_scaled_lr_for_batch(base_lr, global_batch=32 * world_size, reference_batch=32 * reference) == lr
    factor = gradual_warmup_factor(world_size, reference)
    assert factor == reference / world_size
    assert (0 < factor <= 1) == (world_size >= reference)
    # Horovod's gradual warmup starts from the LR the config was written for.
    assert lr * factor == pytest.approx(base_lr, rel=1e-12)


@SETTINGS
@given(base_lr=st.floats(1e-4, 10), world_size=st.integers(1, 64), reference=st.integers(0, 64),
       warm_up_iters=st.integers(1, 400))
def test_horovod_warmup_goes_from_the_reference_lr_to_the_scaled_lr(base_lr, world_size, reference, warm_up_iters):
    solver = {"BASE_LR": base_lr, "WARM_UP_FACTOR": "horovod", "REFERENCE_WORLD_SIZE": reference,
              "WARM_UP_ITERS": warm_up_iters, "LR_POLICY": "steps_with_decay", "STEPS": [0], "MAX_ITER": 1000}
    if reference > world_size:  # the factor reference / world_size would exceed 1
        with pytest.raises(ValueError, match=r"WARM_UP_FACTOR must be in \(0, 1\]"):
            from_detectron(solver, world_size=world_size)
        return
    schedule = from_detectron(solver, world_size=world_size)
    scaled = base_lr * world_size / reference if reference else base_lr
    start = base_lr if reference else base_lr / world_size
    warm = schedule.warm_up_iters
    lrs = schedule.lr_at(np.arange(warm + 1))
    assert lrs[-1] == pytest.approx(scaled, rel=1e-6)
    if warm:
        assert lrs[0] == pytest.approx(start, rel=1e-6)
        assert (np.diff(lrs) >= 0).all()


BAD_SIZES = st.one_of(st.integers(max_value=0), st.floats(), st.booleans(), st.text(max_size=3),
                      st.lists(st.integers(1, 4), max_size=2), st.just(4.0))


@SETTINGS
@given(bad=BAD_SIZES)
def test_bad_world_sizes_raise_naming_the_argument(bad):
    calls = [(lambda: linear_scaled_lr(0.1, bad), "world_size"), (lambda: gradual_warmup_factor(bad), "world_size"),
             (lambda: linear_scaled_lr(0.1, 8, bad), "reference_world_size"),
             (lambda: gradual_warmup_factor(8, bad), "reference_world_size"),
             (lambda: linear_scaled_lr_for_batch(0.1, global_batch=bad, reference_batch=256), "global_batch"),
             (lambda: from_detectron({"REFERENCE_WORLD_SIZE": 8}, world_size=bad), "world_size"),
             (lambda: from_detectron({"MAX_EPOCHS": 1}, steps_per_epoch=bad), "steps_per_epoch")]
    for call, name in calls:
        with pytest.raises((ValueError, TypeError), match=name):
            call()


# ---------------------------------------------------------------------------- valid configs against the walk

@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_solvers(), st.booleans())
@example(({"LR_POLICY": "cosine_decay", "MAX_ITER": 1000, "BASE_LR": 0.1, "WARM_UP_ITERS": 0,
           "SCALE_MOMENTUM": True, "SCALE_MOMENTUM_MODE": "threshold", "SCALE_MOMENTUM_THRESHOLD": 1.0001},
          "threshold", 1.0001), False)
@example(({"LR_POLICY": "poly", "MAX_ITER": 500, "BASE_LR": 0.02, "POWER": 0.9, "WARM_UP_METHOD": "linear",
           "WARM_UP_ITERS": 700, "WARM_UP_FACTOR": 0.25, "SCALE_MOMENTUM": True,
           "SCALE_MOMENTUM_MODE": "every_change", "SCALE_MOMENTUM_THRESHOLD": 1.1}, "every_change", 1.1), True)
def test_every_valid_config_loads_and_equals_the_per_iteration_walk(drawn, wrapped):
    """A valid SOLVER must load (a build that rejected every cosine schedule fails here), and its segments give
    the LR of every iteration and exactly the corrections of Detectron's walk (tests/detectron_scalar.py)."""
    solver, mode, threshold = drawn
    schedule = from_detectron({"SOLVER": solver} if wrapped else solver)
    event(f"{solver['LR_POLICY']}, {mode}")
    stop = walk_stop(solver)
    lrs, corrections = reference_walk(solver, stop, mode, threshold)
    assert np.array_equal(schedule.lr_at(np.arange(stop)).view(np.uint32), lrs.view(np.uint32))
    assert schedule.correction_mode == mode
    assert schedule.momentum_corrections(stop) == corrections
    # From a start inside the run: the rule on the LR of start - 1, not a fresh 0.
    start = stop // 3
    assert schedule.momentum_corrections(stop, start) == [c for c in corrections if c[0] >= start]
