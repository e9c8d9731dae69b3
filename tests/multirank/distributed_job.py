"""hvd_sched.keras.DistributedOptimizer under horovodrun (every row; on Keras 2 it is Horovod's own wrapper).

Usage: distributed_job.py MODE [ranks|single], MODE one of
  rules     ScheduledOptimizer(SGD, lr_multipliers={"bias": 2.0}, weight_decays={"bias": 0.0, "": 1e-2}) with
            horovod_callbacks(), each rank from initial weights of its own: weights, History's learning_rate, the
            allreduced loss;
  sparse    an Embedding model (sparse gradients, allgathered by Horovod) with a ScheduledOptimizer;
  overflow  mixed_float16: only rank 1's half of batch 3 overflows the float16 gradients; both ranks must skip it;
  xla       model.compile(jit_compile=True): the job must stop on every rank with the clear error, not hang.
"""

import sys

import numpy as np
import tensorflow as tf

import hvd_sched
import hvd_sched.keras
import rankutil
from hvd_sched.keras import DistributedOptimizer, ScheduledOptimizer, horovod_callbacks
from stackutil import KERAS_MAJOR

mode, where = sys.argv[1], sys.argv[2]
if mode != "xla":  # Keras 3 turns jit_compile off under op determinism
    tf.config.experimental.enable_op_determinism()
GLOBAL_BATCH, STEPS, EPOCHS = 16, 6, 2
SOLVER = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 6, 9], "MAX_ITER": 12,
          "WARM_UP_ITERS": 3, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "linear"}
RULES = {"lr_multipliers": {"bias": 2.0}, "weight_decays": {"bias": 0.0, "": 1e-2}}
schedule = hvd_sched.from_detectron(SOLVER)
fit = dict(batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0)

if where == "ranks":
    import horovod.tensorflow.keras as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
else:
    rank, size = 0, 1


def data():
    if mode == "sparse":
        rng = np.random.default_rng(3)
        x = rng.integers(0, 20, size=(GLOBAL_BATCH * STEPS, 4)).astype(np.int32)
        y = rng.normal(size=(GLOBAL_BATCH * STEPS, 3)).astype(np.float32)
        return x, y
    x, y = rankutil.make_regression(n=GLOBAL_BATCH * STEPS, seed=3)
    if mode == "overflow":
        # A target far off in rank 1's half of batch 3: the loss gradient times the loss scale (2**15) is past
        # float16's 65504 there, so that rank's gradients are non-finite and the other rank's are not.
        y[3 * GLOBAL_BATCH + GLOBAL_BATCH // 2 + 1] = 1e4
    return x, y


def model():
    if mode == "sparse":
        tf.keras.utils.set_random_seed(1)
        return tf.keras.Sequential([tf.keras.Input((4,), dtype="int32"), tf.keras.layers.Embedding(20, 3),
                                    tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)])
    # rules: each rank starts from weights of its own; the initial broadcast must give every rank rank 0's
    # before the first step (the single process and the reference start from rank 0's).
    m = rankutil.make_mlp(seed=1 + (rank if mode == "rules" else 0))
    if mode == "overflow":
        # Keras' mixed precision guide: the output in float32, so the loss is computed (and reported) in float32
        # on both Keras versions and only the float16 gradients overflow; a float16 loss of 1e4**2 would itself be
        # inf on Keras 2, and StopOnNonFinite (in horovod_callbacks) would rightly stop rank 1.
        m.add(tf.keras.layers.Activation("linear", dtype="float32"))
    return m


if mode == "overflow":
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
x, y = data()
m = model()
initial = [v.numpy().copy() for v in m.trainable_variables]
opt = ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule, **(RULES if mode == "rules" else {}))
if where == "ranks":
    opt = DistributedOptimizer(opt)
    x, y = rankutil.shard_batches(x, y, GLOBAL_BATCH, rank, size)
    fit["batch_size"] = GLOBAL_BATCH // size
m.compile(opt, "mse", jit_compile=(mode == "xla"))
history = m.fit(x, y, callbacks=horovod_callbacks() if where == "ranks" else [], **fit)
result = {"weights": [v.numpy() for v in m.trainable_variables], "initial": initial,
          "iterations": int(m.optimizer.iterations.numpy()), "loss": history.history["loss"],
          "lr": history.history.get("learning_rate"), "keras": KERAS_MAJOR}
if mode == "overflow":
    inner = m.optimizer
    scale = inner.dynamic_scale if KERAS_MAJOR == 3 else inner.loss_scale
    result["loss_scale"] = float(scale.numpy())
rankutil.emit(result, rank=None if where == "ranks" else 0)
