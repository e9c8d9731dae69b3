"""Resume: a run stopped after k iterations, restored in a new process and continued, ends where an uninterrupted
run ends (TensorFlow op determinism on). k = 20 sits on the step boundary, so the resumed process must apply the
momentum correction due at its very first iteration (Detectron's restarted LR blob would skip it).
"""

import numpy as np
import pytest

from stackutil import keras2_only

SCRIPT = """
import sys, numpy as np, tensorflow as tf
import hvd_sched, hvd_sched.keras, rankutil
from hvd_sched.keras import ScheduledOptimizer
from stackutil import KERAS_MAJOR
tf.config.experimental.enable_op_determinism()
SOLVER = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 10, 20],
          "MAX_ITER": 30, "WARM_UP_ITERS": 5, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "constant"}
mode, stage, path = sys.argv[1], sys.argv[2], sys.argv[3]
x, y = rankutil.make_regression(n=160, seed=3)

def build():
    m = rankutil.make_mlp(seed=1)
    sgd = tf.keras.optimizers.legacy.SGD if mode == "legacy" else tf.keras.optimizers.SGD
    opt = ScheduledOptimizer(sgd(momentum=0.9), hvd_sched.from_detectron(SOLVER), lr_multipliers={"bias": 2.0})
    if mode == "hvd_keras_save":  # one Horovod rank: the saved optimizer class is the distributed subclass
        import horovod.tensorflow.keras as hvd
        hvd.init()
        opt = hvd_sched.keras.DistributedOptimizer(opt)  # Keras 2: Horovod's own
    m.compile(opt, "mse")
    return m

fit = dict(batch_size=16, shuffle=False, verbose=0)
if stage == "full":
    m = build()
    m.fit(x, y, epochs=3, **fit)
elif stage == "first" and mode.endswith("keras_save"):
    m = build()
    m.fit(x, y, epochs=2, **fit)
    m.save(path)
elif stage == "second" and mode.endswith("keras_save"):
    if mode == "keras_save":
        m = tf.keras.models.load_model(path)
    elif KERAS_MAJOR == 2:  # Horovod's class is recorded under horovod._keras; Keras 3's keeps its base's module
        try:
            tf.keras.models.load_model(path)
            raise AssertionError("expected plain load_model to miss Horovod's class")
        except TypeError as exc:
            assert "Could not locate class 'ScheduledSGD'" in str(exc), exc
        m = hvd_sched.keras.load_model(path)
    else:
        m = hvd_sched.keras.load_model(path)
    assert type(m.optimizer).__name__ == "ScheduledSGD", type(m.optimizer)
    assert int(m.optimizer.iterations.numpy()) == 20
    m.fit(x, y, initial_epoch=2, epochs=3, **fit)
elif stage == "first":
    m = build()
    m.fit(x, y, epochs=2, **fit)
    tf.train.Checkpoint(model=m, optimizer=m.optimizer).write(path)
else:
    m = build()
    m.optimizer.build(m.trainable_variables) if mode != "legacy" else m.optimizer._create_all_weights(
        m.trainable_variables)
    tf.train.Checkpoint(model=m, optimizer=m.optimizer).read(path).assert_consumed()
    assert int(m.optimizer.iterations.numpy()) == 20
    m.fit(x, y, initial_epoch=2, epochs=3, **fit)
rankutil.emit({"weights": m.get_weights(), "iterations": int(m.optimizer.iterations.numpy())}, rank=0)
"""


@pytest.mark.parametrize("mode", ["checkpoint", pytest.param("legacy", marks=keras2_only("no legacy optimizers")),
                                  "keras_save", "hvd_keras_save"])
def test_resume_in_a_new_process_matches_uninterrupted(run_single, tmp_path, mode):
    path = str(tmp_path / ("model.keras" if mode.endswith("keras_save") else "ckpt"))
    full = run_single(SCRIPT, args=[mode, "full", path])
    first = run_single(SCRIPT, args=[mode, "first", path])
    assert first["iterations"] == 20
    resumed = run_single(SCRIPT, args=[mode, "second", path])
    assert resumed["iterations"] == full["iterations"] == 30
    for a, b in zip(resumed["weights"], full["weights"]):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-6, rtol=0)
