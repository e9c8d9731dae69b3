"""ScheduledOptimizer / ScheduleCallback against an independent numpy Detectron MomentumSGD (tests/reference.py)."""

import numpy as np
import pytest
import tensorflow as tf

import hvd_sched
from hvd_sched.keras import LearningRateLogger, ScheduleCallback, ScheduledOptimizer
from rankutil import make_mlp, make_regression
from stackutil import keras2_only
from reference import detectron_corrections, detectron_lr, train_detectron_sgd

BATCH, STEPS_PER_EPOCH, EPOCHS = 16, 10, 3
N_ITERS = STEPS_PER_EPOCH * EPOCHS
SOLVER = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 10, 20], "MAX_ITER": N_ITERS,
          "WARM_UP_ITERS": 5, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "constant"}
LINEAR = dict(SOLVER, WARM_UP_METHOD="linear", WARM_UP_ITERS=8, WARM_UP_FACTOR=0.1)
MU = 0.9


def _model():
    return make_mlp(seed=1)


def _data():
    return make_regression(n=BATCH * STEPS_PER_EPOCH, seed=3)


def _reference(solver, nesterov=False, multipliers=None, every_change=False, initial=None):
    x, y = _data()
    batches = [(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]) for i in range(STEPS_PER_EPOCH)]
    batches = batches * EPOCHS
    lrs = [detectron_lr(it, solver) for it in range(N_ITERS)]
    corrections = detectron_corrections(N_ITERS, solver, every_change=every_change)
    return train_detectron_sgd(initial, batches, lrs, corrections, MU, nesterov=nesterov, multipliers=multipliers)


def _assert_weights(got, expected):
    """Keras weights equal the numpy Detectron reference to 1e-5 (absolute)."""
    for g, want in zip(got, expected):
        np.testing.assert_allclose(g, want, atol=1e-5, rtol=0)


def _fit(optimizer, callbacks=()):
    model = _model()
    initial = [w.copy() for w in model.get_weights()]
    model.compile(optimizer, "mse")
    x, y = _data()
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=list(callbacks))
    return model, initial, history


@pytest.mark.parametrize("solver", [SOLVER, LINEAR], ids=["constant_warmup", "linear_warmup"])
@pytest.mark.parametrize("nesterov", [False, True], ids=["momentum", "nesterov"])
def test_wrapper_matches_numpy_detectron(solver, nesterov):
    schedule = hvd_sched.from_detectron(solver)
    opt = ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=MU, nesterov=nesterov), schedule)
    model, initial, _ = _fit(opt)
    expected = _reference(solver, nesterov=nesterov, initial=initial)
    assert int(opt.iterations.numpy()) == N_ITERS
    _assert_weights(model.get_weights(), expected)


def test_correction_matters():
    """Guard against a vacuous comparison: without the correction the weights differ from the reference."""
    schedule = hvd_sched.from_detectron(SOLVER)
    opt = ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=MU), schedule, momentum_correction="off")
    model, initial, _ = _fit(opt)
    expected = _reference(SOLVER, initial=initial)
    assert max(np.abs(g - w).max() for g, w in zip(model.get_weights(), expected)) > 1e-3


def test_lr_multiplier_on_biases_matches_numpy():
    schedule = hvd_sched.from_detectron(SOLVER)
    opt = ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=MU), schedule, lr_multipliers={"bias": 2.0})
    model, initial, _ = _fit(opt)
    expected = _reference(SOLVER, multipliers=[1.0, 2.0, 1.0, 2.0], initial=initial)
    _assert_weights(model.get_weights(), expected)


def test_every_change_mode_matches_numpy():
    schedule = hvd_sched.from_detectron(LINEAR)
    opt = ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=MU), schedule, momentum_correction="every_change")
    model, initial, _ = _fit(opt)
    expected = _reference(LINEAR, every_change=True, initial=initial)
    _assert_weights(model.get_weights(), expected)


@pytest.mark.parametrize("legacy", [False, pytest.param(True, marks=keras2_only("no legacy optimizers"))],
                         ids=["sgd", "legacy_sgd"])
def test_callback_path_equals_wrapper_path(legacy):
    sgd = tf.keras.optimizers.legacy.SGD if legacy else tf.keras.optimizers.SGD
    schedule = hvd_sched.from_detectron(SOLVER)
    wrapped, initial, _ = _fit(ScheduledOptimizer(sgd(momentum=MU), schedule))
    plain, initial2, history = _fit(sgd(learning_rate=0.5, momentum=MU), [ScheduleCallback(schedule)])
    for a, b in zip(initial, initial2):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(wrapped.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    expected = _reference(SOLVER, initial=initial)
    _assert_weights(plain.get_weights(), expected)


@keras2_only("no legacy optimizers")
def test_legacy_sgd_wrapper_with_multiplier_matches_numpy():
    schedule = hvd_sched.from_detectron(SOLVER)
    opt = ScheduledOptimizer(tf.keras.optimizers.legacy.SGD(momentum=MU), schedule, lr_multipliers={"bias": 2.0})
    model, initial, _ = _fit(opt)
    expected = _reference(SOLVER, multipliers=[1.0, 2.0, 1.0, 2.0], initial=initial)
    _assert_weights(model.get_weights(), expected)


@pytest.mark.parametrize("path", ["wrapper", "callback"])
def test_history_learning_rate_equals_lr_at(path):
    schedule = hvd_sched.from_detectron(SOLVER)
    batch_lrs = []

    class Record(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            batch_lrs.append(logs["learning_rate"])

    if path == "wrapper":
        _, _, history = _fit(ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=MU), schedule),
                             [LearningRateLogger(), Record()])
    else:
        _, _, history = _fit(tf.keras.optimizers.SGD(momentum=MU), [ScheduleCallback(schedule), Record()])
    want_epochs = [schedule.lr_at((e + 1) * STEPS_PER_EPOCH - 1) for e in range(EPOCHS)]
    assert history.history["learning_rate"] == want_epochs
    assert batch_lrs == [schedule.lr_at(it) for it in range(N_ITERS)]


POLICY_SOLVERS = {
    "cosine_decay": {"BASE_LR": 0.2, "LR_POLICY": "cosine_decay", "MAX_ITER": N_ITERS},
    "exp_decay": {"BASE_LR": 0.2, "LR_POLICY": "exp_decay", "GAMMA": 0.01, "MAX_ITER": N_ITERS},
    "poly": {"BASE_LR": 0.2, "LR_POLICY": "poly", "POWER": 2.0, "MAX_ITER": N_ITERS},
    "step": {"BASE_LR": 0.2, "LR_POLICY": "step", "GAMMA": 0.2, "STEP_SIZE": 7, "MAX_ITER": N_ITERS},
}
WARMUPS = {"linear_warmup": {"WARM_UP_ITERS": 8, "WARM_UP_FACTOR": 0.1, "WARM_UP_METHOD": "linear"},
           "constant_warmup": {"WARM_UP_ITERS": 5, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "constant"}}


@pytest.mark.parametrize("warmup", sorted(WARMUPS))
@pytest.mark.parametrize("policy", sorted(POLICY_SOLVERS))
@pytest.mark.parametrize("mode", ["threshold", "every_change"])
def test_every_policy_and_correction_mode_matches_numpy_detectron(policy, warmup, mode):
    solver = dict(POLICY_SOLVERS[policy], **WARMUPS[warmup])
    every_change = mode == "every_change"
    lrs = [detectron_lr(it, solver) for it in range(N_ITERS)]
    schedule = hvd_sched.from_detectron(solver)
    np.testing.assert_array_equal(schedule.lr_at(np.arange(N_ITERS)), lrs)  # the reference's own formulas
    corrections = detectron_corrections(N_ITERS, solver, every_change=every_change)
    assert corrections, "a case without corrections would not test them"
    opt = ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=MU), schedule, momentum_correction=mode,
                             lr_multipliers={"bias": 2.0})
    model, initial, _ = _fit(opt)
    expected = _reference(solver, multipliers=[1.0, 2.0, 1.0, 2.0], every_change=every_change, initial=initial)
    _assert_weights(model.get_weights(), expected)
