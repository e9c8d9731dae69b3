"""The momentum-correction rule against a loop re-implementation of Detectron's training loop.

``detectron_walk`` is written from ``detectron/utils/train.py`` (``for cur_iter in range(start_iter, MAX_ITER)``)
and ``detectron/modeling/detector.py`` (``UpdateWorkspaceLr``, ``_SetNewLr``, ``_get_lr_change_ratio``): the LR
blob is float32 and starts at 0.0, the ratio is NumPy's promotion of those float32 scalars, the guard is
``cur_lr > 1e-7`` on an ``np.float32`` scalar, which Detectron's NumPy 1.x compares in float64 (NumPy 2, NEP 50,
compares a float32 scalar with a Python float in float32, so the promotion is written out here: ``float(cur_lr)``). ``every_change`` follows the seed's ``add_variable_stepsize_lr``
(rescale on every change) with hvd_sched's float32 factor and the same guard.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_sched import Schedule, correction_factor, correction_factors, lr_change_ratio
from hvd_sched.momentum import MODES


def _get_lr_change_ratio(cur_lr, new_lr):
    eps = 1e-10
    return np.max((new_lr / np.max((cur_lr, eps)), cur_lr / np.max((new_lr, eps))))


def detectron_factor(cur_lr, new_lr, mode, threshold):
    """One ``UpdateWorkspaceLr`` step: the factor ``_CorrectMomentum`` is called with, or None."""
    cur_lr, new_lr = np.float32(cur_lr), np.float32(new_lr)
    if mode == "off" or not cur_lr != new_lr:
        return None
    if mode == "threshold":
        ratio = _get_lr_change_ratio(cur_lr, new_lr)
        if float(cur_lr) > 1e-7 and ratio > threshold:
            return new_lr / cur_lr
        return None
    return new_lr / cur_lr if float(cur_lr) > 1e-7 else None


def detectron_walk(schedule, stop, start=0, blob_restarts_at_zero=False):
    """Walk ``start..stop-1`` as Detectron's loop; ``cur`` at ``start`` is ``lr(start - 1)`` (hvd_sched's resume)
    unless ``blob_restarts_at_zero`` (what Detectron itself does after a resume)."""
    cur_lr = np.float32(0.0 if start == 0 or blob_restarts_at_zero else schedule.lr_at(start - 1))
    corrections = []
    for cur_iter in range(start, stop):
        new_lr = np.float32(schedule.lr_at(cur_iter))
        factor = detectron_factor(cur_lr, new_lr, schedule.correction_mode, schedule.scale_momentum_threshold)
        if factor is not None:
            assert type(factor) is np.float32
            corrections.append((cur_iter, float(factor)))
        cur_lr = new_lr
    return corrections


SCHEDULES = {
    "steps_warmup": dict(base_lr=0.02, lr_policy="steps_with_decay", steps=[0, 600, 1500], max_iter=2000),
    "steps_constant_warmup": dict(base_lr=0.02, lr_policy="steps_with_decay", steps=[0, 600, 1500],
                                  max_iter=2000, warm_up_method="constant", warm_up_factor=0.1, warm_up_iters=300),
    "step": dict(base_lr=0.02, lr_policy="step", step_size=700, max_iter=2000, warm_up_iters=100),
    "lrs_up_and_down": dict(lr_policy="steps_with_lrs", steps=[0, 100, 200, 300], lrs=[0.01, 0.05, 0.0101, 0.01],
                            max_iter=400, warm_up_iters=0),
    "cosine": dict(base_lr=0.02, lr_policy="cosine_decay", max_iter=1000, warm_up_iters=50),
    "exp": dict(base_lr=0.02, lr_policy="exp_decay", gamma=1e-4, max_iter=100, warm_up_iters=0),
    "poly": dict(base_lr=0.02, lr_policy="poly", power=2.0, max_iter=300, warm_up_iters=20),
    "variable": dict(base_lr=0.1, lr_policy="variable_stepsize", step_sizes=[300, 300, 200], warm_up_iters=0),
}


@pytest.mark.parametrize("mode", ["threshold", "every_change", "off"])
@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_momentum_corrections_match_the_training_loop(name, mode):
    options = {"scale_momentum": mode != "off", "scale_momentum_mode": "threshold" if mode == "off" else mode}
    schedule = Schedule(**SCHEDULES[name], **options)
    stop = schedule.hold_iter + 50
    assert schedule.correction_mode == mode
    assert schedule.momentum_corrections(stop) == detectron_walk(schedule, stop)


def test_hand_computed_step_corrections():
    schedule = Schedule(base_lr=0.02, lr_policy="steps_with_decay", steps=[0, 60, 80], max_iter=90, warm_up_iters=0)
    expected = [(60, float(np.float32(0.002) / np.float32(0.02))), (80, float(np.float32(0.0002) / np.float32(0.002)))]
    assert schedule.momentum_corrections(90) == expected
    assert all(abs(factor - 0.1) < 1e-7 for _, factor in expected)
    # every_change additionally corrects on each linear-warmup step after the first (cur = 0 at iteration 0)
    warm = Schedule(base_lr=0.02, lr_policy="steps_with_decay", steps=[0, 60, 80], max_iter=90, warm_up_iters=10,
                    scale_momentum_mode="every_change")
    assert [it for it, _ in warm.momentum_corrections(90)] == list(range(1, 11)) + [60, 80]


@pytest.mark.parametrize("start", [1, 299, 300, 301, 599, 600, 601, 1499, 1500, 1999, 2000, 2500])
@pytest.mark.parametrize("mode", ["threshold", "every_change"])
def test_resume_points(start, mode):
    schedule = Schedule(base_lr=0.02, lr_policy="steps_with_decay", steps=[0, 600, 1500], max_iter=2000,
                        warm_up_iters=300, warm_up_method="constant", warm_up_factor=0.1, scale_momentum_mode=mode)
    full = schedule.momentum_corrections(2600)
    resumed = schedule.momentum_corrections(2600, start=start)
    assert resumed == detectron_walk(schedule, 2600, start)
    assert resumed == [item for item in full if item[0] >= start]  # as an uninterrupted run


def test_resume_exactly_at_a_step_reports_the_correction_detectron_skips():
    schedule = Schedule(base_lr=0.02, lr_policy="steps_with_decay", steps=[0, 600, 1500], max_iter=2000,
                        warm_up_iters=0)
    assert schedule.momentum_corrections(2000, start=600)[0] == (600, float(np.float32(0.002) / np.float32(0.02)))
    detectron_resumed = detectron_walk(schedule, 2000, 600, blob_restarts_at_zero=True)
    assert [it for it, _ in detectron_resumed] == [1500]


def test_cosine_tail_corrections_stop_at_the_guard():
    schedule = Schedule(base_lr=0.02, lr_policy="cosine_decay", max_iter=1000, warm_up_iters=0)
    lrs = schedule.lr_at(np.arange(0, 1001))
    ratios = lr_change_ratio(lrs[:-1], lrs[1:])  # change into iteration it = 1..1000
    cur = lrs[:-1].astype(np.float64)
    corrections = dict(schedule.momentum_corrections(1001))
    over = np.nonzero(ratios > 1.1)[0] + 1
    guarded = [int(it) for it in over if cur[it - 1] <= 1e-7]
    corrected = [int(it) for it in over if cur[it - 1] > 1e-7]
    assert corrected and guarded and max(corrected) < min(guarded)  # ratios exceed 1.1 near MAX_ITER ...
    assert sorted(corrections) == corrected  # ... but the 1e-7 guard stops the corrections
    assert corrections == dict(detectron_walk(schedule, 1001))


def test_ratio_exactly_at_the_threshold_does_not_correct():
    for lrs in ([0.25, 0.3125], [0.3125, 0.25]):  # ratio exactly 1.25 in float32 and float64
        common = dict(lr_policy="steps_with_lrs", steps=[0, 10], lrs=lrs, max_iter=20, warm_up_iters=0)
        assert lr_change_ratio(lrs[0], lrs[1]) == 1.25
        assert Schedule(**common, scale_momentum_threshold=1.25).momentum_corrections(20) == []
        below = float(np.nextafter(1.25, 0))
        assert [it for it, _ in Schedule(**common, scale_momentum_threshold=below).momentum_corrections(20)] == [10]


def test_guard_compares_in_float64_like_detectrons_scalar():
    at_guard = float(np.float32(1e-7))  # 1.0000000116860974e-07: > 1e-7 in float64, == float32(1e-7)
    below = float(np.nextafter(np.float32(1e-7), np.float32(0)))
    # NumPy 1.x (Detectron's) compares np.float32(at_guard) > 1e-7 in float64; written out for NumPy 2 (NEP 50).
    assert np.float64(np.float32(at_guard)) > 1e-7 and not np.float64(np.float32(below)) > 1e-7
    for cur, corrects in ((at_guard, True), (below, False)):
        schedule = Schedule(lr_policy="steps_with_lrs", steps=[0, 10], lrs=[cur, 1e-5], max_iter=20, warm_up_iters=0)
        assert bool(schedule.momentum_corrections(20)) is corrects
        assert schedule.momentum_corrections(20) == detectron_walk(schedule, 20)
        assert (correction_factor(cur, 1e-5) is not None) is corrects


def test_correction_factor_scalar_values():
    assert correction_factor(0.0, 0.02) is None  # the LR blob starts at 0
    assert correction_factor(0.02, 0.02) is None
    assert correction_factor(0.02, 0.0199) is None  # ratio 1.005 <= 1.1
    assert correction_factor(0.02, 0.0199, mode="every_change") == np.float32(0.0199) / np.float32(0.02)
    assert correction_factor(0.02, 0.002, mode="off") is None
    factor = correction_factor(0.02, 0.002)
    assert type(factor) is np.float32 and factor == np.float32(0.002) / np.float32(0.02)
    assert correction_factor(0.002, 0.02) == np.float32(0.02) / np.float32(0.002)  # increases correct too


float32s = st.one_of(
    st.floats(min_value=0, max_value=10, width=32, allow_subnormal=True),
    st.sampled_from([0.0, 1e-7, float(np.float32(1e-7)), 1e-10, 1e-12, 0.02, 0.022, 0.0181818]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(float32s, float32s), min_size=1, max_size=20), st.sampled_from(MODES),
       st.sampled_from([1.0, 1.1, 1.25, 2.0]))
def test_vectorised_rule_equals_the_scalar_rule(pairs, mode, threshold):
    cur = np.array([pair[0] for pair in pairs], dtype=np.float32)
    new = np.array([pair[1] for pair in pairs], dtype=np.float32)
    mask, factors = correction_factors(cur, new, mode, threshold)
    assert mask.dtype == bool and factors.dtype == np.float32
    for index, (cur_lr, new_lr) in enumerate(pairs):
        expected = detectron_factor(cur_lr, new_lr, mode, threshold)
        assert correction_factor(cur_lr, new_lr, mode, threshold) == expected
        assert bool(mask[index]) is (expected is not None)
        assert factors[index].view(np.uint32) == np.float32(1.0 if expected is None else expected).view(np.uint32)


def test_lr_change_ratio_is_detectrons():
    cur, new = np.float32(0.02), np.float32(0.002)
    assert lr_change_ratio(0.02, 0.002) == _get_lr_change_ratio(cur, new)
    assert lr_change_ratio(0.0, 0.02) == float(np.float32(0.02)) / 1e-10
    assert lr_change_ratio(0.02, 0.0) == float(np.float32(0.02)) / 1e-10
    array = lr_change_ratio(np.array([0.02, 0.0]), np.array([0.002, 0.02]))
    assert array.dtype == np.float64 and array.tolist() == [lr_change_ratio(0.02, 0.002), lr_change_ratio(0, 0.02)]


def test_glue_table_agrees_with_momentum_corrections():
    schedule = Schedule(base_lr=0.02, lr_policy="cosine_decay", max_iter=1000, warm_up_iters=0)
    lrs = schedule.lr_at(np.arange(schedule.hold_iter + 1))
    prev = np.concatenate([np.zeros(1, dtype=np.float32), lrs[:-1]])
    mask, factors = correction_factors(prev, lrs, schedule.correction_mode, schedule.scale_momentum_threshold)
    assert list(zip(np.nonzero(mask)[0].tolist(), factors[mask].tolist())) == schedule.momentum_corrections(10**6)


@pytest.mark.parametrize("call, error, match", [
    (lambda: correction_factor(0.1, 0.01, mode="sometimes"), ValueError,
     "SCALE_MOMENTUM_MODE must be one of .*, got 'sometimes'"),
    (lambda: correction_factor(0.1, 0.01, threshold=0.9), ValueError,
     r"SCALE_MOMENTUM_THRESHOLD must be a finite number >= 1, got 0.9"),
    (lambda: correction_factor(0.1, 0.01, threshold=True), TypeError, "SCALE_MOMENTUM_THRESHOLD must be a number"),
    (lambda: correction_factor(True, 0.01), TypeError, "cur_lr must be a number, got True"),
    (lambda: correction_factor([0.1], 0.01), TypeError, r"cur_lr must be a number, got \[0.1\]"),
    (lambda: correction_factors([0.1, 0.2], [0.1]), ValueError, "same shape"),
    (lambda: correction_factors(["a"], ["b"]), TypeError, "cur_lrs must be numbers"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
