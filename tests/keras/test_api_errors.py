"""Wrong use of the Keras API fails early with a message that says what to do; configs survive serialization."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import hvd_sched
from stackutil import names_pattern
from hvd_sched.keras import (EpochCheckpoint, LearningRateLogger, ScheduleCallback, ScheduledOptimizer,
                             ScheduleLR, latest_checkpoint, restore_latest)

SOLVER = {"BASE_LR": 0.1, "LR_POLICY": "steps_with_decay", "STEPS": [0, 4], "MAX_ITER": 8, "WARM_UP_ITERS": 2}


@pytest.fixture
def schedule():
    return hvd_sched.from_detectron(SOLVER)


def _model():
    tf.keras.utils.set_random_seed(0)
    return tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])


def _xy():
    rng = np.random.default_rng(0)
    return rng.normal(size=(16, 3)).astype("float32"), rng.normal(size=(16, 2)).astype("float32")


def test_not_an_optimizer(schedule):
    with pytest.raises(TypeError, match=r"wraps a tf.keras optimizer .* got str"):
        ScheduledOptimizer("sgd", schedule)


def test_not_a_schedule():
    with pytest.raises(TypeError, match=r"schedule must be an hvd_sched.Schedule .* got float"):
        ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), 0.1)


def test_wrapping_twice(schedule):
    opt = ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule)
    with pytest.raises(ValueError, match="already a ScheduledOptimizer"):
        ScheduledOptimizer(opt, schedule)


def test_explicit_correction_on_adam_is_an_error(schedule):
    with pytest.raises(ValueError, match=r"momentum_correction='threshold' .* Adam .* momentum_correction='off'"):
        ScheduledOptimizer(tf.keras.optimizers.Adam(), schedule, momentum_correction="threshold")


def test_adam_default_correction_is_a_noop_and_trains(schedule):
    opt = ScheduledOptimizer(tf.keras.optimizers.Adam(), schedule)
    assert opt.momentum_correction_mode == "off"
    m = _model()
    m.compile(opt, "mse")
    m.fit(*_xy(), batch_size=4, epochs=2, verbose=0)
    assert int(opt.iterations.numpy()) == 8


def test_bad_correction_mode_and_threshold(schedule):
    with pytest.raises(ValueError, match=r"momentum_correction must be .* got 'sometimes'"):
        ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule, momentum_correction="sometimes")
    with pytest.raises(ValueError, match=r"correction_threshold must be a number >= 1.* got 0.5"):
        ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule, correction_threshold=0.5)


@pytest.mark.parametrize("multipliers, error, match", [
    (["bias"], TypeError, r"lr_multipliers must be a dict .* got list"),
    ({"bias": -1.0}, ValueError, r"lr_multipliers\['bias'\] must be a finite number >= 0, got -1.0"),
    ({"(": 2.0}, ValueError, r"lr_multipliers key '\(' is not a valid regex"),
])
def test_bad_multipliers(schedule, multipliers, error, match):
    with pytest.raises(error, match=match):
        ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule, lr_multipliers=multipliers)


def test_multiplier_matching_no_variable_fails_before_the_first_step(schedule):
    m = _model()
    before = [w.copy() for w in m.get_weights()]
    m.compile(ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule, lr_multipliers={"bais": 2.0}),
              "mse")
    with pytest.raises(ValueError, match=r"pattern 'bais' matches no trainable variable; the variable names are "
                                         + names_pattern("kernel", "bias")):
        m.fit(*_xy(), batch_size=4, epochs=1, verbose=0)
    for a, b in zip(before, m.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_learning_rate_of_a_scheduled_optimizer_cannot_be_set(schedule):
    opt = ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule)
    with pytest.raises(TypeError, match="comes from its schedule"):
        opt.learning_rate = 0.5


def test_schedule_callback_refuses_a_scheduled_optimizer(schedule):
    m = _model()
    m.compile(ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule), "mse")
    with pytest.raises(ValueError, match="already follows its schedule"):
        m.fit(*_xy(), batch_size=4, epochs=1, verbose=0, callbacks=[ScheduleCallback(schedule)])


def test_schedule_callback_needs_steps_per_execution_1(schedule):
    m = _model()
    m.compile(tf.keras.optimizers.SGD(0.1, momentum=0.9), "mse", steps_per_execution=2)
    with pytest.raises(ValueError, match=r"steps_per_execution=1"):
        m.fit(*_xy(), batch_size=4, epochs=1, verbose=0, callbacks=[ScheduleCallback(schedule)])


def test_logger_without_schedule_needs_a_scheduled_optimizer():
    m = _model()
    m.compile(tf.keras.optimizers.SGD(0.1), "mse")
    with pytest.raises(ValueError, match="needs a model compiled with a ScheduledOptimizer"):
        m.fit(*_xy(), batch_size=4, epochs=1, verbose=0, callbacks=[LearningRateLogger()])


def test_optimizer_config_round_trip_through_json(schedule):
    opt = ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.8, nesterov=True), schedule,
                             momentum_correction="every_change", correction_threshold=1.5,
                             lr_multipliers={"bias": 2.0, "kernel": 0.5})
    config = json.loads(json.dumps(opt.get_config()))
    again = type(opt).from_config(config)
    assert again.get_config() == opt.get_config()
    assert again.schedule == schedule and again.momentum_correction_mode == "every_change"
    assert again.nesterov and again.momentum == 0.8
    lr = ScheduleLR(schedule)
    assert ScheduleLR.from_config(json.loads(json.dumps(lr.get_config()))).schedule == schedule
    assert float(lr(tf.constant(10**9))) == schedule.lr_at(10**9)


def test_torn_checkpoint_write_never_becomes_latest(tmp_path, schedule):
    m = _model()
    m.compile(ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule), "mse")
    ckpt = EpochCheckpoint(str(tmp_path), keep=2)
    ckpt.set_model(m)
    m.fit(*_xy(), batch_size=4, epochs=1, verbose=0)
    ckpt.save(0)
    saved = [w.copy() for w in m.get_weights()]
    # What a process killed inside save(1) leaves behind: a half-written temporary folder.
    torn = tmp_path / ".tmp-epoch-0001-999"
    torn.mkdir()
    (torn / "ckpt.index").write_bytes(b"\x00garbage")
    assert latest_checkpoint(str(tmp_path))["epoch"] == 0
    m2 = _model()
    m2.compile(ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule), "mse")
    meta = restore_latest(str(tmp_path), m2)
    assert meta["epoch"] == 0 and meta["iteration"] == 4 and int(m2.optimizer.iterations.numpy()) == 4
    for a, b in zip(saved, m2.get_weights()):
        np.testing.assert_array_equal(a, b)
    for epoch in (1, 2, 3):
        ckpt.save(epoch)
    assert sorted(os.listdir(tmp_path)) == ["epoch-0002", "epoch-0003", "latest"]


def test_epoch_checkpoint_keep_must_be_positive():
    with pytest.raises(ValueError, match="keep must be an int >= 1, got 0"):
        EpochCheckpoint("x", keep=0)
