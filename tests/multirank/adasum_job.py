"""op=hvd_tf.Adasum through hvd_sched.keras.DistributedOptimizer, under `mpirun -np 2` (every row).

Usage: adasum_job.py MODE, MODE one of
  step      float64 MLP, plain SGD(lr): each rank's own gradient of its half batch (tf.GradientTape, before any
            update) and the weights after one `model.fit` step with op=hvd_tf.Adasum; the test rebuilds the step in
            numpy from the two gradients (Adasum's 2-vector formula per tensor);
  schedule  ScheduledOptimizer(SGD(momentum=0.9)) with warmup, steps and momentum correction, ITER_SIZE 2 (2
            micro-batches per update, averaged before the reduction), horovod_callbacks, 3 epochs: the weights
            and the logged LR of every rank;
  refuse    op=hvd_tf.Adasum where it cannot run (e.g. under `horovodrun --gloo`): the ValueError's message.
"""

import sys

import numpy as np
import tensorflow as tf

import hvd_sched
import hvd_sched.keras
import rankutil
from hvd_sched.keras import DistributedOptimizer, ScheduledOptimizer, horovod_callbacks

import horovod.tensorflow as hvd_tf  # Adasum is horovod.tensorflow.Adasum (the Keras module exports Average and Sum only)
import horovod.tensorflow.keras as hvd

mode = sys.argv[1]
hvd.init()
rank, size = hvd.rank(), hvd.size()
tf.config.experimental.enable_op_determinism()
LR = 0.1

if mode == "refuse":
    try:
        DistributedOptimizer(tf.keras.optimizers.SGD(LR), op=hvd_tf.Adasum)
    except ValueError as error:
        rankutil.emit({"error": str(error), "mpi_enabled": hvd.mpi_enabled()})
    else:
        rankutil.emit({"error": None, "mpi_enabled": hvd.mpi_enabled()})
    sys.exit(0)

if mode == "step":
    tf.keras.backend.set_floatx("float64")
    x, y = rankutil.make_regression(n=32, seed=3)
    x, y = x.astype(np.float64), y.astype(np.float64)
    # Different halves, so the two gradients differ (Adasum of equal vectors is the vector itself).
    x, y = rankutil.shard_batches(x, y, 32, rank, size)
    model = rankutil.make_mlp(seed=1)
    initial = [v.numpy().copy() for v in model.trainable_variables]
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))  # Keras' "mse" over the batch, as fit computes it
    local = [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]
    model.compile(DistributedOptimizer(tf.keras.optimizers.SGD(LR), op=hvd_tf.Adasum), "mse", jit_compile=False)
    model.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0, callbacks=horovod_callbacks(log_lr=False))
    rankutil.emit({"initial": initial, "local_grads": local, "lr": LR,
                   "weights": [v.numpy() for v in model.trainable_variables],
                   "dtype": str(model.trainable_variables[0].dtype)})
    sys.exit(0)

# mode == "schedule"
GLOBAL_BATCH, UPDATES_PER_EPOCH, EPOCHS, ITER_SIZE = 16, 4, 3, 2
SOLVER = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 6, 9], "MAX_ITER": 12,
          "WARM_UP_ITERS": 3, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "linear", "ITER_SIZE": ITER_SIZE}
schedule = hvd_sched.from_detectron(SOLVER)
x, y = rankutil.make_regression(n=GLOBAL_BATCH * ITER_SIZE * UPDATES_PER_EPOCH, seed=3)
x, y = rankutil.shard_batches(x, y, GLOBAL_BATCH, rank, size)
model = rankutil.make_mlp(seed=1)
optimizer = DistributedOptimizer(ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule), op=hvd_tf.Adasum)
model.compile(optimizer, "mse", jit_compile=False)
history = model.fit(x, y, batch_size=GLOBAL_BATCH // size, epochs=EPOCHS, shuffle=False, verbose=0,
                    callbacks=horovod_callbacks())
rankutil.emit({"weights": [v.numpy() for v in model.trainable_variables],
               "epoch_lr": history.history["learning_rate"], "loss": history.history["loss"],
               "iterations": hvd_sched.keras.iteration_count(model.optimizer)})
