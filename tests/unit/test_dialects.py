"""Dialects: each family's YAML loads unchanged and matches a re-derivation of that repository's own code.

The reference is ``tests/dialect_reference.py`` (scalar, one iteration at a time, mirroring Large-Scale-VRD's
``add_variable_stepsize_lr`` loop, video-nonlocal-net's ``get_lr_at_iter`` / ``_SetNewLr`` and Detectron's walk;
checked against the repositories' own functions when it was written). It does not import hvd_sched.
"""

import pathlib

import numpy as np
import pytest
import yaml

import hvd_sched
from hvd_sched import Schedule, from_detectron
import dialect_reference as ref

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "dialects"
VRD = sorted((FIXTURES / "large_scale_vrd").glob("*.yaml"))
VNL = sorted((FIXTURES / "video_nonlocal").glob("*.yaml"))


def _document(path):
    return yaml.safe_load(path.read_text())


def _compare(schedule, lrs, corrections):
    its = np.arange(len(lrs), dtype=np.int64)
    np.testing.assert_array_equal(schedule.lr_at(its).view(np.uint32), np.asarray(lrs, np.float32).view(np.uint32))
    got = schedule.momentum_corrections(len(lrs))
    assert [it for it, _ in got] == [it for it, _ in corrections]
    for (_, factor), (_, expected) in zip(got, corrections):
        assert abs(factor - float(expected)) <= 1e-6 * abs(float(expected))


@pytest.mark.parametrize("path", VRD, ids=lambda path: path.stem)
def test_large_scale_vrd_yaml_matches_its_code(path):
    cfg = ref.vrd_solver(_document(path))
    schedule = from_detectron(path, dialect="large_scale_vrd")
    stop = cfg["NUM_ITERATIONS"] + 50
    _compare(schedule, [ref.vrd_lr_at(cfg, it) for it in range(stop)], ref.vrd_corrections(cfg, stop))
    assert schedule.correction_mode == ("any_change" if cfg["SCALE_MOMENTUM"] else "off")
    assert schedule.nesterov is False  # its MomentumSGDUpdate has no nesterov, whatever NESTEROV says


@pytest.mark.parametrize("scale_momentum", [False, True])
@pytest.mark.parametrize("path", VNL, ids=lambda path: path.stem)
def test_video_nonlocal_yaml_matches_its_code(path, scale_momentum):
    document = _document(path)
    document["SOLVER"] = {**document["SOLVER"], "SCALE_MOMENTUM": scale_momentum}
    cfg = ref.vnl_solver(document)
    schedule = from_detectron(document, dialect="video_nonlocal")
    stop = cfg["MAX_ITER"] + 50
    _compare(schedule, [ref.vnl_lr_at(cfg, it) for it in range(stop)], ref.vnl_corrections(cfg, stop))
    assert schedule.nesterov is cfg["NESTEROV"]


def test_detectron_gn_yaml_matches_its_code():
    path = FIXTURES / "detectron" / "gn_steps_with_decay.yaml"
    document = _document(path)
    cfg = {**ref.DETECTRON_DEFAULTS, **document["SOLVER"]}
    schedule = from_detectron(path)
    stop = cfg["MAX_ITER"] + 50
    corrections, _ = ref.detectron_walk(cfg, stop)
    _compare(schedule, [ref.detectron_lr_at(cfg, it) for it in range(stop)], corrections)
    assert schedule.weight_decay_gn == cfg["WEIGHT_DECAY_GN"]


@pytest.mark.parametrize("dialect", ["large_scale_vrd", "video_nonlocal"])
def test_a_dialects_defaults_are_its_repositorys(dialect):
    # video-nonlocal-net's own defaults reach LRS[3] (IndexError at iteration 450450): four LRS make them valid.
    schedule = from_detectron({} if dialect == "large_scale_vrd" else {"LRS": [1, 0.1, 0.01, 0.001]}, dialect=dialect)
    assert schedule.scale_momentum is False and schedule.base_lr == 0.1 and schedule.momentum == 0.9
    if dialect == "large_scale_vrd":
        assert schedule.max_iter == 600600 and schedule.step_sizes == [150150] * 3
        assert schedule.warm_up_iters == 0 and schedule.weight_decay == 0.0001
    else:
        assert schedule.steps == [0, 150150, 300300, 450450] and schedule.max_iter == 500500
        assert schedule.nesterov is True and schedule.warm_up_iters == 0
        with pytest.raises(ValueError, match=r"LRS must have one entry per STEPS entry \(4\)"):
            from_detectron({}, dialect=dialect)


def test_schedules_of_other_dialects_round_trip_through_json():
    import json

    for path, dialect in [(VRD[0], "large_scale_vrd"), (VNL[0], "video_nonlocal")]:
        schedule = from_detectron(path, dialect=dialect)
        assert Schedule.from_config(json.loads(json.dumps(schedule.get_config()))) == schedule


@pytest.mark.parametrize("key, dialect, message", [
    ("NUM_ITERATIONS", "detectron", "unknown SOLVER key 'NUM_ITERATIONS' (a Large-Scale-VRD key: pass "
                                    "dialect='large_scale_vrd')"),
    ("WARMUP", "detectron", "(a video-nonlocal-net key: pass dialect='video_nonlocal')"),
    ("NESTEROV", "detectron", "(a Large-Scale-VRD and video-nonlocal-net key: pass dialect='large_scale_vrd' or "
                              "dialect='video_nonlocal')"),
    ("WEIGHT_DECAY_BN", "detectron", "a Large-Scale-VRD and video-nonlocal-net key"),
    ("MAX_ITER", "large_scale_vrd", "unknown SOLVER key 'MAX_ITER' for dialect 'large_scale_vrd' (a Detectron and "
                                    "video-nonlocal-net key"),
    ("WARMUP", "large_scale_vrd", "(a video-nonlocal-net key: pass dialect='video_nonlocal')"),
    ("WARM_UP_LR", "video_nonlocal", "(a Large-Scale-VRD key"),
    ("NUM_ITERATION", "large_scale_vrd", "did you mean 'NUM_ITERATIONS'?"),
])
def test_a_key_of_another_dialect_says_which(key, dialect, message):
    with pytest.raises(ValueError) as error:
        from_detectron({key: 1}, dialect=dialect)
    assert message in str(error.value)


@pytest.mark.parametrize("solver, dialect, error, message", [
    ({}, "caffe2", ValueError, "dialect must be one of ['detectron', 'large_scale_vrd', 'video_nonlocal'], "
                               "got 'caffe2'"),
    ({"NUM_ITERATIONS": 0}, "large_scale_vrd", ValueError, "NUM_ITERATIONS must be >= 1, got 0"),
    ({"WARM_UP_LR": -1.0}, "large_scale_vrd", ValueError, "WARM_UP_LR must be > 0, got -1.0"),
    ({"GRADUAL_LR_STEP": 0.0}, "large_scale_vrd", ValueError, "GRADUAL_LR_STEP must be > 0, got 0.0"),
    ({"GRADUAL_INCREASE_LR": "yes"}, "large_scale_vrd", TypeError, "GRADUAL_INCREASE_LR must be a bool"),
    ({"STEP_SIZES": []}, "large_scale_vrd", ValueError, "STEP_SIZES must be non-empty"),
    ({"WARMUP": {"WARMUP_ON": True, "WARMUP_END_ITER": 1}}, "video_nonlocal", ValueError,
     "WARMUP.WARMUP_END_ITER must be >= 2"),
    ({"WARMUP": {"WARMUP_ON": True, "WARMUP_START_LR": 0.0}}, "video_nonlocal", ValueError,
     "WARMUP.WARMUP_START_LR must be > 0, got 0.0"),
    ({"WARMUP": {"WARMUP_ONN": True}}, "video_nonlocal", ValueError, "unknown SOLVER.WARMUP key 'WARMUP_ONN'"),
    ({"WARMUP": 5}, "video_nonlocal", TypeError, "WARMUP must be a mapping"),
    ({"STEPS": [0, 10]}, "video_nonlocal", ValueError, "it is derived from STEP_SIZES"),
    ({"LR_POLICY": "step"}, "video_nonlocal", ValueError, "LR_POLICY must be one of"),
    ({"NESTEROV": 1}, "video_nonlocal", TypeError, "NESTEROV must be a bool, got 1"),
])
def test_bad_dialect_values_name_the_key(solver, dialect, error, message):
    with pytest.raises(error) as raised:
        from_detectron(solver, dialect=dialect)
    assert message in str(raised.value)


def test_valid_lists_still_include_every_detectron_key():
    assert "WEIGHT_DECAY_GN" in hvd_sched.SOLVER_KEYS and "NUM_ITERATIONS" not in hvd_sched.SOLVER_KEYS
