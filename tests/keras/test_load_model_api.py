"""`hvd_sched.keras.load_model` is Horovod's `hvd.load_model`: its arguments, and the model back with its optimizer
wrapped in hvd_sched's DistributedOptimizer, scheduled, with its schedule, slots and iteration, from every format
Keras saves an optimizer in (one process here; tests/multirank/test_dropin_ranks.py resumes 2 ranks from each)."""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import hvd_sched
import hvd_sched.keras
import rankutil
from hvd_sched.keras import ScheduledOptimizer, is_scheduled, scheduled_of
from hvd_sched.keras import _backend
from stackutil import KERAS_MAJOR, keras2_only

SOLVER = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 6, 9], "MAX_ITER": 12,
          "WARM_UP_ITERS": 3, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "constant"}
FORMATS = ["model.keras", pytest.param("model.h5", marks=keras2_only("Keras 3's .h5 loader drops the optimizer's "
                                                                     "slots (refused: see below)")),
           pytest.param("savedmodel", marks=keras2_only("model.save writes no SavedModel on Keras 3"))]


def test_the_arguments_are_horovods(horovod):
    import horovod.tensorflow.keras as hvd

    ours = list(inspect.signature(hvd_sched.keras.load_model).parameters)
    theirs = list(inspect.signature(hvd.load_model).parameters)
    assert ours[:5] == theirs[:5] == ["filepath", "custom_optimizers", "custom_objects", "compression",
                                      "legacy_opts"]


def _trained(optimizer, epochs=1):
    model = rankutil.make_mlp(seed=1)
    model.compile(optimizer, "mse")
    x, y = rankutil.make_regression(n=64, seed=3)
    model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0)
    return model


def _state(optimizer):
    return [np.array(v) for v in _backend.optimizer_variables(optimizer)]


@pytest.mark.parametrize("name", FORMATS)
def test_the_optimizer_comes_back_distributed_and_scheduled_with_its_state(horovod, tmp_path, name):
    schedule = hvd_sched.from_detectron(SOLVER)
    model = _trained(ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule,
                                        lr_multipliers={"bias": 2.0}))
    saved = _state(model.optimizer)
    model.save(str(tmp_path / name))
    loaded = hvd_sched.keras.load_model(str(tmp_path / name), compression=horovod.Compression.none)
    optimizer = loaded.optimizer
    assert _backend.is_distributed(optimizer) and is_scheduled(optimizer)
    assert type(optimizer).__name__ == "ScheduledSGD"
    assert scheduled_of(optimizer).schedule == schedule and optimizer.lr_multipliers == {"bias": 2.0}
    assert int(optimizer.iterations.numpy()) == 4 and float(optimizer.lr) == float(np.float32(schedule.lr_at(4)))
    assert len(_state(optimizer)) == len(saved)
    for got, want in zip(_state(optimizer), saved):
        np.testing.assert_array_equal(got, want)
    # Loading it again (a model saved with the distributed optimizer) gives the same.
    loaded.save(str(tmp_path / ("again." + name.split(".")[-1] if "." in name else "again")))


def _sign_sgd():
    if KERAS_MAJOR == 2:
        class SignSGD(tf.keras.optimizers.Optimizer):
            def __init__(self, name="SignSGD", **kwargs):
                super().__init__(name=name, **kwargs)
                self._learning_rate = self._build_learning_rate(0.01)

            def update_step(self, gradient, variable):
                variable.assign_sub(tf.cast(self.learning_rate, variable.dtype) * tf.sign(gradient))
    else:
        from keras import ops

        class SignSGD(tf.keras.optimizers.Optimizer):
            def __init__(self, name="SignSGD", **kwargs):
                super().__init__(learning_rate=0.01, name=name, **kwargs)

            def update_step(self, gradient, variable, learning_rate):
                self.assign_sub(variable, ops.multiply(ops.cast(learning_rate, variable.dtype), ops.sign(gradient)))

            def get_config(self):  # Keras 3's base config has the learning_rate its __init__ does not take
                config = super().get_config()
                config.pop("learning_rate")
                return config
    return SignSGD


def test_custom_optimizers_are_found_scheduled_or_not(horovod, tmp_path):
    cls = _sign_sgd()
    schedule = hvd_sched.from_detectron(SOLVER)
    for scheduled, path in ((True, tmp_path / "scheduled.keras"), (False, tmp_path / "plain.keras")):
        model = _trained(ScheduledOptimizer(cls(), schedule) if scheduled else cls())
        model.save(str(path))
        optimizer = hvd_sched.keras.load_model(str(path), custom_optimizers=[cls]).optimizer
        assert isinstance(optimizer, cls) and _backend.is_distributed(optimizer)
        assert is_scheduled(optimizer) is scheduled and int(optimizer.iterations.numpy()) == 4


def test_wrong_arguments_are_named(horovod, tmp_path):
    with pytest.raises(TypeError, match=r"custom_optimizers must list optimizer classes .* got 'SGD'"):
        hvd_sched.keras.load_model(str(tmp_path / "x.keras"), custom_optimizers=["SGD"])
    if KERAS_MAJOR == 3:
        with pytest.raises(ValueError, match="legacy_opts=True: Keras 3 has no legacy optimizers"):
            hvd_sched.keras.load_model(str(tmp_path / "x.keras"), legacy_opts=True)
        with pytest.raises(ValueError, match=r"Keras 3 does not restore an optimizer from .h5 .*model.keras"):
            hvd_sched.keras.load_model(str(tmp_path / "x.h5"))
