"""hvd_sched.keras.DistributedOptimizer's API in one process: what it accepts and returns, the errors it gives,
and on Keras 3 how it places the loss scaling (the wrapper must see the averaged gradients)."""

import numpy as np
import pytest
import tensorflow as tf

import hvd_sched
import hvd_sched.keras
from hvd_sched.keras import DistributedOptimizer, ScheduledOptimizer
from stackutil import KERAS_MAJOR

SOLVER = {"BASE_LR": 0.1, "LR_POLICY": "steps_with_decay", "STEPS": [0, 4], "MAX_ITER": 8, "WARM_UP_ITERS": 2}


pytestmark = pytest.mark.usefixtures("horovod")  # tests/keras/conftest.py: hvd.init(), size 1


def _fit(optimizer):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer, "mse")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(16, 3)).astype("float32"), rng.normal(size=(16, 2)).astype("float32"),
              batch_size=4, epochs=1, verbose=0)
    return model


def test_a_scheduled_optimizer_keeps_its_class_name_schedule_and_rules():
    schedule = hvd_sched.from_detectron(SOLVER)
    scheduled = ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule, lr_multipliers={"bias": 2.0})
    distributed = DistributedOptimizer(scheduled)
    assert type(distributed).__name__ == "ScheduledSGD" and distributed is not scheduled
    assert isinstance(distributed, type(scheduled))
    assert hvd_sched.keras.scheduled_of(distributed).schedule == schedule
    assert distributed.lr_multipliers == {"bias": 2.0}
    model = _fit(distributed)
    assert int(model.optimizer.iterations.numpy()) == 4


def test_not_an_optimizer_and_wrapping_twice_are_errors():
    with pytest.raises(TypeError, match=r"DistributedOptimizer wraps a Keras optimizer .* got str"):
        DistributedOptimizer("sgd")
    once = DistributedOptimizer(tf.keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="already averages gradients"):
        DistributedOptimizer(once)
    with pytest.raises(ValueError, match="wrap in the other order"):
        ScheduledOptimizer(once, hvd_sched.from_detectron(SOLVER))


@pytest.mark.skipif(KERAS_MAJOR != 3, reason="Keras 2: Horovod's wrapper averages before the loss-scale check")
def test_keras3_mixed_float16_puts_the_loss_scaling_inside(mixed_float16):
    import keras

    distributed = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    assert isinstance(distributed, keras.optimizers.LossScaleOptimizer)  # model.compile keeps it as it is
    model = _fit(distributed)
    assert model.optimizer is distributed


@pytest.mark.skipif(KERAS_MAJOR != 3, reason="Keras 2: Horovod's wrapper averages before the loss-scale check")
def test_keras3_a_loss_scale_optimizer_around_the_distributed_one_is_refused():
    import keras

    distributed = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    outside = keras.optimizers.LossScaleOptimizer(distributed)
    with pytest.raises(ValueError, match=r"LossScaleOptimizer wraps hvd_sched.keras.DistributedOptimizer.*hangs"):
        _fit(outside)
    # Built the other way round, it trains.
    inside = DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)))
    assert int(_fit(inside).optimizer.iterations.numpy()) == 4


def test_groups_zero_is_refused_with_horovods_message_and_num_groups_zero_means_none():
    with pytest.raises(ValueError, match=r"^groups should be a non-negative integer or a list of list of "
                                         r"tf\.Variable\.$"):
        DistributedOptimizer(tf.keras.optimizers.SGD(0.1), groups=0)
    DistributedOptimizer(tf.keras.optimizers.SGD(0.1), num_groups=0)  # Horovod's default: no groups


def test_adasum_is_checked_when_the_optimizer_is_wrapped(horovod):
    """One process: Adasum needs nothing at size 1 (no reduction is emitted), but groups never go with it."""
    with pytest.raises(ValueError, match=r"op=hvd.Adasum reduces each gradient on its own .* got groups=2"):
        DistributedOptimizer(tf.keras.optimizers.SGD(0.1), op=horovod.Adasum, groups=2)
    if horovod.mpi_built():
        DistributedOptimizer(tf.keras.optimizers.SGD(0.1), op=horovod.Adasum)
    else:
        with pytest.raises(ValueError, match=r"op=hvd.Adasum needs a Horovod built with MPI"):
            DistributedOptimizer(tf.keras.optimizers.SGD(0.1), op=horovod.Adasum)


@pytest.mark.skipif(KERAS_MAJOR != 2, reason="Keras 3: BroadcastVariables runs at train begin (its own tests)")
@pytest.mark.parametrize("built", [True, False])
def test_keras2_the_initial_broadcast_runs_before_the_first_batch_where_the_model_is_built(built, tmp_path):
    """Horovod's Keras 2 callback broadcasts at the end of the first batch (once the slots exist): the first step
    runs on each rank's own weights, and the broadcast lands in Keras' batch timing ("on_train_batch_end is slow").
    horovod_callbacks makes the slots and broadcasts at train begin; a model not built by then keeps Horovod's
    first-batch broadcast. The stop agreement's first allgather is made at train begin too."""
    import horovod.tensorflow.keras as hvd

    tf.keras.utils.set_random_seed(0)
    layers = [tf.keras.layers.Dense(2)]
    model = tf.keras.Sequential(([tf.keras.Input((3,))] if built else []) + layers)
    model.compile(DistributedOptimizer(ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9),
                                                          hvd_sched.from_detectron(SOLVER))), "mse")
    callbacks = hvd_sched.keras.horovod_callbacks(checkpoint=hvd_sched.keras.TrainingCheckpoint(tmp_path))
    broadcast = [cb for cb in callbacks if isinstance(cb, hvd.callbacks.BroadcastGlobalVariablesCallback)]
    assert len(broadcast) == 1
    seen = []

    class Probe(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            variables = self.model.optimizer.variables
            seen.append((batch, broadcast[0].broadcast_done, len(variables() if callable(variables) else variables)))

    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(8, 3)).astype("float32"), rng.normal(size=(8, 2)).astype("float32"), batch_size=4,
              epochs=1, verbose=0, callbacks=callbacks + [Probe()])
    assert [batch for batch, _, _ in seen] == [0, 1]
    assert seen[0][1] is built and seen[1][1] is True
    # Built: the iteration count and a momentum slot per variable (kernel, bias) exist before the first step.
    assert seen[0][2] == (3 if built else 1) and seen[1][2] == 3
    assert int(model.optimizer.iterations.numpy()) == 2
