"""``Schedule.lr_at`` against golden values: hand-computed tables and a plain-Python Detectron re-derivation.

The re-derivation (``tests/detectron_scalar.py``: ``get_lr_at_iter`` one Python ``int`` at a time, Python floats,
``np.float32`` at the end) shares no code with hvd_sched. The only deliberate difference from Detectron is
hvd_sched's "hold past MAX_ITER" for the policies listed in ``HELD``.
"""

import numpy as np
import pytest

from detectron_scalar import DETECTRON_DEFAULTS, HELD, get_step_index, reference_lr, reference_lr64  # noqa: F401
from hvd_sched import Schedule, policies


def schedule_of(solver):
    return Schedule(**{key.lower(): value for key, value in solver.items()})


# One small configuration per policy, with steps both before and past MAX_ITER = 2000.
POLICY_SOLVERS = {
    "step": {"BASE_LR": 0.02, "LR_POLICY": "step", "STEP_SIZE": 700, "MAX_ITER": 2000},
    "steps_with_decay": {"BASE_LR": 0.02, "LR_POLICY": "steps_with_decay", "STEPS": [0, 600, 1500, 2500],
                         "MAX_ITER": 2000},
    "steps_with_lrs": {"LR_POLICY": "steps_with_lrs", "STEPS": [0, 600, 1500, 2500],
                       "LRS": [0.02, 0.002, 0.0002, 0.00002], "MAX_ITER": 2000},
    "steps_with_relative_lrs": {"BASE_LR": 0.4, "LR_POLICY": "steps_with_relative_lrs", "STEPS": [0, 600, 1500],
                                "LRS": [1.0, 0.1, 0.01], "MAX_ITER": 2000},
    "cosine_decay": {"BASE_LR": 0.02, "LR_POLICY": "cosine_decay", "MAX_ITER": 2000},
    "exp_decay": {"BASE_LR": 0.02, "LR_POLICY": "exp_decay", "GAMMA": 0.01, "MAX_ITER": 2000},
    "poly": {"BASE_LR": 0.02, "LR_POLICY": "poly", "POWER": 0.9, "MAX_ITER": 2000},
    "variable_stepsize": {"BASE_LR": 0.02, "LR_POLICY": "variable_stepsize", "STEP_SIZES": [600, 900, 1100],
                          "MAX_ITER": 2000},
}
WARMUPS = {
    "none": {"WARM_UP_ITERS": 0},
    "constant": {"WARM_UP_ITERS": 300, "WARM_UP_FACTOR": 0.1, "WARM_UP_METHOD": "constant"},
    "linear": {"WARM_UP_ITERS": 300, "WARM_UP_FACTOR": 1.0 / 3.0, "WARM_UP_METHOD": "linear"},
}


def test_every_policy_has_a_configuration():
    assert set(POLICY_SOLVERS) == set(policies.POLICIES)


@pytest.mark.parametrize("warmup", sorted(WARMUPS))
@pytest.mark.parametrize("policy", sorted(POLICY_SOLVERS))
def test_lr_at_is_bit_identical_to_the_scalar_rederivation(policy, warmup):
    solver = {**POLICY_SOLVERS[policy], **WARMUPS[warmup]}
    its = np.arange(0, 3000)  # past MAX_ITER (2000) and past the last step (2500)
    expected = np.array([reference_lr(solver, int(it)) for it in its], dtype=np.float32)
    actual = schedule_of(solver).lr_at(its)
    assert actual.dtype == np.float32
    assert np.array_equal(actual.view(np.uint32), expected.view(np.uint32))


def policy_lr64(solver, its):
    """hvd_sched's public policy functions and warmup factor, composed as ``Schedule.lr_at`` composes them."""
    cfg = {**DETECTRON_DEFAULTS, **solver}
    base_lr, gamma, max_iter = cfg["BASE_LR"], cfg["GAMMA"], cfg["MAX_ITER"]
    policy_lr = {
        "step": lambda: policies.step(its, base_lr, gamma, cfg["STEP_SIZE"], max_iter),
        "steps_with_decay": lambda: policies.steps_with_decay(its, base_lr, gamma, cfg["STEPS"]),
        "steps_with_lrs": lambda: policies.steps_with_lrs(its, cfg["STEPS"], cfg["LRS"]),
        "steps_with_relative_lrs": lambda: policies.steps_with_relative_lrs(its, base_lr, cfg["STEPS"], cfg["LRS"]),
        "cosine_decay": lambda: policies.cosine_decay(its, base_lr, max_iter),
        "exp_decay": lambda: policies.exp_decay(its, base_lr, gamma, max_iter),
        "poly": lambda: policies.poly(its, base_lr, max_iter, cfg["POWER"]),
        "variable_stepsize": lambda: policies.variable_stepsize(its, base_lr, gamma, cfg["STEP_SIZES"]),
    }[cfg["LR_POLICY"]]()
    return policy_lr * policies.warmup_factor(its, cfg["WARM_UP_METHOD"], cfg["WARM_UP_ITERS"],
                                              cfg["WARM_UP_FACTOR"])


@pytest.mark.parametrize("warmup", sorted(WARMUPS))
@pytest.mark.parametrize("policy", sorted(set(POLICY_SOLVERS) - {"poly"}))
def test_float64_values_before_rounding_are_identical(policy, warmup):
    """Same operations in the same order as Detectron, not only the same float32 (which hides 1-ulp slips)."""
    solver = {**POLICY_SOLVERS[policy], **WARMUPS[warmup]}
    its = np.arange(0, 3000)
    expected = np.array([reference_lr64(solver, int(it)) for it in its], dtype=np.float64)
    assert np.array_equal(policy_lr64(solver, its), expected)


def test_poly_float64_is_exact_for_power_one():
    # numpy's vectorised power may differ from Python's ** in the last float64 bit (float32 agrees, see above);
    # POWER 1 takes no power at all.
    solver = {**POLICY_SOLVERS["poly"], "POWER": 1.0, **WARMUPS["linear"]}
    its = np.arange(0, 3000)
    assert np.array_equal(policy_lr64(solver, its), [reference_lr64(solver, int(it)) for it in its])


@pytest.mark.parametrize("policy", ["steps_with_decay", "cosine_decay", "exp_decay"])
def test_full_detectron_length_schedule_is_bit_identical(policy):
    solver = {"BASE_LR": 0.02, "LR_POLICY": policy, "STEPS": [0, 60000, 80000], "MAX_ITER": 90000, "GAMMA": 0.1}
    its = np.arange(0, 90000)
    expected = np.array([reference_lr(solver, it) for it in range(90000)], dtype=np.float32)
    assert np.array_equal(schedule_of(solver).lr_at(its).view(np.uint32), expected.view(np.uint32))


def test_detectron_defaults_at_sampled_iterations():
    its = sorted({*range(0, 45000, 97), *[0, 1, 499, 500, 501, 29999, 30000, 30001, 39999, 40000, 40001, 10**7]})
    expected = np.array([reference_lr({}, it) for it in its], dtype=np.float32)
    assert np.array_equal(Schedule().lr_at(np.array(its)), expected)


@pytest.mark.parametrize("power", [1.0, 2.0, 0.5])
def test_poly_powers(power):
    solver = {**POLICY_SOLVERS["poly"], "POWER": power, "WARM_UP_ITERS": 0}
    expected = np.array([reference_lr(solver, it) for it in range(2100)], dtype=np.float32)
    assert np.array_equal(schedule_of(solver).lr_at(np.arange(2100)), expected)


# ---------------------------------------------------------------------------- hand-computed tables

NO_WARMUP = {"warm_up_iters": 0}


@pytest.mark.parametrize("kwargs, table", [
    # Detectron's docstring example: [0, 59] 0.02, [60, 79] 0.002, [80, inf] 0.0002
    ({"lr_policy": "steps_with_lrs", "steps": [0, 60, 80], "lrs": [0.02, 0.002, 0.0002], "max_iter": 90},
     {0: 0.02, 59: 0.02, 60: 0.002, 79: 0.002, 80: 0.0002, 89: 0.0002, 90: 0.0002, 10**6: 0.0002}),
    ({"lr_policy": "steps_with_decay", "base_lr": 0.02, "steps": [0, 60, 80], "max_iter": 90},
     {0: 0.02, 59: 0.02, 60: 0.002, 79: 0.002, 80: 0.0002, 10**6: 0.0002}),
    ({"lr_policy": "steps_with_relative_lrs", "base_lr": 0.4, "steps": [0, 60, 80], "lrs": [1, 0.1, 0.01]},
     {0: 0.4, 60: 0.04, 80: 0.004, 10**6: 0.004}),
    # 0.5 * (cos(pi * it / 4) + 1): 1, (2 + sqrt 2) / 4, 1/2, (2 - sqrt 2) / 4, 0, then held at 0
    ({"lr_policy": "cosine_decay", "base_lr": 1.0, "max_iter": 4},
     {0: 1.0, 1: 0.8535533905932737, 2: 0.5, 3: 0.14644660940672627, 4: 0.0, 5: 0.0, 1000: 0.0}),
    # exp(it / 2 * ln 0.01): 1, 0.1, 0.01, then held
    ({"lr_policy": "exp_decay", "base_lr": 1.0, "gamma": 0.01, "max_iter": 2}, {0: 1.0, 1: 0.1, 2: 0.01, 7: 0.01}),
    # (1 - it / 4) ** 2
    ({"lr_policy": "poly", "base_lr": 1.0, "power": 2.0, "max_iter": 4},
     {0: 1.0, 1: 0.5625, 2: 0.25, 3: 0.0625, 4: 0.0, 9: 0.0}),
    # BASE_LR 0.1, GAMMA 0.1 ** (it // 3), held at it = MAX_ITER = 7 (k = 2)
    ({"lr_policy": "step", "base_lr": 0.1, "step_size": 3, "max_iter": 7},
     {0: 0.1, 2: 0.1, 3: 0.01, 6: 0.001, 7: 0.001, 9: 0.001, 10**6: 0.001}),
    # STEP_SIZES [30, 30, 20]: stage ends 30, 60, 80 (the seed's get_lr_steps example, scaled)
    ({"lr_policy": "variable_stepsize", "base_lr": 0.1, "step_sizes": [30, 30, 20]},
     {0: 0.1, 29: 0.1, 30: 0.01, 59: 0.01, 60: 0.001, 79: 0.001, 80: 0.0001, 10**6: 0.0001}),
    # linear warmup, BASE_LR 0.3, WARM_UP_FACTOR 1/4 over 4 iterations: 0.3 * (0.25, 0.4375, 0.625, 0.8125, 1)
    ({"base_lr": 0.3, "warm_up_iters": 4, "warm_up_factor": 0.25, "warm_up_method": "linear"},
     {0: 0.075, 1: 0.13125, 2: 0.1875, 3: 0.24375, 4: 0.3}),
    ({"base_lr": 0.3, "warm_up_iters": 4, "warm_up_factor": 0.25, "warm_up_method": "constant"},
     {0: 0.075, 3: 0.075, 4: 0.3}),
])
def test_hand_computed_table(kwargs, table):
    schedule = Schedule(**{**NO_WARMUP, **kwargs})
    for it, lr in table.items():
        assert schedule.lr_at(it) == float(np.float32(lr)), it


def test_cosine_tail_shrinks_quadratically_towards_max_iter():
    schedule = Schedule(base_lr=0.02, lr_policy="cosine_decay", max_iter=1000, warm_up_iters=0)
    tail = schedule.lr_at(np.arange(990, 1001)).astype(np.float64)
    # 0.02 * 0.5 * (cos(pi * (1 - n / 1000)) + 1) ~ 0.02 * (pi * n / 2000) ** 2 for n = 10..0 remaining
    approx = 0.02 * (np.pi * np.arange(10, -1, -1) / 2000.0) ** 2
    assert np.allclose(tail, approx, rtol=1e-3, atol=1e-12)
    assert tail[-1] == 0.0 and tail[-2] < 1e-7 < tail[-3]


# ---------------------------------------------------------------------------- properties, every policy

PROPERTY_SOLVERS = {
    "step": {"LR_POLICY": "step", "STEP_SIZE": 5000},
    "steps_with_decay": {"LR_POLICY": "steps_with_decay", "STEPS": [0, 5000, 12000]},
    "steps_with_lrs": {"LR_POLICY": "steps_with_lrs", "STEPS": [0, 5000, 12000], "LRS": [0.02, 0.004, 0.0005]},
    "steps_with_relative_lrs": {"LR_POLICY": "steps_with_relative_lrs", "STEPS": [0, 5000, 12000],
                                "LRS": [1, 0.2, 0.01]},
    "cosine_decay": {"LR_POLICY": "cosine_decay"},
    "exp_decay": {"LR_POLICY": "exp_decay", "GAMMA": 0.1},
    "poly": {"LR_POLICY": "poly", "POWER": 0.9},
    "variable_stepsize": {"LR_POLICY": "variable_stepsize", "STEP_SIZES": [5000, 7000, 8000]},
}


@pytest.fixture(params=sorted(PROPERTY_SOLVERS))
def warm_schedule(request):
    solver = {"BASE_LR": 0.02, "MAX_ITER": 20000, "WARM_UP_ITERS": 300, "WARM_UP_FACTOR": 1.0 / 3.0,
              "WARM_UP_METHOD": "linear", **PROPERTY_SOLVERS[request.param]}
    return schedule_of(solver)


def test_linear_warmup_is_monotone_and_peaks_at_the_boundary(warm_schedule):
    lrs = warm_schedule.lr_at(np.arange(0, warm_schedule.hold_iter + 1))
    warmup = lrs[: warm_schedule.warm_up_iters + 1]
    assert np.all(np.diff(warmup) > 0)
    assert int(np.argmax(lrs)) == warm_schedule.warm_up_iters
    assert np.all(np.diff(lrs[warm_schedule.warm_up_iters:]) <= 0)  # every policy here decays after it


def test_lr_past_the_end_is_held(warm_schedule):
    hold = warm_schedule.hold_iter
    held = warm_schedule.lr_at(np.array([hold, hold + 1, hold + 17, 10**6, 10**9, 2**40]))
    assert np.all(held == held[0])
    assert warm_schedule.lr_at(hold - 1) != warm_schedule.lr_at(hold)  # and hold_iter is the smallest such


def test_scalar_and_array_agree(warm_schedule):
    its = np.array([0, 1, 299, 300, 301, 4999, 5000, 11999, 12000, 19999, 20000, 20001, 123456])
    array = warm_schedule.lr_at(its)
    for index, it in enumerate(its):
        value = warm_schedule.lr_at(int(it))
        assert type(value) is float and value == float(array[index])
        assert warm_schedule.lr_at(np.int64(it)) == value


def test_lr_at_keeps_the_array_shape():
    schedule = Schedule()
    grid = np.arange(12, dtype=np.int32).reshape(3, 4)
    out = schedule.lr_at(grid)
    assert out.shape == (3, 4) and out.dtype == np.float32
    assert np.array_equal(out.ravel(), schedule.lr_at(np.arange(12)))
    assert schedule.lr_at(np.array([], dtype=np.int64)).shape == (0,)


def test_warmup_factor_alone():
    its = np.arange(6)
    assert policies.warmup_factor(its, "linear", 4, 0.25).tolist() == [0.25, 0.4375, 0.625, 0.8125, 1.0, 1.0]
    assert policies.warmup_factor(its, "constant", 4, 0.25).tolist() == [0.25] * 4 + [1.0] * 2
    assert policies.warmup_factor(its, "linear", 0, 0.25).tolist() == [1.0] * 6
    with pytest.raises(ValueError, match="WARM_UP_METHOD must be one of .*, got 'gradual'"):
        policies.warmup_factor(its, "gradual", 4, 0.25)


def test_step_index_matches_detectrons_walk_with_steps_past_max_iter():
    cfg = {"STEPS": [0, 60, 100], "MAX_ITER": 90}
    its = np.arange(0, 200)
    assert policies.step_index(its, cfg["STEPS"]).tolist() == [get_step_index(cfg, int(it)) for it in its]


@pytest.mark.parametrize("method", ["linear", "constant"])
@pytest.mark.parametrize("policy", ["cosine_decay", "exp_decay", "poly", "step"])
def test_warmup_longer_than_max_iter_applies_to_the_held_value(policy, method):
    solver = {"BASE_LR": 0.02, "LR_POLICY": policy, "MAX_ITER": 50, "STEP_SIZE": 20, "WARM_UP_ITERS": 80,
              "WARM_UP_METHOD": method, "WARM_UP_FACTOR": 0.5}
    schedule = schedule_of(solver)
    expected = np.array([reference_lr(solver, it) for it in range(120)], dtype=np.float32)
    assert np.array_equal(schedule.lr_at(np.arange(120)), expected)
    assert schedule.hold_iter == (50 if policy in ("cosine_decay", "poly") else 80)  # 0 * warmup is still 0
    assert np.all(schedule.lr_at(np.arange(schedule.hold_iter, 200)) == schedule.lr_at(schedule.hold_iter))
