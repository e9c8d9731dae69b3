"""One owner of the LR: on every Keras (Keras 2's current and legacy optimizers, Keras 3) a ScheduledOptimizer's LR
reads as the schedule's and every write is refused at the write, naming the writer and the fix, while the schedule
goes on ruling (checked against the numpy Detectron update of tests/reference.py). Also: any optimizer class (one
whose __init__ takes no learning_rate trains under the schedule), an LR that is itself a schedule, Keras 2's
convert_to_legacy_optimizer, Keras 3's set_weights, Horovod's elastic_state order and BroadcastVariables' arguments.
"""

import json
import operator
import unittest

import numpy as np
import pytest
import tensorflow as tf

import hvd_sched
import rankutil
from hvd_sched.keras import BroadcastVariables, ScheduledOptimizer, elastic_state, is_scheduled
from reference import detectron_corrections, detectron_lr, mlp_grads, train_detectron_sgd
from stackutil import KERAS_MAJOR, keras2_only

keras = tf.keras
SOLVER = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 6, 9], "MAX_ITER": 12,
          "WARM_UP_ITERS": 3, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "constant"}
BATCH, STEPS = 16, 4  # 4 iterations per epoch, 3 epochs: warmup end at 3, steps at 6 and 9 (with corrections)
FAMILIES = ["current", pytest.param("legacy", marks=keras2_only("no legacy optimizers"))]


@pytest.fixture(scope="module")
def schedule():
    return hvd_sched.from_detectron(SOLVER)


def _sgd(family, **kwargs):
    cls = keras.optimizers.legacy.SGD if family == "legacy" else keras.optimizers.SGD
    return cls(momentum=0.9, **kwargs)


def _data():
    return rankutil.make_regression(n=BATCH * STEPS, seed=3)


def _expected(initial, iterations):
    """Detectron's MomentumSGD in numpy over the same batches: what following the schedule gives."""
    x, y = _data()
    batches = [(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]) for i in range(STEPS)]
    batches = (batches * (iterations // STEPS + 1))[:iterations]
    return train_detectron_sgd([np.array(w) for w in initial], batches,
                               [detectron_lr(it, SOLVER) for it in range(iterations)],
                               detectron_corrections(iterations, SOLVER), 0.9)


def _compiled(optimizer):
    model = rankutil.make_mlp(seed=1)
    model.compile(optimizer, "mse")
    return model


def _fit(model, epochs, **kwargs):
    x, y = _data()
    return model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, **kwargs)


def _assert_follows_schedule(model, initial, iterations):
    assert int(model.optimizer.iterations.numpy()) == iterations
    for got, want in zip(model.get_weights(), _expected(initial, iterations)):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------- reading the LR

@pytest.mark.parametrize("family", FAMILIES)
def test_every_read_gives_the_schedules_lr_of_the_next_step(schedule, family):
    opt = ScheduledOptimizer(_sgd(family), schedule)
    model = _compiled(opt)
    for iteration in (0, 4, 8):
        if iteration:
            _fit(model, 1)
        want = float(np.float32(schedule.lr_at(iteration)))
        reads = [opt.lr, opt.learning_rate, float(opt.learning_rate), opt.learning_rate.numpy()]
        if hasattr(keras.backend, "get_value"):  # Keras 2; Keras 3's tf.keras.backend keeps it too
            reads += [keras.backend.get_value(opt.lr), keras.backend.get_value(opt.learning_rate)]
        assert [float(r) for r in reads] == [want] * len(reads), (iteration, reads)


_COMPARISONS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
                ">=": operator.ge}
_OPERANDS = [0.002, 0.0020000000949949026, np.float32(0.002), np.float64(0.002), 0.0021, 0.001, 0.0020000001, 1]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_lr_read_compares_as_keras_own_lr_does(family):
    """Keras' own optimizer tests assert `optimizer.learning_rate == 0.002` (testSaveAndLoadOptimizerWithModel):
    Keras 2's float32 LR variable compares with a number in float32, and so does the LR read of a
    ScheduledOptimizer there, and on Keras 3 too (its variable also compares in float32)."""
    constant = hvd_sched.Schedule(base_lr=0.002, lr_policy="steps_with_decay", steps=[0], max_iter=10,
                                  warm_up_iters=0)
    opt = ScheduledOptimizer(_sgd(family), constant)
    model = _compiled(opt)
    _fit(model, 1)
    lr = opt.learning_rate
    assert float(lr) == float(opt.lr) == float(np.float32(0.002)) == 0.0020000000949949026
    assert f"{lr:.4f}" == "0.0020" and json.dumps(lr) == "0.0020000000949949026" and hash(lr) == hash(float(lr))
    unittest.TestCase().assertEqual(opt.learning_rate, 0.002)  # as Keras' test does
    assert opt.learning_rate == 0.002 and 0.002 == opt.learning_rate and not opt.learning_rate != 0.002
    plain = _sgd(family, learning_rate=0.002).learning_rate
    for name, compare in _COMPARISONS.items():
        for operand in _OPERANDS:
            if KERAS_MAJOR == 3 and isinstance(operand, np.float64):
                continue  # Keras 3's variable compares an np.float64 in float64; the read rounds it (as Keras 2)
            assert compare(lr, operand) is bool(compare(plain, operand)), (name, operand)
    if KERAS_MAJOR == 3:
        return
    assert isinstance(plain, tf.Variable) and opt.lr == 0.002
    # Still the float it was, and still refusing writes.
    assert isinstance(lr, float) and keras.backend.get_value(lr) == 0.002
    with pytest.raises(TypeError, match=r"tried to set the learning rate of Scheduled\w*SGD to 0\.5"):
        keras.backend.set_value(opt.lr, 0.5)


# ---------------------------------------------------------------------------------------------- writing the LR

def _writes(opt):
    writes = {
        "opt.lr = x": lambda: setattr(opt, "lr", 0.5),
        "opt.learning_rate = x": lambda: setattr(opt, "learning_rate", 0.5),
        "opt.learning_rate.assign(x)": lambda: opt.learning_rate.assign(0.5),
        "opt.lr.assign_add(x)": lambda: opt.lr.assign_add(0.5),
    }
    if hasattr(keras.backend, "set_value"):  # Keras 2; Keras 3's tf.keras.backend keeps it too
        writes["K.set_value(opt.lr, x)"] = lambda: keras.backend.set_value(opt.lr, 0.5)
    return writes


@pytest.mark.parametrize("family", FAMILIES)
def test_every_write_is_refused_and_the_schedule_keeps_the_lr(schedule, family):
    opt = ScheduledOptimizer(_sgd(family), schedule)
    model = _compiled(opt)
    initial = model.get_weights()
    _fit(model, 1)
    for name, write in _writes(opt).items():
        with pytest.raises(TypeError, match=r"hvd_sched: this call tried to set the learning rate of Scheduled\w*SGD "
                                            r".*comes from its schedule .*hvd_sched.keras.ScheduleCallback"):
            write()
    # Nothing was replaced: the config, the reads and the training still follow the schedule.
    assert type(opt).from_config(opt.get_config()).schedule == schedule
    assert float(opt.lr) == float(np.float32(schedule.lr_at(STEPS)))
    _fit(model, 2)
    _assert_follows_schedule(model, initial, 3 * STEPS)


def _plateau():
    # Every epoch after the first counts as no improvement: the reduction comes at the end of epoch 1.
    return keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.1, patience=0, min_delta=1e9)


KERAS_CALLBACKS = {
    "LearningRateScheduler": (lambda: keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5),
                              r"LearningRateScheduler tried to set the learning rate .* to 0\.02500\d* .*"
                              r"Put the LR changes in the SOLVER config instead \(LR_POLICY: steps_with_decay", 0),
    "ReduceLROnPlateau": (_plateau, r"ReduceLROnPlateau tried to set the learning rate .*A ScheduledOptimizer does "
                                    r"not reduce its LR on a plateau: its LR is a function of the iteration alone",
                          2 * STEPS),
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("callback", sorted(KERAS_CALLBACKS))
def test_keras_lr_callbacks_are_refused_at_their_first_write(schedule, family, callback):
    make, message, iterations_done = KERAS_CALLBACKS[callback]
    opt = ScheduledOptimizer(_sgd(family), schedule)
    model = _compiled(opt)
    initial = model.get_weights()
    with pytest.raises(TypeError, match=message):
        _fit(model, 3, callbacks=[make()])
    # The steps before the write followed the schedule (LearningRateScheduler writes before the first step).
    _assert_follows_schedule(model, initial, iterations_done)


@keras2_only("Horovod 0.28.1's Keras callbacks call Keras 2 APIs (var.ref(), keras.backend.constant)")
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("callback", ["LearningRateWarmupCallback", "LearningRateScheduleCallback"])
def test_horovods_lr_callbacks_are_refused_at_their_first_write(horovod, schedule, family, callback):
    import horovod.tensorflow.keras as hvd

    if callback == "LearningRateWarmupCallback":
        made = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.2, warmup_epochs=1, steps_per_epoch=STEPS)
        fix = r"Put the warmup in the SOLVER config instead \(WARM_UP_ITERS or WARM_UP_EPOCHS"
    else:
        made = hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.2, multiplier=0.5, start_epoch=0)
        fix = r"Put the LR changes in the SOLVER config instead"
    model = _compiled(ScheduledOptimizer(_sgd(family), schedule))
    initial = model.get_weights()
    with pytest.raises(TypeError, match=rf"horovod\.\S*\.{callback} tried to set the learning rate .*"
                                        rf"backend.set_value\(optimizer.lr, value\).*{fix}"):
        _fit(model, 1, callbacks=[made])
    _assert_follows_schedule(model, initial, 0)  # refused before the first step


# ---------------------------------------------------------------------------------------------- any optimizer

def _sign_sgd_class(family):
    """An optimizer of one's own whose __init__ takes no learning_rate (a fixed 0.01): w -= lr * sign(g)."""
    if family == "legacy":
        class LegacySignSGD(keras.optimizers.legacy.Optimizer):
            def __init__(self, name="LegacySignSGD", **kwargs):
                super().__init__(name, **kwargs)
                self._set_hyper("learning_rate", 0.01)

            def _resource_apply_dense(self, grad, var, apply_state=None):
                return var.assign_sub(self._decayed_lr(var.dtype.base_dtype) * tf.sign(grad))

        return LegacySignSGD
    if KERAS_MAJOR == 2:
        class SignSGD(keras.optimizers.Optimizer):
            def __init__(self, name="SignSGD", **kwargs):
                super().__init__(name=name, **kwargs)
                self._learning_rate = self._build_learning_rate(0.01)

            def update_step(self, gradient, variable):
                variable.assign_sub(tf.cast(self.learning_rate, variable.dtype) * tf.sign(gradient))

        return SignSGD
    from keras import ops

    class SignSGD(keras.optimizers.Optimizer):
        def __init__(self, name="SignSGD", **kwargs):
            super().__init__(learning_rate=0.01, name=name, **kwargs)

        def update_step(self, gradient, variable, learning_rate):
            self.assign_sub(variable, ops.multiply(ops.cast(learning_rate, variable.dtype), ops.sign(gradient)))

    return SignSGD


@pytest.mark.parametrize("family", FAMILIES)
def test_an_optimizer_without_a_learning_rate_argument_trains_under_the_schedule(schedule, family):
    cls = _sign_sgd_class(family)
    opt = ScheduledOptimizer(cls(), schedule)
    assert isinstance(opt, cls) and is_scheduled(opt) and type(opt).__name__ == "Scheduled" + cls.__name__
    model = _compiled(opt)
    initial = model.get_weights()
    _fit(model, 3)
    # numpy: w -= float32(lr_at(it)) * sign(grad) at every iteration.
    params = [np.array(w, np.float64) for w in initial]
    x, y = _data()
    for it in range(3 * STEPS):
        batch = slice((it % STEPS) * BATCH, (it % STEPS + 1) * BATCH)
        grads = mlp_grads(params, x[batch].astype(np.float64), y[batch].astype(np.float64))
        lr = float(np.float32(detectron_lr(it, SOLVER)))
        params = [p - lr * np.sign(g) for p, g in zip(params, grads)]
    for got, want in zip(model.get_weights(), params):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert float(opt.lr) == float(np.float32(schedule.lr_at(3 * STEPS)))


@keras2_only("Keras 3's Optimizer.__init__ requires a learning_rate, so every Keras 3 optimizer has one")
@pytest.mark.parametrize("family", ["current", "legacy"])
def test_an_optimizer_with_no_learning_rate_at_all_is_refused_saying_what_it_needs(schedule, family):
    if family == "legacy":
        class AddGradient(keras.optimizers.legacy.Optimizer):  # Horovod's tests' TestingOptimizer
            def _resource_apply_dense(self, grad, var, apply_state=None):
                return var.assign_add(grad)

        optimizer = AddGradient(name="AddGradient")
    else:
        class AddGradient(keras.optimizers.Optimizer):
            def __init__(self, name="AddGradient", **kwargs):
                super().__init__(name=name, **kwargs)

            def update_step(self, gradient, variable):
                variable.assign_add(gradient)

        optimizer = AddGradient()
    with pytest.raises(TypeError, match=r"cannot schedule AddGradient: it has no learning rate .* take a "
                                        r"learning_rate argument .*read self.learning_rate"):
        ScheduledOptimizer(optimizer, schedule)


def _lr_schedules():
    decay = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
    cases = [pytest.param(keras.optimizers.SGD, decay, r"is a ExponentialDecay schedule", id="current-schedule")]
    if KERAS_MAJOR == 2:
        cases += [pytest.param(keras.optimizers.legacy.SGD, decay, r"is a ExponentialDecay schedule",
                               id="legacy-schedule"),
                  pytest.param(keras.optimizers.legacy.SGD, lambda: 0.1, r"is a callable \(<lambda>\)",
                               id="legacy-callable")]
    else:
        cases.append(pytest.param(keras.optimizers.SGD, lambda: 0.1, r"is a callable \(<lambda>\)",
                                  id="current-callable"))
    return cases


@pytest.mark.parametrize("cls, lr, kind", _lr_schedules())
def test_an_optimizer_whose_lr_is_a_schedule_or_callable_is_refused_naming_the_conflict(schedule, cls, lr, kind):
    with pytest.raises(ValueError, match=rf"hvd_sched: the learning_rate of SGD {kind}, and ScheduledOptimizer "
                                         r"replaces the optimizer's learning rate .*two schedules would compete"):
        ScheduledOptimizer(cls(learning_rate=lr, momentum=0.9), schedule)


@keras2_only("Keras 3 has no legacy optimizers nor convert_to_legacy_optimizer")
@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_convert_to_legacy_optimizer_keeps_the_schedule_and_options(schedule, name):
    base = getattr(keras.optimizers, name)(**({"momentum": 0.9} if name == "SGD" else {}))
    opt = ScheduledOptimizer(base, schedule, lr_multipliers={"bias": 2.0})
    legacy = keras.__internal__.optimizers.convert_to_legacy_optimizer(opt)
    assert isinstance(legacy, getattr(keras.optimizers.legacy, name)) and is_scheduled(legacy)
    assert type(legacy).__name__ == f"ScheduledLegacy{name}"
    assert legacy.schedule == schedule and legacy.lr_multipliers == {"bias": 2.0}
    assert float(legacy.lr) == float(np.float32(schedule.lr_at(0)))
    if name == "SGD":  # the legacy SGD's update is the current one's: the same training
        model, converted = _compiled(opt), _compiled(legacy)
        _fit(model, 3)
        _fit(converted, 3)
        for a, b in zip(model.get_weights(), converted.get_weights()):
            np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


@pytest.mark.skipif(KERAS_MAJOR != 3, reason="Keras 2's optimizers keep their LR outside `variables`")
def test_keras3_set_weights_from_a_plain_optimizer(schedule):
    plain_model = _compiled(keras.optimizers.SGD(0.05, momentum=0.9))
    _fit(plain_model, 1)
    plain = plain_model.optimizer
    scheduled = ScheduledOptimizer(keras.optimizers.SGD(momentum=0.9), schedule)
    scheduled.build(plain_model.trainable_variables)
    weights = [np.array(v) for v in plain.variables]  # Keras 3 optimizers have set_weights, no get_weights
    assert len(weights) == len(scheduled.variables) + 1  # the plain one's learning_rate variable
    scheduled.set_weights(weights)
    for variable, weight in zip(scheduled.variables, [weights[0], *weights[2:]]):
        np.testing.assert_array_equal(np.array(variable), weight)
    assert int(scheduled.iterations.numpy()) == STEPS
    # The other way round Keras' own set_weights refuses; inserting the LR weight is the way.
    other = keras.optimizers.SGD(0.05, momentum=0.9)
    other.build(plain_model.trainable_variables)
    theirs = [np.array(v) for v in scheduled.variables]
    with pytest.raises(ValueError, match="not compatible"):
        other.set_weights(theirs)
    other.set_weights([theirs[0], np.float32(0.05), *theirs[1:]])
    assert int(other.iterations.numpy()) == STEPS


# ---------------------------------------------------------------------------------------------- Horovod's arguments

def test_elastic_state_takes_horovods_positional_order(horovod, schedule):
    model = _compiled(ScheduledOptimizer(_sgd("current"), schedule))
    separate = ScheduledOptimizer(_sgd("current"), schedule)
    state = elastic_state(model, separate, batch=0, epoch=0)
    assert state.model is model and state.optimizer is separate and state.batch == 0 and state.epoch == 0
    assert elastic_state(model, batch=1).optimizer is model.optimizer


def test_broadcast_variables_takes_horovods_local_variables():
    variable = tf.Variable(1.0)
    assert BroadcastVariables(1, local_variables=[variable]).root_rank == 1
    assert BroadcastVariables(0, local_variables=variable).local_variables == [variable]
    with pytest.raises(TypeError, match=r"local_variables must be variables .* got str"):
        BroadcastVariables(0, local_variables=["bias"])
    with pytest.raises(ValueError, match=r"root_rank must be an int >= 0, got -1"):
        BroadcastVariables(-1)
