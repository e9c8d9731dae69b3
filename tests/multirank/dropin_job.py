"""What users carry over from Horovod/Keras scripts, on real Horovod ranks (tests/multirank/test_dropin_ranks.py).

Usage: dropin_job.py MODE DIR, MODE one of
  writers  Keras' LearningRateScheduler / ReduceLROnPlateau (and on Keras 2 Horovod's LearningRateWarmupCallback /
           LearningRateScheduleCallback) with DistributedOptimizer(ScheduledOptimizer(...)): each refused on every
           rank (the message and the iterations run are emitted); BroadcastVariables(0, local_variables=[...]);
  train    the uninterrupted run: 3 epochs, rank 0 saving the model after epoch 2 in every format Keras saves an
           optimizer in (DIR/model.keras; Keras 2: DIR/model.h5, DIR/savedmodel);
  resume   every format loaded with hvd_sched.keras.load_model on every rank and trained for epoch 3.
"""

import os
import sys

import numpy as np
import tensorflow as tf

import hvd_sched
import hvd_sched.keras
import rankutil
from hvd_sched.keras import DistributedOptimizer, ScheduledOptimizer, horovod_callbacks
from stackutil import KERAS_MAJOR

import horovod.tensorflow.keras as hvd  # after hvd_sched.keras (on the tf2.21 row: keras -> tf_keras first)

mode, directory = sys.argv[1], sys.argv[2]
tf.config.experimental.enable_op_determinism()
GLOBAL_BATCH, STEPS, EPOCHS = 16, 10, 3
SOLVER = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 10, 20],
          "MAX_ITER": 30, "WARM_UP_ITERS": 5, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "constant"}
# Keras 3's .h5 loader drops the optimizer's slots (hvd_sched.keras.load_model refuses it there).
FORMATS = ["model.keras"] + (["model.h5", "savedmodel"] if KERAS_MAJOR == 2 else [])
hvd.init()
rank, size = hvd.rank(), hvd.size()
schedule = hvd_sched.from_detectron(SOLVER)
x, y = rankutil.make_regression(n=GLOBAL_BATCH * STEPS, seed=3)
xs, ys = rankutil.shard_batches(x, y, GLOBAL_BATCH, rank, size)
fit = dict(batch_size=GLOBAL_BATCH // size, shuffle=False, verbose=0)


def compiled():
    model = rankutil.make_mlp(seed=1)
    model.compile(DistributedOptimizer(ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule,
                                                          lr_multipliers={"bias": 2.0})), "mse")
    return model


def barrier():
    hvd.allreduce(tf.constant(0.0), name="dropin_barrier")


def writers():
    made = {
        "LearningRateScheduler": lambda: tf.keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5),
        "ReduceLROnPlateau": lambda: tf.keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0, min_delta=1e9),
    }
    if KERAS_MAJOR == 2:  # Horovod 0.28.1's Keras callbacks call Keras 2 APIs
        made["LearningRateWarmupCallback"] = lambda: hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=0.2, warmup_epochs=1, steps_per_epoch=STEPS)
        made["LearningRateScheduleCallback"] = lambda: hvd.callbacks.LearningRateScheduleCallback(
            initial_lr=0.2, multiplier=0.5, start_epoch=0)
    result = {}
    for name, make in made.items():
        model = compiled()
        try:
            model.fit(xs, ys, epochs=EPOCHS, callbacks=horovod_callbacks() + [make()], **fit)
            outcome = "accepted"
        except TypeError as error:
            outcome = str(error)
        result[name] = {"outcome": outcome, "iterations": int(model.optimizer.iterations.numpy()),
                        "weights": model.get_weights()}
    # BroadcastVariables(root_rank, local_variables): every rank starts apart; the local bias stays each rank's own.
    model = compiled()
    for variable in model.variables:
        variable.assign(tf.fill(variable.shape, float(rank + 1)))
    local = model.layers[-1].bias
    callback = hvd_sched.keras.BroadcastVariables(1, local_variables=[local])
    callback.set_model(model)
    callback.on_train_begin()
    result["broadcast"] = {"weights": model.get_weights(), "local_index": next(
        i for i, v in enumerate(model.weights) if v is local)}
    return result


def train():
    model = compiled()
    initial = model.get_weights()
    model.fit(xs, ys, epochs=2, callbacks=horovod_callbacks(), **fit)
    if rank == 0:
        for name in FORMATS:
            model.save(os.path.join(directory, name))
    barrier()  # the files exist before any rank reads them
    model.fit(xs, ys, initial_epoch=2, epochs=EPOCHS, callbacks=horovod_callbacks(), **fit)
    return {"initial": initial, "weights": model.get_weights(), "iterations": int(model.optimizer.iterations.numpy())}


def resume():
    result = {}
    for name in FORMATS:
        model = hvd_sched.keras.load_model(os.path.join(directory, name))
        optimizer = model.optimizer
        start = int(optimizer.iterations.numpy())
        model.fit(xs, ys, initial_epoch=2, epochs=EPOCHS, callbacks=horovod_callbacks(), **fit)
        result[name] = {"class": type(optimizer).__name__, "distributed": hvd_sched.keras._backend.is_distributed(
            optimizer), "start": start, "iterations": int(optimizer.iterations.numpy()),
            "weights": model.get_weights()}
    return result


rankutil.emit({"writers": writers, "train": train, "resume": resume}[mode]())
