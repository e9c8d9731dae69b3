"""Self-test of ``tests/dialect_reference.py`` on the dialect fixtures, against values worked out by hand.

The expected numbers come from reading each repository's code (see ``docs/explanation/dialects.md``), not from the
reference itself. ``it`` is the 0-based iteration (the repositories' ``curr_iter``).
"""

from pathlib import Path

import numpy as np
import pytest
import yaml

import dialect_reference as ref

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dialects"


def _doc(dialect, name):
    return yaml.safe_load((FIXTURES / dialect / f"{name}.yaml").read_text())


def vrd(name):
    return ref.vrd_solver(_doc("large_scale_vrd", name))


def vnl(name):
    return ref.vnl_solver(_doc("video_nonlocal", name))


def f32(value):
    return np.float32(value)


def test_fixtures_exist_in_each_dialect():
    assert len(list((FIXTURES / "large_scale_vrd").glob("*.yaml"))) >= 3
    assert len(list((FIXTURES / "video_nonlocal").glob("*.yaml"))) >= 3
    assert list((FIXTURES / "detectron").glob("*gn*.yaml"))


def test_vrd_constant_warmup_is_one_based():
    cfg = vrd("warmup_constant")
    # i = it + 1 <= WARM_UP_ITERS (50): the absolute WARM_UP_LR, so iterations 0..49 inclusive.
    assert ref.vrd_lr_at(cfg, 0) == f32(0.0001)
    assert ref.vrd_lr_at(cfg, 49) == f32(0.0001)
    assert ref.vrd_lr_at(cfg, 50) == f32(0.001)
    # STEP_SIZES [600]: i = 600 is still stage 0, i = 601 (it = 600) is decayed.
    assert ref.vrd_lr_at(cfg, 599) == f32(0.001)
    assert ref.vrd_lr_at(cfg, 600) == f32(0.001 * 0.1)
    assert ref.vrd_corrections(cfg) == []  # SCALE_MOMENTUM defaults to False in Large-Scale-VRD


def test_vrd_gradual_warmup_ramp_and_corrections():
    cfg = vrd("warmup_gradual")
    assert ref.vrd_lr_python(cfg, 100) == 0.002  # i <= WARM_UP_ITERS
    assert ref.vrd_lr_python(cfg, 101) == 0.002 + 0.0005 * 1
    assert ref.vrd_lr_python(cfg, 116) == 0.01  # min(BASE_LR, 0.002 + 0.0005 * 16)
    assert ref.vrd_lr_at(cfg, 400) == f32(0.01 * 0.1)  # running sums [400, 700, 900]
    assert ref.vrd_lr_at(cfg, 999) == f32(0.01 * 0.1 ** 3)
    corrections = dict(ref.vrd_corrections(cfg))
    assert 0 not in corrections  # the first iteration compares the LR with itself
    assert corrections[100] == 0.0025 / 0.002  # a Python-float factor, no threshold
    assert set(corrections) == set(range(100, 116)) | {400, 700, 900}
    assert corrections[400] == pytest.approx(0.1, rel=1e-12)


def test_vrd_gradual_from_start_uses_i_minus_one():
    cfg = vrd("gradual_from_start")
    assert ref.vrd_lr_at(cfg, 0) == f32(0.01)  # GRADUAL_LR_START + STEP * (1 - 1)
    assert ref.vrd_lr_python(cfg, 11) == 0.01 + 0.001 * 10
    assert ref.vrd_lr_python(cfg, 41) == 0.05  # past ceil((0.05 - 0.01) / 0.001) = 40: the step LR
    assert ref.vrd_lr_at(cfg, 300) == f32(0.05 * 0.1)
    assert [it for it, _ in ref.vrd_corrections(cfg)] == list(range(1, 41)) + [300, 500]


def test_vrd_steps_past_end_and_no_solver_section():
    cfg = vrd("steps_past_end")
    assert [ref.vrd_lr_at(cfg, it) for it in (99, 100, 200, 300, 399)] == [
        f32(0.004), f32(0.002), f32(0.001), f32(0.0005), f32(0.0005)]
    assert ref.vrd_corrections(cfg) == [(100, 0.5), (200, 0.5), (300, 0.5)]
    defaults = ref.vrd_solver({"MODEL": {"TYPE": "x"}})  # no SOLVER section: every default
    assert defaults["NUM_ITERATIONS"] == 600600 and defaults["SCALE_MOMENTUM"] is False
    assert ref.vrd_lr_at(defaults, 150149) == f32(0.1) and ref.vrd_lr_at(defaults, 150150) == f32(0.1 * 0.1)


def test_vnl_warmup_starts_at_start_lr_and_reaches_end_one_early():
    cfg = vnl("relative_lrs_warmup")
    assert cfg["STEPS"] == [0, 500, 800, 1000]
    assert ref.vnl_lr_at(cfg, 0) == f32(0.001)  # 0 * (...) + WARMUP_START_LR
    expected_1 = np.float32(1 * float(f32(0.01) - f32(0.001)) / 199 + float(f32(0.001)))
    assert ref.vnl_lr_at(cfg, 1) == expected_1
    assert ref.vnl_lr_at(cfg, 199) == f32(0.01)  # it = WARMUP_END_ITER - 1 reaches lr_end
    assert ref.vnl_lr_at(cfg, 500) == f32(0.1 * 0.01)
    assert ref.vnl_lr_at(cfg, 999) == f32(0.01 * 0.01)  # LRS[3] never used: stages end at MAX_ITER
    corrections = ref.vnl_corrections(cfg)
    assert [it for it, _ in corrections] == list(range(1, 200)) + [500, 800]  # none at 0: LR blob = lr(0)
    assert corrections[0] == (1, np.float32(expected_1 / f32(0.001)))
    assert all(isinstance(factor, np.float32) for _, factor in corrections)


def test_vnl_defaults_and_no_correction():
    cfg = vnl("relative_lrs_defaults")
    assert cfg["SCALE_MOMENTUM"] is False and cfg["WEIGHT_DECAY_BN"] == 0.0001
    assert [ref.vnl_lr_at(cfg, it) for it in (0, 299, 300, 500, 599)] == [
        f32(0.005), f32(0.005), f32(0.1 * 0.005), f32(0.01 * 0.005), f32(0.01 * 0.005)]
    assert ref.vnl_corrections(cfg) == []


def test_vnl_warmup_targets_lr_at_end_iter_past_a_step():
    cfg = vnl("steps_with_lrs_warmup_past_step")
    assert ref.vnl_lr_at(cfg, 0) == f32(0.0005)
    assert ref.vnl_lr_at(cfg, 449) == f32(0.002)  # lr_end = LRS[1]: the step at 400 is inside the warmup
    assert ref.vnl_lr_at(cfg, 450) == f32(0.002) and ref.vnl_lr_at(cfg, 600) == f32(0.0002)
    assert ref.vnl_corrections(cfg)[-1] == (600, np.float32(f32(0.0002) / f32(0.002)))


def test_vnl_steps_with_decay_and_param_rules():
    cfg = vnl("steps_with_decay")
    assert [ref.vnl_lr_at(cfg, it) for it in (0, 100, 250, 750)] == [f32(0.01), f32(0.1), f32(0.05), f32(0.0125)]
    assert ref.vnl_corrections(cfg)[-3:] == [(250, f32(0.5)), (500, f32(0.5)), (750, f32(0.5))]
    assert ref.param_rule("video_nonlocal", cfg, name="gpu_0/res2_0_branch2a_bn_s") == (1.0, 0.0001)
    assert ref.param_rule("video_nonlocal", cfg, is_bias=True, name="gpu_0/pred_b") == (1.0, 0.0001)


def test_vnl_rejects_steps_in_yaml_and_zero_previous_lr():
    with pytest.raises(ValueError, match="STEPS"):
        ref.vnl_solver({"SOLVER": {"STEPS": [0, 10]}})  # default None: any list is a type mismatch
    cfg = ref.vnl_solver({"SOLVER": {"MAX_ITER": 20, "STEP_SIZES": [20], "SCALE_MOMENTUM": True,
                                     "WARMUP": {"WARMUP_ON": True, "WARMUP_START_LR": 0.0, "WARMUP_END_ITER": 10}}})
    with pytest.raises(AssertionError):
        ref.vnl_corrections(cfg)  # _SetNewLr asserts current_lr > 0 at the first change


def test_detectron_gn_and_lr():
    doc = _doc("detectron", "gn_steps_with_decay")
    cfg = ref.merge_solver(doc["SOLVER"], ref.DETECTRON_DEFAULTS)
    assert ref.detectron_lr_at(cfg, 0) == f32(0.02 / 3.0)
    assert ref.detectron_lr_at(cfg, 100) == f32(0.02) and ref.detectron_lr_at(cfg, 800) == f32(0.002)
    corrections, logged = ref.detectron_walk(cfg)
    assert [it for it, _ in corrections] == [800, 1100] and logged == [0, 800, 1100]
    assert ref.param_rule("detectron", cfg, is_gn=True) == (1.0, 0.00005)  # GN scale
    assert ref.param_rule("detectron", cfg, is_bias=True, is_gn=True) == (2.0, 0.0)  # GN shift: bias first
    assert ref.param_rule("large_scale_vrd", ref.vrd_solver({}), is_bias=True) == (2.0, 0.0)


def test_caffe2_momentum_update():
    step, buf = ref.caffe2_momentum_sgd(2.0, 1.0, 0.1, 0.9, nesterov=False)
    assert (step, buf) == pytest.approx((1.1, 1.1))
    step, buf = ref.caffe2_momentum_sgd(2.0, 1.0, 0.1, 0.9, nesterov=True)
    assert (step, buf) == pytest.approx((1.9 * 1.1 - 0.9, 1.1))
