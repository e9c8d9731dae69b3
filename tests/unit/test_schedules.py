"""``Schedule``: hold_iter, boundaries, serialization, validation of every argument, input checks."""

import inspect
import json

import numpy as np
import pytest

from hvd_sched import POLICIES, Schedule

EVERY_POLICY = {
    "step": dict(lr_policy="step", step_size=700, max_iter=2000),
    "steps_with_decay": dict(lr_policy="steps_with_decay", steps=[0, 600, 1500, 2500], max_iter=2000),
    "steps_with_lrs": dict(lr_policy="steps_with_lrs", steps=[0, 600, 1500], lrs=[0.02, 0.002, 0.0002]),
    "steps_with_relative_lrs": dict(lr_policy="steps_with_relative_lrs", steps=[0, 600], lrs=[1, 0.1]),
    "cosine_decay": dict(lr_policy="cosine_decay", max_iter=2000),
    "exp_decay": dict(lr_policy="exp_decay", gamma=0.01, max_iter=2000),
    "poly": dict(lr_policy="poly", power=0.9, max_iter=2000),
    "variable_stepsize": dict(lr_policy="variable_stepsize", step_sizes=[600, 900, 1100], max_iter=2000),
}


@pytest.fixture(params=sorted(EVERY_POLICY))
def schedule(request):
    return Schedule(base_lr=0.02, warm_up_iters=300, scale_momentum_mode="every_change", momentum=0.8,
                    weight_decay=1e-4, lr_factor=2.0, log_lr_change_threshold=1.5, **EVERY_POLICY[request.param])


def test_every_policy_is_covered():
    assert set(EVERY_POLICY) == set(POLICIES)


def test_get_config_has_every_constructor_argument(schedule):
    config = schedule.get_config()
    assert list(config) == [name for name in inspect.signature(Schedule.__init__).parameters if name != "self"]
    assert all(not isinstance(value, tuple) for value in config.values())
    assert Schedule.from_config(config) == schedule


def test_round_trip_through_json(schedule):
    restored = Schedule.from_config(json.loads(json.dumps(schedule.get_config())))
    assert restored == schedule and repr(restored) == repr(schedule)
    its = np.arange(0, 3000)
    assert np.array_equal(restored.lr_at(its), schedule.lr_at(its))
    assert restored.momentum_corrections(3000) == schedule.momentum_corrections(3000)


def test_repr_rebuilds_an_equal_schedule(schedule):
    assert eval(repr(schedule), {"Schedule": Schedule}) == schedule  # noqa: S307 - our own repr


def test_equality_is_by_config():
    assert Schedule() == Schedule(steps=[], lrs=())
    assert Schedule() != Schedule(base_lr=0.002)
    assert Schedule() != {"base_lr": 0.001}


def test_defaults_are_detectrons():
    config = Schedule().get_config()
    assert config == {
        "base_lr": 0.001, "lr_policy": "step", "gamma": 0.1, "step_size": 30000, "steps": [], "lrs": [],
        "max_iter": 40000, "warm_up_iters": 500, "warm_up_factor": 1.0 / 3.0, "warm_up_method": "linear",
        "scale_momentum": True, "scale_momentum_threshold": 1.1, "scale_momentum_mode": "threshold",
        "log_lr_change_threshold": 1.1, "momentum": 0.9, "weight_decay": 0.0005, "lr_factor": 1.0,
        "step_sizes": [], "power": 1.0, "weight_decay_gn": 0.0,
        # The other dialects' arguments, at values that leave Detectron's behaviour unchanged.
        "dialect": "detectron", "warm_up_lr": 0.1, "gradual_increase_lr": False, "gradual_lr_step": 0.005,
        "gradual_lr_start": 0.1, "nesterov": False, "weight_decay_bn": 0.0,
        # hvd_sched's micro-batches per iteration (Caffe's iter_size): 1, no accumulation.
        "iter_size": 1,
    }


def test_read_only_properties_return_copies():
    schedule = Schedule(lr_policy="steps_with_decay", steps=[0, 10])
    assert schedule.base_lr == 0.001 and schedule.max_iter == 40000 and schedule.steps == [0, 10]
    schedule.steps.append(99)
    assert schedule.steps == [0, 10]
    with pytest.raises(AttributeError):
        schedule.base_lr = 1.0


def test_caller_lists_are_never_mutated_nor_shared():
    steps, lrs = [0, 10, 20], [0.1, 0.01, 0.001]
    schedule = Schedule(lr_policy="steps_with_lrs", steps=steps, lrs=lrs, max_iter=30)
    steps.append(40)
    lrs[0] = 5.0
    schedule.get_config()["steps"].append(50)
    assert steps == [0, 10, 20, 40] and lrs == [5.0, 0.01, 0.001]
    assert schedule.steps == [0, 10, 20] and schedule.lrs == [0.1, 0.01, 0.001]


@pytest.mark.parametrize("kwargs, hold", [
    (dict(lr_policy="step", step_size=700, max_iter=2000, warm_up_iters=0), 1400),
    (dict(lr_policy="step", step_size=500, max_iter=2000, warm_up_iters=0), 2000),
    (dict(lr_policy="steps_with_decay", steps=[0, 600, 2500], max_iter=2000), 2500),
    (dict(lr_policy="steps_with_decay", steps=[0], max_iter=2000, warm_up_iters=300), 300),
    (dict(lr_policy="steps_with_decay", steps=[0], max_iter=2000, warm_up_iters=0), 0),
    (dict(lr_policy="cosine_decay", max_iter=2000), 2000),
    (dict(lr_policy="cosine_decay", max_iter=200, warm_up_iters=500), 200),  # 0 past MAX_ITER, warm or not
    (dict(lr_policy="exp_decay", max_iter=200, warm_up_iters=500), 500),
    (dict(lr_policy="variable_stepsize", step_sizes=[600, 900, 1100], max_iter=2000), 2600),
])
def test_hold_iter(kwargs, hold):
    schedule = Schedule(**kwargs)
    assert schedule.hold_iter == hold
    lrs = schedule.lr_at(np.arange(hold, hold + 3000))
    assert np.all(lrs == lrs[0])
    if hold > 0:
        assert schedule.lr_at(hold - 1) != schedule.lr_at(hold)


@pytest.mark.parametrize("kwargs, points", [
    (dict(), [0, 500, 30000, 40000]),
    (dict(lr_policy="step", step_size=700, max_iter=2000, warm_up_iters=0), [0, 700, 1400, 2000]),
    (dict(lr_policy="steps_with_decay", steps=[0, 600, 2500], max_iter=2000, warm_up_iters=300),
     [0, 300, 600, 2000, 2500]),
    (dict(lr_policy="variable_stepsize", step_sizes=[30, 30, 20], max_iter=90), [0, 30, 60, 80, 90, 500]),
    (dict(lr_policy="cosine_decay", max_iter=2000, warm_up_iters=0), [0, 2000]),
])
def test_boundaries(kwargs, points):
    assert Schedule(**kwargs).boundaries() == points


def test_correction_mode():
    assert Schedule().correction_mode == "threshold"
    assert Schedule(scale_momentum_mode="every_change").correction_mode == "every_change"
    assert Schedule(scale_momentum=False, scale_momentum_mode="every_change").correction_mode == "off"
    assert Schedule(scale_momentum=False).momentum_corrections(10**6) == []


def test_momentum_corrections_arguments():
    schedule = Schedule(lr_policy="steps_with_decay", steps=[0, 100], max_iter=200, warm_up_iters=0)
    assert schedule.momentum_corrections(0) == []
    assert schedule.momentum_corrections(100) == []
    assert schedule.momentum_corrections(101) == schedule.momentum_corrections(10**9) == [(100, pytest.approx(0.1))]
    assert schedule.momentum_corrections(200, start=200) == []
    assert schedule.momentum_corrections(10**9, start=10**8) == []
    for call, error, match in [
        (lambda: schedule.momentum_corrections(10, start=11), ValueError, "start must be <= stop, got start=11"),
        (lambda: schedule.momentum_corrections(-1), ValueError, "stop must be >= 0, got -1"),
        (lambda: schedule.momentum_corrections(10.0), TypeError, "stop must be an int, got 10.0"),
        (lambda: schedule.momentum_corrections(10, start=True), TypeError, "start must be an int, got True"),
    ]:
        with pytest.raises(error, match=match):
            call()


@pytest.mark.parametrize("bad, error, match", [
    (-1, ValueError, "iteration must be >= 0, got -1"),
    (np.array([3, -2]), ValueError, "iterations must be >= 0, got -2"),
    (1.0, TypeError, "iteration must be an int or an integer array"),
    (True, TypeError, "iteration must be an int or an integer array, got True"),
    (np.array([1.5]), TypeError, "got dtype float64"),
    ("3", TypeError, "iteration must be an int or an integer array"),
])
def test_lr_at_rejects(bad, error, match):
    with pytest.raises(error, match=match):
        Schedule().lr_at(bad)


# ---------------------------------------------------------------------------- validation: key and value named

@pytest.mark.parametrize("kwargs, error, match", [
    (dict(lr_policy="cosine"), ValueError, r"unknown LR_POLICY 'cosine'; expected one of \['step'"),
    (dict(lr_policy=3), TypeError, "LR_POLICY must be a string, got 3"),
    (dict(warm_up_method="gradual"), ValueError, "unknown WARM_UP_METHOD 'gradual'"),
    (dict(scale_momentum_mode="always"), ValueError, "unknown SCALE_MOMENTUM_MODE 'always'"),
    (dict(lr_policy="steps_with_decay", steps=[10, 20]), ValueError, r"STEPS must start at 0, got \[10, 20\]"),
    (dict(lr_policy="steps_with_decay", steps=[0, 20, 20]), ValueError,
     r"STEPS must be strictly increasing, got \[0, 20, 20\]"),
    (dict(lr_policy="step", steps=[0, 30, 20]), ValueError, "STEPS must be strictly increasing"),
    (dict(lr_policy="steps_with_decay", steps=[]), ValueError, "STEPS must be non-empty for LR_POLICY"),
    (dict(lr_policy="steps_with_lrs", steps=[0, 10], lrs=[0.1]), ValueError,
     r"LRS must have one entry per STEPS entry \(2\) for LR_POLICY 'steps_with_lrs', got \[0.1\]"),
    (dict(lr_policy="steps_with_relative_lrs", steps=[0, 10], lrs=[1, 0.1, 0.01]), ValueError, "LRS must have"),
    (dict(lrs=[0.1, -0.01]), ValueError, r"LRS entries must be finite and > 0, got \[0.1, -0.01\]"),
    (dict(lrs=["0.1"]), TypeError, "LRS must be a list of numbers"),
    (dict(steps="0, 10"), TypeError, "STEPS must be a list, got '0, 10'"),
    (dict(steps=[0, 1.5]), TypeError, r"STEPS must be a list of ints, got \[0, 1.5\]"),
    (dict(base_lr=0), ValueError, "BASE_LR must be > 0, got 0"),
    (dict(base_lr=-0.1), ValueError, r"BASE_LR must be > 0, got -0.1"),
    (dict(base_lr=float("nan")), ValueError, "BASE_LR must be > 0, got nan"),
    (dict(base_lr=float("inf")), ValueError, "BASE_LR must be > 0, got inf"),
    (dict(base_lr="0.1"), TypeError, "BASE_LR must be a number, got '0.1'"),
    (dict(base_lr=True), TypeError, "BASE_LR must be a number, got True"),
    (dict(gamma=0), ValueError, "GAMMA must be > 0, got 0"),
    (dict(gamma=-0.1), ValueError, r"GAMMA must be > 0, got -0.1"),
    (dict(lr_policy="step", gamma=10.0, step_size=1, max_iter=1000), ValueError, "GAMMA 10.0 overflows"),
    (dict(step_size=0), ValueError, "STEP_SIZE must be >= 1, got 0"),
    (dict(step_size=30000.0), TypeError, r"STEP_SIZE must be an int, got 30000.0 \(float\)"),
    (dict(max_iter=0), ValueError, "MAX_ITER must be >= 1, got 0"),
    (dict(max_iter=-5), ValueError, "MAX_ITER must be >= 1, got -5"),
    (dict(max_iter=False), TypeError, "MAX_ITER must be an int, got False"),
    (dict(warm_up_factor=1.5), ValueError, r"WARM_UP_FACTOR must be in \(0, 1\], got 1.5"),
    (dict(warm_up_factor=0), ValueError, r"WARM_UP_FACTOR must be in \(0, 1\], got 0"),
    (dict(warm_up_iters=-1), ValueError, "WARM_UP_ITERS must be >= 0, got -1"),
    (dict(scale_momentum=1), TypeError, "SCALE_MOMENTUM must be a bool, got 1"),
    (dict(scale_momentum_threshold=0.9), ValueError, "SCALE_MOMENTUM_THRESHOLD must be >= 1, got 0.9"),
    (dict(log_lr_change_threshold=0.5), ValueError, "LOG_LR_CHANGE_THRESHOLD must be >= 1, got 0.5"),
    (dict(momentum=1.5), ValueError, r"MOMENTUM must be in \[0, 1\], got 1.5"),
    (dict(weight_decay=-1e-4), ValueError, "WEIGHT_DECAY must be >= 0, got -0.0001"),
    (dict(lr_factor=0), ValueError, "LR_FACTOR must be > 0, got 0"),
    (dict(power=0), ValueError, "POWER must be > 0, got 0"),
    (dict(lr_policy="variable_stepsize"), ValueError, r"STEP_SIZES must be non-empty for LR_POLICY"),
    (dict(step_sizes=[10, 0]), ValueError, r"STEP_SIZES entries must be >= 1, got \[10, 0\]"),
    (dict(step_sizes=(10, "20")), TypeError, "STEP_SIZES must be a list of ints"),
])
def test_invalid_arguments_raise_naming_key_and_value(kwargs, error, match):
    with pytest.raises(error, match=match):
        Schedule(**kwargs)


def test_unknown_argument_is_a_type_error():
    with pytest.raises(TypeError, match="warmup_iters"):
        Schedule(warmup_iters=100)  # pylint: disable=unexpected-keyword-arg


def test_huge_and_unsigned_iterations_hold_the_last_value():
    schedule = Schedule(lr_policy="steps_with_decay", steps=[0, 100], max_iter=200, warm_up_iters=0)
    assert schedule.lr_at(2**80) == schedule.lr_at(100) == float(np.float32(0.001 * 0.1))
    unsigned = schedule.lr_at(np.array([0, 99, 100, 2**64 - 1], dtype=np.uint64))
    assert unsigned.tolist() == schedule.lr_at(np.array([0, 99, 100, 10**9])).tolist()


def test_numpy_scalars_are_accepted_and_stored_as_python_numbers():
    schedule = Schedule(base_lr=np.float32(0.5), max_iter=np.int64(100), steps=np.array([0, 50]),
                        lr_policy="steps_with_decay")
    config = schedule.get_config()
    assert type(config["base_lr"]) is float and type(config["max_iter"]) is int
    assert all(type(step) is int for step in config["steps"])
    json.dumps(config)
