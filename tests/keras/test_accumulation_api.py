"""Gradient accumulation in one process: hvd_sched.keras.DistributedOptimizer takes Horovod's arguments, and every
combination that would train silently wrong stops before the first step with an error naming what to change
(the multi-rank numerics are in tests/multirank/test_accumulation.py)."""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import hvd_sched
import hvd_sched.keras
from hvd_sched.keras import DistributedOptimizer, ScheduleCallback, ScheduledOptimizer, horovod_callbacks
from stackutil import KERAS_MAJOR

SOLVER = {"BASE_LR": 0.1, "LR_POLICY": "steps_with_decay", "STEPS": [0, 4], "MAX_ITER": 8, "WARM_UP_ITERS": 2}


pytestmark = pytest.mark.usefixtures("horovod")  # tests/keras/conftest.py: hvd.init(), size 1


def _schedule(iter_size=1):
    return hvd_sched.from_detectron(dict(SOLVER, ITER_SIZE=iter_size))


def _scheduled(iter_size=1, **sgd):
    return ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9, **sgd), _schedule(iter_size))


def _fit(optimizer, batches=4, callbacks=()):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer, "mse")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(4 * batches, 3)).astype("float32"), rng.normal(size=(4 * batches, 2)).astype("float32"),
              batch_size=4, epochs=1, verbose=0, callbacks=list(callbacks))
    return model


def test_distributed_optimizer_takes_every_argument_of_horovods():
    import horovod.tensorflow.keras as hvd_keras

    ours = inspect.signature(DistributedOptimizer).parameters
    theirs = inspect.signature(hvd_keras.DistributedOptimizer).parameters
    assert list(ours) == list(theirs)
    # Horovod's defaults, where a default of None stands for "Horovod's own, or what ITER_SIZE says".
    for name in ("name", "device_dense", "device_sparse", "sparse_as_dense", "gradient_predivide_factor",
                 "num_groups", "groups", "scale_local_gradients"):
        assert ours[name].default == theirs[name].default, name


def test_iter_size_sets_the_accumulation_with_averaging():
    distributed = DistributedOptimizer(_scheduled(iter_size=2))
    model = _fit(distributed, batches=4)
    assert hvd_sched.keras.scheduled_of(model.optimizer).schedule.iter_size == 2
    if KERAS_MAJOR == 3:
        assert model.optimizer.gradient_accumulation_steps == 2
        assert int(model.optimizer.iterations.numpy()) == 2  # updates
    else:
        helper = model.optimizer._agg_helper  # Horovod's accumulation
        assert helper.backward_passes_per_step == 2 and helper.average_aggregated_gradients
        assert int(model.optimizer.iterations.numpy()) == 4  # Horovod's helper counts micro-batches


@pytest.mark.parametrize("value", [0, -1])
def test_backward_passes_per_step_must_be_a_positive_int(value):
    with pytest.raises(ValueError, match=rf"backward_passes_per_step must be >= 1, got {value}"):
        DistributedOptimizer(_scheduled(), backward_passes_per_step=value)
    with pytest.raises(TypeError, match=r"backward_passes_per_step must be an int, got 1.5"):
        DistributedOptimizer(_scheduled(), backward_passes_per_step=1.5)


def test_a_backward_passes_per_step_other_than_iter_size_is_an_error():
    with pytest.raises(ValueError, match=r"backward_passes_per_step=3 differs from the schedule's ITER_SIZE 2"):
        DistributedOptimizer(_scheduled(iter_size=2), backward_passes_per_step=3)
    # The same value says the same thing twice: accepted.
    assert hvd_sched.keras.scheduled_of(DistributedOptimizer(_scheduled(iter_size=2), backward_passes_per_step=2))


def test_summing_the_micro_batches_of_an_iter_size_is_an_error():
    with pytest.raises(ValueError, match=r"average_aggregated_gradients=False would sum the micro-batches, but the "
                                         r"schedule's ITER_SIZE 2 averages them"):
        DistributedOptimizer(_scheduled(iter_size=2), average_aggregated_gradients=False)


@pytest.mark.skipif(KERAS_MAJOR != 3, reason="gradient_accumulation_steps is a Keras 3 optimizer argument")
def test_keras3_accumulation_given_twice_is_an_error():
    with pytest.raises(ValueError, match=r"backward_passes_per_step=2 and the optimizer's "
                                         r"gradient_accumulation_steps=2 would both accumulate"):
        DistributedOptimizer(_scheduled(gradient_accumulation_steps=2), backward_passes_per_step=2)
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=3 differs from the schedule's ITER_SIZE 2"):
        _scheduled(iter_size=2, gradient_accumulation_steps=3)


@pytest.mark.skipif(KERAS_MAJOR != 2, reason="Keras 3 accumulates in the optimizer itself")
def test_keras2_iter_size_without_horovods_accumulation_stops_before_the_first_step():
    with pytest.raises(ValueError, match=r"the schedule's ITER_SIZE is 2 micro-batches per iteration, but the "
                                         r"optimizer accumulates 1; wrap it with hvd_sched.keras.DistributedOptimizer"):
        _fit(_scheduled(iter_size=2))


@pytest.mark.skipif(KERAS_MAJOR != 2, reason="Horovod's own Keras wrapper runs on Keras 2 only")
def test_keras2_horovods_own_wrapper_summing_an_iter_size_stops_before_the_first_step():
    import horovod.tensorflow.keras as hvd_keras

    summed = hvd_keras.DistributedOptimizer(_scheduled(iter_size=2), backward_passes_per_step=2)
    with pytest.raises(ValueError, match=r"ITER_SIZE 2 averages its micro-batches .* but the optimizer sums them"):
        _fit(summed)


def test_accumulation_under_mixed_float16_is_refused_before_the_first_step(mixed_float16):
    """The dynamic loss scale is checked per micro-batch: not exact, so refused with the fix."""
    message = r"(gradient accumulation \(2 micro-batches per update\) with a LossScaleOptimizer|" \
              r"backward_passes_per_step=2 with a LossScaleOptimizer)"
    with pytest.raises(ValueError, match=message):
        _fit(DistributedOptimizer(_scheduled(iter_size=2)), callbacks=horovod_callbacks())


def test_an_epoch_that_does_not_end_on_an_update_is_refused_before_the_first_step():
    seen = []

    class Count(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(batch)

    with pytest.raises(ValueError, match=r"an epoch of 6 batches does not end on an update of 4 micro-batches .* "
                                         r"\(steps_per_epoch=4"):
        _fit(DistributedOptimizer(_scheduled(iter_size=4)), batches=6, callbacks=horovod_callbacks() + [Count()])
    assert seen == []


def test_schedule_callback_under_accumulation_is_an_error():
    plain = DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9), backward_passes_per_step=2,
                                 average_aggregated_gradients=True)
    with pytest.raises(ValueError, match=r"ScheduleCallback .* gradient accumulation \(2 micro-batches per update\)"):
        _fit(plain, callbacks=[ScheduleCallback(_schedule())])


def test_horovod_arguments_that_cannot_be_honoured_are_named(horovod):
    if not horovod.mpi_built():
        with pytest.raises(ValueError, match=r"op=hvd.Adasum needs a Horovod built with MPI"):
            DistributedOptimizer(_scheduled(), op=horovod.Adasum)
    with pytest.raises(ValueError, match=r"gradient_predivide_factor=2.0 splits an average; it needs op=hvd.Average"):
        DistributedOptimizer(_scheduled(), op=horovod.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match=r"give num_groups \(2\) or groups, not both"):
        DistributedOptimizer(_scheduled(), num_groups=2, groups=2)
    with pytest.raises(ValueError, match=r"groups must be an int >= 0 or a list of lists of variables, got 'x'"):
        DistributedOptimizer(_scheduled(), groups="x")
    if KERAS_MAJOR == 3:
        with pytest.raises(ValueError, match=r"scale_local_gradients=False: .* no worker-local variables"):
            DistributedOptimizer(_scheduled(), scale_local_gradients=False)


@pytest.mark.skipif(KERAS_MAJOR != 3, reason="Keras 2 accumulates only in Horovod's wrapper, whose ops XLA refuses")
def test_keras3_whole_step_xla_with_iter_size_equals_the_uncompiled_step():
    """Keras 3's jit_compile (on by default wherever a GPU is visible): one process, ITER_SIZE 2, 16 updates."""
    import rankutil

    solver = dict(SOLVER, STEPS=[0, 8, 12], MAX_ITER=16, ITER_SIZE=2)
    x, y = rankutil.make_regression(n=128, seed=3)
    weights = []
    for jit_compile in (False, True):
        model = rankutil.make_mlp(seed=1)
        model.compile(ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), hvd_sched.from_detectron(solver)),
                      "mse", jit_compile=jit_compile)
        model.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0)
        assert hvd_sched.keras.iteration_count(model.optimizer) == 16
        weights.append([v.numpy() for v in model.trainable_variables])
    for uncompiled, compiled in zip(*weights):
        np.testing.assert_allclose(compiled, uncompiled, atol=1e-6, rtol=0)


def test_the_distributed_optimizer_keeps_no_model_variable_among_its_own():
    """What model.save writes for the optimizer: its slots, counters and accumulators, never the model's weights
    (Keras 3 tracks every variable set on an optimizer attribute)."""
    model = _fit(DistributedOptimizer(_scheduled(iter_size=2)))
    from hvd_sched.keras import _backend

    own = _backend.backing_variables(_backend.optimizer_variables(model.optimizer))
    weights = _backend.backing_variables(model.variables)
    assert not [v.name for v in own if any(v is w for w in weights)]


def test_accumulation_under_elastic_horovod_is_refused(monkeypatch):
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")  # what horovodrun --min-np/--max-np sets
    with pytest.raises(ValueError, match=r"gradient accumulation \(2 micro-batches per update\) under elastic "
                                         r"Horovod is not supported"):
        DistributedOptimizer(_scheduled(iter_size=2))
