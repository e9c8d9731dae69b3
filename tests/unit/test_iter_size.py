"""ITER_SIZE (Caffe's ``iter_size``): micro-batches per iteration, carried for the optimizer glue.

An iteration is one optimizer update whatever ITER_SIZE is, so ``Schedule`` carries it without touching the LR
maths; only linear scaling counts it, through the global batch ``world_size * ITER_SIZE * per-rank batch``.
Goyal et al.'s rule then makes ITER_SIZE 2 on 2 ranks the exact schedule of 4 ranks with ITER_SIZE 1. The golden
values below are worked out by hand from that rule (scale = ranks x ITER_SIZE / REFERENCE_WORLD_SIZE).
"""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvd_sched import (
    SOLVER_KEYS,
    Schedule,
    from_detectron,
    gradual_warmup_factor,
    linear_scaled_lr,
    linear_scaled_lr_for_batch,
)

# Every policy, for 1 reference rank (REFERENCE_WORLD_SIZE 1), in iterations.
POLICIES = {
    "step": {"LR_POLICY": "step", "STEP_SIZE": 3000, "MAX_ITER": 9000},
    "steps_with_decay": {"LR_POLICY": "steps_with_decay", "STEPS": [0, 6000, 8000], "MAX_ITER": 9000},
    "steps_with_lrs": {"LR_POLICY": "steps_with_lrs", "STEPS": [0, 6000, 8000], "LRS": [0.02, 0.002, 0.0002],
                       "MAX_ITER": 9000},
    "steps_with_relative_lrs": {"LR_POLICY": "steps_with_relative_lrs", "STEPS": [0, 6000], "LRS": [1, 0.1],
                                "MAX_ITER": 9000},
    "cosine_decay": {"LR_POLICY": "cosine_decay", "MAX_ITER": 9000},
    "exp_decay": {"LR_POLICY": "exp_decay", "GAMMA": 0.01, "MAX_ITER": 9000},
    "poly": {"LR_POLICY": "poly", "POWER": 0.9, "MAX_ITER": 9000},
    "variable_stepsize": {"LR_POLICY": "variable_stepsize", "STEP_SIZES": [3000, 3000, 2000], "MAX_ITER": 9000},
}
COMMON = {"BASE_LR": 0.02, "WARM_UP_ITERS": 400, "SCALE_MOMENTUM_MODE": "every_change", "REFERENCE_WORLD_SIZE": 1}
FASTER_RCNN_8_GPUS = {"BASE_LR": 0.02, "LR_POLICY": "steps_with_decay", "STEPS": [0, 60000, 80000],
                      "MAX_ITER": 90000, "REFERENCE_WORLD_SIZE": 8}


def _without_iter_size(schedule):
    config = schedule.get_config()
    del config["iter_size"]
    return config


def _assert_same_schedule(accumulated, plain):
    """Equal in everything but ITER_SIZE: every argument, the float32 LR of every iteration (bit for bit), the
    phases and the momentum corrections."""
    assert _without_iter_size(accumulated) == _without_iter_size(plain)
    stop = max(plain.max_iter, plain.hold_iter) + 2
    its = np.arange(stop)
    np.testing.assert_array_equal(accumulated.lr_at(its).view(np.uint32), plain.lr_at(its).view(np.uint32))
    assert accumulated.boundaries() == plain.boundaries() and accumulated.hold_iter == plain.hold_iter
    assert accumulated.momentum_corrections(stop) == plain.momentum_corrections(stop)


# ---------------------------------------------------------------------------- Schedule carries it

def test_the_default_is_one_and_solver_keys_list_it():
    assert Schedule().iter_size == 1 and Schedule().get_config()["iter_size"] == 1
    assert SOLVER_KEYS["ITER_SIZE"] == 1
    assert from_detectron({}).iter_size == 1 and from_detectron({"ITER_SIZE": 3}).iter_size == 3


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_iter_size_leaves_the_schedule_maths_alone(policy):
    kwargs = {key.lower(): value for key, value in {**COMMON, **POLICIES[policy]}.items()
              if key != "REFERENCE_WORLD_SIZE"}
    plain, accumulated = Schedule(**kwargs), Schedule(**kwargs, iter_size=4)
    assert accumulated.iter_size == 4 and accumulated != plain
    _assert_same_schedule(accumulated, plain)


def test_serialization_keeps_it():
    schedule = Schedule(lr_policy="steps_with_decay", steps=[0, 100], max_iter=200, iter_size=8)
    assert schedule.get_config()["iter_size"] == 8 and "iter_size=8" in repr(schedule)
    restored = Schedule.from_config(json.loads(json.dumps(schedule.get_config())))
    assert restored == schedule and restored.iter_size == 8
    assert eval(repr(schedule), {"Schedule": Schedule}) == schedule  # noqa: S307 - our own repr
    # A config saved before ITER_SIZE existed still loads, to ITER_SIZE 1.
    old = Schedule().get_config()
    del old["iter_size"]
    assert Schedule.from_config(old) == Schedule()


def test_it_is_read_only():
    schedule = Schedule(iter_size=2)
    with pytest.raises(AttributeError):
        schedule.iter_size = 4


@pytest.mark.parametrize("value, error, message", [
    (0, ValueError, "ITER_SIZE must be >= 1, got 0"),
    (-1, ValueError, "ITER_SIZE must be >= 1, got -1"),
    (np.int64(0), ValueError, "ITER_SIZE must be >= 1, got 0"),
    (2**53 + 1, ValueError, f"ITER_SIZE must be <= {2**53}, got {2**53 + 1}"),
    (1.5, TypeError, "ITER_SIZE must be an int, got 1.5 (float)"),
    (2.0, TypeError, "ITER_SIZE must be an int, got 2.0 (float)"),
    (True, TypeError, "ITER_SIZE must be an int, got True (bool)"),
    # numpy 1 writes np.bool_(True) as True, numpy 2 as np.True_; its type is bool_ or bool by version.
    (np.bool_(True), TypeError, "ITER_SIZE must be an int, got " + repr(np.bool_(True)) + " ("),
    ("2", TypeError, "ITER_SIZE must be an int, got '2' (str)"),
    (None, TypeError, "ITER_SIZE must be an int, got None (NoneType)"),
])
def test_bad_values_name_iter_size_and_the_value(value, error, message):
    for build in (lambda: Schedule(iter_size=value), lambda: from_detectron({"ITER_SIZE": value}),
                  lambda: from_detectron({"ITER_SIZE": value, "REFERENCE_WORLD_SIZE": 1}, world_size=2),
                  lambda: from_detectron({"ITER_SIZE": value, "WARM_UP_FACTOR": "horovod"}, world_size=2)):
        with pytest.raises(error) as raised:
            build()
        assert type(raised.value) is error and str(raised.value).startswith(message), str(raised.value)


def test_a_yaml_string_is_decoded_as_detectron_decodes_every_value(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("SOLVER:\n  ITER_SIZE: '2'\n")  # Detectron's literal_eval makes it the int 2
    assert from_detectron(path).iter_size == 2


@pytest.mark.parametrize("dialect", ["large_scale_vrd", "video_nonlocal"])
def test_other_dialects_reject_it_as_a_detectron_key(dialect):
    with pytest.raises(ValueError, match=rf"unknown SOLVER key 'ITER_SIZE' for dialect '{dialect}' \(a Detectron "
                                         r"key: pass dialect='detectron'\)"):
        from_detectron({"ITER_SIZE": 2}, dialect=dialect)


# ---------------------------------------------------------------------------- linear scaling counts it

def test_without_reference_world_size_nothing_is_scaled():
    assert from_detectron({"ITER_SIZE": 4}, world_size=8) == Schedule(iter_size=4)
    assert from_detectron({"ITER_SIZE": 4, "REFERENCE_WORLD_SIZE": 0}, world_size=8) == Schedule(iter_size=4)


@pytest.mark.parametrize("world_size, iter_size, golden", [
    # (ranks, ITER_SIZE, (BASE_LR, STEPS, MAX_ITER, WARM_UP_ITERS)), from the 8-GPU config by hand.
    (4, 2, (0.02, [0, 60000, 80000], 90000, 500)),    # 4 x 2 = 8: the config as written
    (8, 2, (0.04, [0, 30000, 40000], 45000, 250)),    # scale 2
    (2, 2, (0.01, [0, 120000, 160000], 180000, 1000)),  # scale 1/2
    (16, 4, (0.16, [0, 7500, 10000], 11250, 62)),     # scale 8; 500 / 8 = 62.5 rounds half to even
    (1, 8, (0.02, [0, 60000, 80000], 90000, 500)),    # one rank accumulating 8 micro-batches
])
def test_scaling_by_ranks_times_iter_size_golden(world_size, iter_size, golden):
    schedule = from_detectron({**FASTER_RCNN_8_GPUS, "ITER_SIZE": iter_size}, world_size=world_size)
    assert (schedule.base_lr, schedule.steps, schedule.max_iter, schedule.warm_up_iters) == golden
    assert schedule.iter_size == iter_size  # carried, never scaled
    base_lr, steps, _, warm_up_iters = golden
    assert schedule.lr_at(warm_up_iters) == float(np.float32(base_lr))
    assert schedule.lr_at(steps[1]) == float(np.float32(base_lr * 0.1))


@pytest.mark.parametrize("horovod", [False, True], ids=["", "horovod-warmup"])
@pytest.mark.parametrize("world_size, iter_size, plain_world_size", [(2, 2, 4), (1, 4, 4), (3, 2, 6), (4, 4, 16)])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_goyal_iter_size_times_ranks_is_the_schedule_of_that_many_ranks(policy, world_size, iter_size,
                                                                       plain_world_size, horovod):
    solver = {**COMMON, **POLICIES[policy], **({"WARM_UP_FACTOR": "horovod"} if horovod else {})}
    accumulated = from_detectron({**solver, "ITER_SIZE": iter_size}, world_size=world_size)
    plain = from_detectron(solver, world_size=plain_world_size)
    assert accumulated.iter_size == iter_size and plain.iter_size == 1
    _assert_same_schedule(accumulated, plain)
    assert accumulated.max_iter == int(round(9000 / plain_world_size))  # scaled, not the reference's 9000
    if horovod:
        assert accumulated.warm_up_factor == 1 / plain_world_size


def test_goyal_with_epoch_keys_and_a_reference_of_several_ranks():
    solver = {"BASE_LR": 0.02, "LR_POLICY": "steps_with_decay", "STEPS_EPOCHS": [0, 8, 11], "MAX_EPOCHS": 12,
              "WARM_UP_ITERS": 1000, "REFERENCE_WORLD_SIZE": 8}
    # steps_per_epoch counts updates: the same for 8 ranks x 2 micro-batches as for 16 ranks.
    accumulated = from_detectron({**solver, "ITER_SIZE": 2}, world_size=8, steps_per_epoch=500)
    plain = from_detectron(solver, world_size=16, steps_per_epoch=500)
    _assert_same_schedule(accumulated, plain)
    assert (accumulated.base_lr, accumulated.steps, accumulated.max_iter, accumulated.warm_up_iters) == \
        (0.04, [0, 4000, 5500], 6000, 500)  # epoch keys are not divided, WARM_UP_ITERS is


def test_horovod_warmup_starts_at_lr_over_the_effective_batch_multiple():
    assert from_detectron({"WARM_UP_FACTOR": "horovod", "ITER_SIZE": 2}, world_size=2).warm_up_factor == 0.25
    assert from_detectron({"WARM_UP_FACTOR": "horovod", "ITER_SIZE": 1}, world_size=2).warm_up_factor == 0.5
    scaled = from_detectron({"WARM_UP_FACTOR": "horovod", "ITER_SIZE": 2, "REFERENCE_WORLD_SIZE": 2,
                             "BASE_LR": 0.1, "WARM_UP_METHOD": "constant"}, world_size=4)
    assert scaled.warm_up_factor == 0.25 and scaled.base_lr == 0.4  # scale 4 x 2 / 2 = 4
    assert scaled.lr_at(0) == float(np.float32(0.1))  # the reference's LR during the warmup
    with pytest.raises(ValueError, match=r"WARM_UP_FACTOR must be in \(0, 1\], got 2.0 .*'horovod' = 8 / "
                                         r"\(world_size 2 x ITER_SIZE 2\)"):
        from_detectron({"WARM_UP_FACTOR": "horovod", "ITER_SIZE": 2, "REFERENCE_WORLD_SIZE": 8}, world_size=2)


def test_the_scaling_note_counts_iter_size():
    with pytest.raises(ValueError, match=r"MAX_ITER must be >= 1, got 0 \(linear scaling by world_size x ITER_SIZE "
                                         r"/ REFERENCE_WORLD_SIZE = 2 x 2 / 1\)"):
        from_detectron({"MAX_ITER": 1, "ITER_SIZE": 2, "REFERENCE_WORLD_SIZE": 1}, world_size=2)
    with pytest.raises(ValueError, match=r"\(linear scaling by world_size / REFERENCE_WORLD_SIZE = 4 / 1\)"):
        from_detectron({"MAX_ITER": 1, "REFERENCE_WORLD_SIZE": 1}, world_size=4)


def test_the_helpers_count_it():
    assert linear_scaled_lr(0.02, 16, 8, iter_size=2) == linear_scaled_lr(0.02, 32, 8) == 0.08
    assert linear_scaled_lr(0.1, 1, iter_size=4) == 0.4
    assert gradual_warmup_factor(2, iter_size=2) == gradual_warmup_factor(4) == 0.25
    assert gradual_warmup_factor(4, 2, iter_size=2) == 0.25
    # global_batch already counts the micro-batches: ranks x ITER_SIZE x per-rank batch.
    assert linear_scaled_lr_for_batch(0.1, global_batch=2 * 2 * 64, reference_batch=256) == 0.1
    for call in (lambda: linear_scaled_lr(0.1, 2, iter_size=0), lambda: gradual_warmup_factor(2, iter_size=0)):
        with pytest.raises(ValueError, match="ITER_SIZE must be >= 1, got 0"):
            call()
    with pytest.raises(TypeError, match=r"ITER_SIZE must be an int, got 1.5 \(float\)"):
        linear_scaled_lr(0.1, 2, iter_size=1.5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(sorted(POLICIES)), world_size=st.integers(1, 8), iter_size=st.integers(1, 8),
       reference=st.integers(0, 16), horovod=st.booleans())
def test_ranks_times_iter_size_is_all_that_counts(policy, world_size, iter_size, reference, horovod):
    solver = {**COMMON, **POLICIES[policy], "REFERENCE_WORLD_SIZE": reference,
              **({"WARM_UP_FACTOR": "horovod"} if horovod else {})}
    outcomes = []
    for config, ranks in (({**solver, "ITER_SIZE": iter_size}, world_size), (solver, world_size * iter_size)):
        try:
            outcomes.append(from_detectron(config, world_size=ranks))
        except ValueError as error:  # e.g. a horovod factor above 1: both are refused
            outcomes.append(type(error))
    accumulated, plain = outcomes
    if isinstance(plain, Schedule):
        assert isinstance(accumulated, Schedule) and accumulated.iter_size == iter_size
        _assert_same_schedule(accumulated, plain)
    else:
        assert accumulated is plain
