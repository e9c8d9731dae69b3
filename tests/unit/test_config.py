"""``from_detectron`` / ``load_solver``: Detectron keys and YAML, epoch units, linear scaling, bad input."""

import textwrap

import numpy as np
import pytest

from hvd_sched import (
    EPOCH_KEYS,
    SOLVER_KEYS,
    Schedule,
    from_detectron,
    gradual_warmup_factor,
    linear_scaled_lr,
    linear_scaled_lr_for_batch,
    load_solver,
)

# Detectron's detectron/core/config.py SOLVER defaults, copied by hand.
DETECTRON_SOLVER_DEFAULTS = {
    "BASE_LR": 0.001, "LR_POLICY": "step", "GAMMA": 0.1, "STEP_SIZE": 30000, "STEPS": [], "LRS": [],
    "MAX_ITER": 40000, "MOMENTUM": 0.9, "WEIGHT_DECAY": 0.0005, "WARM_UP_ITERS": 500, "WARM_UP_FACTOR": 1.0 / 3.0,
    "WARM_UP_METHOD": "linear", "SCALE_MOMENTUM": True, "SCALE_MOMENTUM_THRESHOLD": 1.1,
    "LOG_LR_CHANGE_THRESHOLD": 1.1,
}

FASTER_RCNN_YAML = """\
MODEL:
  TYPE: generalized_rcnn
  CONV_BODY: FPN.add_fpn_ResNet50_conv5_body
NUM_GPUS: 8
SOLVER:
  WEIGHT_DECAY: 0.0001
  LR_POLICY: steps_with_decay
  BASE_LR: 0.02
  GAMMA: 0.1
  MAX_ITER: 90000
  STEPS: [0, 60000, 80000]
TRAIN:
  SCALES: (800,)
  MAX_SIZE: 1333
"""


def test_solver_keys_hold_detectrons_defaults():
    assert {key: SOLVER_KEYS[key] for key in DETECTRON_SOLVER_DEFAULTS} == DETECTRON_SOLVER_DEFAULTS
    assert SOLVER_KEYS["LR_FACTOR"] == 1.0 and SOLVER_KEYS["REFERENCE_WORLD_SIZE"] == 0
    assert from_detectron({}) == Schedule()


def test_mapping_and_solver_section_and_yaml_agree(tmp_path):
    solver = {"WEIGHT_DECAY": 0.0001, "LR_POLICY": "steps_with_decay", "BASE_LR": 0.02, "GAMMA": 0.1,
              "MAX_ITER": 90000, "STEPS": [0, 60000, 80000]}
    expected = Schedule(weight_decay=0.0001, lr_policy="steps_with_decay", base_lr=0.02, max_iter=90000,
                        steps=[0, 60000, 80000])
    path = tmp_path / "e2e_faster_rcnn_R-50-FPN_1x.yaml"
    path.write_text(FASTER_RCNN_YAML)
    assert from_detectron(solver) == expected
    assert from_detectron({"SOLVER": solver, "MODEL": {"TYPE": "x"}, "NUM_GPUS": 8}) == expected
    assert from_detectron(str(path)) == expected == from_detectron(path)
    assert load_solver(path) == solver


def test_the_caller_mapping_is_not_mutated():
    solver = {"SOLVER": {"MAX_EPOCHS": 2, "STEPS_EPOCHS": [0, 1], "LR_POLICY": "steps_with_decay",
                         "REFERENCE_WORLD_SIZE": 2}}
    snapshot = {"SOLVER": dict(solver["SOLVER"], STEPS_EPOCHS=[0, 1])}
    from_detectron(solver, steps_per_epoch=10, world_size=4)
    assert solver == snapshot


@pytest.mark.parametrize("key, suggestion", [("WARMUP_ITERS", "WARM_UP_ITERS"), ("BASELR", "BASE_LR"),
                                             ("STEP", "STEPS"), ("MAX_EPOCH", "MAX_EPOCHS")])
def test_unknown_key_suggests_the_closest(key, suggestion):
    with pytest.raises(ValueError, match=f"unknown SOLVER key '{key}'; did you mean '{suggestion}'\\?"):
        from_detectron({key: 1})


def test_lower_case_keys_are_refused_with_a_pointer_to_from_config():
    with pytest.raises(ValueError, match="SOLVER key 'base_lr' is not upper case; did you mean 'BASE_LR'.*"
                                         "Schedule.from_config"):
        from_detectron(Schedule().get_config())


@pytest.mark.parametrize("solver, error, match", [
    ({"LR_POLICY": "cosine"}, ValueError, "unknown LR_POLICY 'cosine'"),
    ({"BASE_LR": -1}, ValueError, "BASE_LR must be > 0, got -1"),
    ({"WARM_UP_FACTOR": 1.5}, ValueError, r"WARM_UP_FACTOR must be in \(0, 1\], got 1.5"),
    ({"WARM_UP_FACTOR": "gradual"}, ValueError, "WARM_UP_FACTOR must be a number or 'horovod', got 'gradual'"),
    ({"SCALE_MOMENTUM_THRESHOLD": 0.5}, ValueError, "SCALE_MOMENTUM_THRESHOLD must be >= 1, got 0.5"),
    ({"SOLVER": {"BASE_LR": 0.1}, "BASE_LR": 0.2}, ValueError, r"SOLVER keys \['BASE_LR'\] given next to"),
    ({"SOLVER": [1, 2]}, TypeError, "the SOLVER section must be a mapping"),
    ({1: 2}, TypeError, "SOLVER keys must be strings, got 1"),
    ({"REFERENCE_WORLD_SIZE": -1}, ValueError, "REFERENCE_WORLD_SIZE must be >= 0, got -1"),
])
def test_invalid_solvers(solver, error, match):
    with pytest.raises(error, match=match):
        from_detectron(solver)


def test_solver_of_the_wrong_type():
    with pytest.raises(TypeError, match="solver must be a mapping of SOLVER keys or a YAML path, got int"):
        from_detectron(3)
    with pytest.raises(TypeError, match="steps_per_epoch must be an int, got 1.5"):
        from_detectron({}, steps_per_epoch=1.5)
    with pytest.raises(ValueError, match="world_size must be >= 1, got 0"):
        from_detectron({}, world_size=0)


# ---------------------------------------------------------------------------- epoch units

def test_epoch_keys_convert_once_to_iterations():
    schedule = from_detectron({"LR_POLICY": "steps_with_decay", "MAX_EPOCHS": 12, "STEPS_EPOCHS": [0, 8, 11],
                               "WARM_UP_EPOCHS": 0.5, "STEP_SIZE_EPOCHS": 2.5}, steps_per_epoch=1000)
    assert (schedule.max_iter, schedule.steps, schedule.warm_up_iters, schedule.step_size) == \
        (12000, [0, 8000, 11000], 500, 2500)
    variable = from_detectron({"LR_POLICY": "variable_stepsize", "STEP_SIZES_EPOCHS": [30, 30, 20]},
                              steps_per_epoch=5005)
    assert variable.step_sizes == [150150, 150150, 100100]  # the seed's ImageNet stage lengths


def test_epoch_rounding_is_pythons_round_half_to_even():
    schedule = from_detectron({"WARM_UP_EPOCHS": 0.5, "STEP_SIZE_EPOCHS": 1.5, "MAX_EPOCHS": 3.5},
                              steps_per_epoch=5)
    assert (schedule.warm_up_iters, schedule.step_size, schedule.max_iter) == (2, 8, 18)  # 2.5, 7.5, 17.5


@pytest.mark.parametrize("epoch_key", sorted(EPOCH_KEYS))
def test_epoch_key_needs_steps_per_epoch(epoch_key):
    value = [0, 1] if epoch_key.startswith("STEPS") else ([1] if epoch_key.startswith("STEP_SIZES") else 1)
    with pytest.raises(ValueError, match=f"steps_per_epoch is required when {epoch_key} is given"):
        from_detectron({epoch_key: value})


@pytest.mark.parametrize("epoch_key, iteration_key", sorted(EPOCH_KEYS.items()))
def test_both_units_of_one_key_is_an_error(epoch_key, iteration_key):
    value = [0, 1] if "STEPS" in epoch_key else ([1] if "SIZES" in epoch_key else 1)
    with pytest.raises(ValueError, match=f"give either {iteration_key} or {epoch_key}, not both"):
        from_detectron({epoch_key: value, iteration_key: value}, steps_per_epoch=10)


@pytest.mark.parametrize("solver, error, match", [
    ({"STEPS_EPOCHS": [1, 2]}, ValueError, r"STEPS_EPOCHS must start at 0, got \[1, 2\]"),
    ({"STEPS_EPOCHS": "0, 8"}, TypeError, "STEPS_EPOCHS must be a list, got '0, 8'"),
    ({"MAX_EPOCHS": 0}, ValueError, "MAX_EPOCHS must be > 0, got 0"),
    ({"WARM_UP_EPOCHS": -1}, ValueError, "WARM_UP_EPOCHS must be >= 0, got -1"),
    ({"MAX_EPOCHS": True}, TypeError, "MAX_EPOCHS must be a number, got True"),
    ({"MAX_EPOCHS": 0.01}, ValueError, r"MAX_ITER must be >= 1, got 0 \(MAX_ITER=0 was converted from "
                                       r"MAX_EPOCHS=0.01 with steps_per_epoch=10\)"),
    ({"LR_POLICY": "steps_with_decay", "STEPS_EPOCHS": [0, 0.01, 0.02]}, ValueError,
     r"STEPS must be strictly increasing, got \[0, 0, 0\] \(STEPS=\[0, 0, 0\] was converted from STEPS_EPOCHS"),
])
def test_bad_epoch_values(solver, error, match):
    with pytest.raises(error, match=match):
        from_detectron(solver, steps_per_epoch=10)


# ---------------------------------------------------------------------------- linear scaling

def detectron2_auto_scale_workers(solver, num_workers):
    """detectron2's DefaultTrainer.auto_scale_workers, on the SOLVER keys hvd_sched scales (written from it)."""
    cfg = dict(solver)
    old_world_size = cfg["REFERENCE_WORLD_SIZE"]
    if old_world_size == 0 or old_world_size == num_workers:
        return cfg
    scale = num_workers / old_world_size
    cfg["BASE_LR"] = cfg["BASE_LR"] * scale
    cfg["MAX_ITER"] = int(round(cfg["MAX_ITER"] / scale))
    cfg["WARM_UP_ITERS"] = int(round(cfg["WARM_UP_ITERS"] / scale))
    cfg["STEPS"] = [int(round(s / scale)) for s in cfg["STEPS"]]
    return cfg


@pytest.mark.parametrize("world_size", [1, 3, 8, 16, 64])
def test_reference_world_size_scales_as_detectron2(world_size):
    solver = {"BASE_LR": 0.02, "LR_POLICY": "steps_with_decay", "STEPS": [0, 60000, 80000], "MAX_ITER": 90000,
              "WARM_UP_ITERS": 1000, "REFERENCE_WORLD_SIZE": 8}
    scaled = detectron2_auto_scale_workers(solver, world_size)
    schedule = from_detectron(solver, world_size=world_size)
    assert schedule.base_lr == scaled["BASE_LR"] == linear_scaled_lr(0.02, world_size, 8)
    assert (schedule.max_iter, schedule.warm_up_iters, schedule.steps) == \
        (scaled["MAX_ITER"], scaled["WARM_UP_ITERS"], scaled["STEPS"])


def test_scaling_covers_defaults_and_absolute_lrs_only():
    schedule = from_detectron({"REFERENCE_WORLD_SIZE": 8}, world_size=16)
    assert (schedule.base_lr, schedule.max_iter, schedule.step_size, schedule.warm_up_iters) == \
        (0.002, 20000, 15000, 250)
    absolute = from_detectron({"LR_POLICY": "steps_with_lrs", "STEPS": [0, 100], "LRS": [0.02, 0.002],
                               "REFERENCE_WORLD_SIZE": 2}, world_size=4)
    assert absolute.lrs == [0.04, 0.004] and absolute.steps == [0, 50]
    relative = from_detectron({"LR_POLICY": "steps_with_relative_lrs", "STEPS": [0, 100], "LRS": [1, 0.1],
                               "REFERENCE_WORLD_SIZE": 2}, world_size=4)
    assert relative.lrs == [1.0, 0.1] and relative.base_lr == 0.002
    variable = from_detectron({"LR_POLICY": "variable_stepsize", "STEP_SIZES": [300, 300],
                               "REFERENCE_WORLD_SIZE": 1}, world_size=3)
    assert variable.step_sizes == [100, 100]


def test_epoch_valued_keys_are_not_divided():
    schedule = from_detectron({"LR_POLICY": "steps_with_decay", "STEPS_EPOCHS": [0, 8], "MAX_EPOCHS": 12,
                               "WARM_UP_ITERS": 400, "REFERENCE_WORLD_SIZE": 8}, steps_per_epoch=100, world_size=16)
    assert (schedule.steps, schedule.max_iter, schedule.warm_up_iters) == ([0, 800], 1200, 200)
    assert schedule.base_lr == 0.002


def test_scaling_errors():
    with pytest.raises(ValueError, match="REFERENCE_WORLD_SIZE=8 requires the world_size argument"):
        from_detectron({"REFERENCE_WORLD_SIZE": 8})
    with pytest.raises(ValueError, match=r"STEPS must be strictly increasing, got \[0, 0, 0\] .*linear scaling by "
                                         r"world_size / REFERENCE_WORLD_SIZE = 32 / 1"):
        from_detectron({"LR_POLICY": "steps_with_decay", "STEPS": [0, 1, 2], "REFERENCE_WORLD_SIZE": 1},
                       world_size=32)
    with pytest.raises(TypeError, match="MAX_ITER must be an int, got '9e4'"):
        from_detectron({"MAX_ITER": "9e4", "REFERENCE_WORLD_SIZE": 1}, world_size=2)
    assert from_detectron({"REFERENCE_WORLD_SIZE": 0}, world_size=64) == Schedule()  # 0: off


def test_horovod_warmup_factor():
    assert from_detectron({"WARM_UP_FACTOR": "horovod"}, world_size=4).warm_up_factor == 0.25
    scaled = from_detectron({"WARM_UP_FACTOR": "horovod", "REFERENCE_WORLD_SIZE": 2}, world_size=8)
    assert scaled.warm_up_factor == 0.25 and scaled.base_lr == 0.004
    with pytest.raises(ValueError, match="WARM_UP_FACTOR 'horovod' requires the world_size argument"):
        from_detectron({"WARM_UP_FACTOR": "horovod"})
    with pytest.raises(ValueError, match=r"WARM_UP_FACTOR must be in \(0, 1\], got 4.0 .*'horovod' = 8 / world_size 2"):
        from_detectron({"WARM_UP_FACTOR": "horovod", "REFERENCE_WORLD_SIZE": 8}, world_size=2)


def test_horovod_warmup_is_horovods_gradual_formula():
    size, warmup_epochs, steps_per_epoch = 4, 5, 100
    schedule = from_detectron({"WARM_UP_FACTOR": "horovod", "WARM_UP_EPOCHS": warmup_epochs, "BASE_LR": 0.4,
                               "LR_POLICY": "steps_with_decay", "STEPS": [0]}, steps_per_epoch=steps_per_epoch,
                              world_size=size)
    epochs = np.arange(warmup_epochs * steps_per_epoch) / steps_per_epoch
    horovod = 0.4 * (1.0 / size * (epochs * (size - 1) / warmup_epochs + 1))  # LearningRateWarmupCallback
    assert np.allclose(schedule.lr_at(np.arange(warmup_epochs * steps_per_epoch)), horovod, rtol=1e-6)


def test_scaling_helpers():
    assert linear_scaled_lr(0.02, 32, 8) == 0.02 * 4.0
    assert linear_scaled_lr(0.1, 8) == 0.1 * 8
    assert linear_scaled_lr_for_batch(0.1, global_batch=8192, reference_batch=256) == 0.1 * 32
    assert gradual_warmup_factor(8) == 0.125 and gradual_warmup_factor(8, 2) == 0.25
    with pytest.raises(ValueError, match="world_size must be >= 1, got 0"):
        linear_scaled_lr(0.1, 0)
    with pytest.raises(TypeError, match="reference_batch must be an int"):
        linear_scaled_lr_for_batch(0.1, global_batch=256, reference_batch=2.5)
    with pytest.raises(ValueError, match="BASE_LR must be > 0, got -0.1"):
        linear_scaled_lr(-0.1, 2)


# ---------------------------------------------------------------------------- YAML

def _write(tmp_path, text, name="config.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_missing_yaml_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(FileNotFoundError, match=f"Detectron config file not found: '{missing}'"):
        from_detectron(str(missing))


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = _write(tmp_path, "SOLVER:\n  BASE_LR: 0.02\n  STEPS: [0, 60000\n  MAX_ITER: 90000\n")
    with pytest.raises(ValueError, match=rf"malformed YAML in {path}, line 4, column \d+"):
        from_detectron(path)


def test_yaml_is_loaded_safely(tmp_path):
    path = _write(tmp_path, "SOLVER:\n  BASE_LR: !!python/object/apply:os.getcwd []\n")
    with pytest.raises(ValueError, match=rf"malformed YAML in {path}, line 2"):
        load_solver(path)


@pytest.mark.parametrize("text, match", [
    ("- 1\n- 2\n", "expected a mapping at the top level, got list"),
    ("SOLVER: 3\n", "the SOLVER section must be a mapping, got 3"),
])
def test_yaml_of_the_wrong_shape(tmp_path, text, match):
    with pytest.raises(ValueError, match=match):
        load_solver(_write(tmp_path, text))


def test_yaml_values_are_decoded_like_detectron(tmp_path):
    path = _write(tmp_path, """\
        SOLVER:
          BASE_LR: 1e-3
          STEPS: (0, 60000, 80000)
          LR_POLICY: steps_with_decay
          WARM_UP_FACTOR: horovod
        """)
    assert load_solver(path) == {"BASE_LR": 0.001, "STEPS": (0, 60000, 80000), "LR_POLICY": "steps_with_decay",
                                 "WARM_UP_FACTOR": "horovod"}
    schedule = from_detectron(path, world_size=2)
    assert schedule.steps == [0, 60000, 80000] and schedule.warm_up_factor == 0.5


def test_yaml_without_solver_section_and_empty_files(tmp_path):
    assert load_solver(_write(tmp_path, "BASE_LR: 0.5\nMAX_ITER: 10\n")) == {"BASE_LR": 0.5, "MAX_ITER": 10}
    assert load_solver(_write(tmp_path, "", name="empty.yaml")) == {}
    assert load_solver(_write(tmp_path, "SOLVER:\n", name="bare.yaml")) == {}
    with pytest.raises(ValueError, match="unknown SOLVER key 'MAX_ITERS'; did you mean 'MAX_ITER'"):
        from_detectron(_write(tmp_path, "SOLVER:\n  MAX_ITERS: 10\n", name="typo.yaml"))
