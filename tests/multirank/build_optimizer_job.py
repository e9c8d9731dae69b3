"""build_optimizer on the conv/GroupNorm/BatchNorm model: `ranks` under horovodrun (each rank half of every global
batch), `single` in one process on the full batches, which also emits the numpy Caffe2 reference (tests/reference.py).

BatchNormalization uses virtual_batch_size = half the global batch, so its statistics on one process are those of
each rank's half (see reference.make_conv_model); Keras' virtual batches are strided (reshape to [V, B / V, ...],
moments over the first axis), so rank r takes rows r, r + 2, ... of each global batch. Usage: build_optimizer_job.py ranks|single
"""

import sys

import numpy as np
import tensorflow as tf

import hvd_sched.keras
import rankutil
from stackutil import variable_name
from hvd_sched.keras import build_optimizer, describe_optimizer, horovod_callbacks
from reference import (caffe2_group, detectron_corrections, detectron_lr, make_conv_data, make_conv_model,
                       tape_grad_fn, train_caffe2_sgd)

tf.config.experimental.enable_op_determinism()
GLOBAL_BATCH, STEPS, EPOCHS = 8, 4, 3
N_ITERS = STEPS * EPOCHS
WD, WD_NORM = 0.01, 0.005
SOLVER = {"BASE_LR": 0.1, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 6, 9], "MAX_ITER": N_ITERS,
          "WARM_UP_ITERS": 3, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "linear", "MOMENTUM": 0.9,
          "WEIGHT_DECAY": WD}
mode = sys.argv[1]
x, y = make_conv_data(GLOBAL_BATCH * STEPS, seed=3)
fit = dict(epochs=EPOCHS, shuffle=False, verbose=0)

model = make_conv_model(seed=1, half_batch=GLOBAL_BATCH // 2)
initial = [v.numpy().copy() for v in model.trainable_variables]
opt = build_optimizer(SOLVER, model, norm_weight_decay=WD_NORM)
if mode == "ranks":
    import horovod.tensorflow.keras as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    # Rank r takes rows r, r + n, r + 2n, ... of every global batch: Keras' virtual batches interleave the same way.
    part = lambda a: a.reshape(STEPS, GLOBAL_BATCH // n, n, *a.shape[1:])[:, :, r].reshape(-1, *a.shape[1:])
    model.compile(hvd_sched.keras.DistributedOptimizer(opt), "mse")
    model.fit(part(x), part(y), batch_size=GLOBAL_BATCH // n, callbacks=horovod_callbacks(), **fit)
    rankutil.emit({"weights": [v.numpy() for v in model.trainable_variables],
                   "iterations": int(model.optimizer.iterations.numpy()), "class": type(model.optimizer).__name__,
                   "describe": describe_optimizer(model.optimizer, model)})
else:
    model.compile(opt, "mse")
    model.fit(x, y, batch_size=GLOBAL_BATCH, **fit)
    batches = [(x[i * GLOBAL_BATCH:(i + 1) * GLOBAL_BATCH], y[i * GLOBAL_BATCH:(i + 1) * GLOBAL_BATCH])
               for i in range(STEPS)]
    plain = make_conv_model(seed=1, half_batch=GLOBAL_BATCH // 2)
    reference = train_caffe2_sgd(initial, batches * EPOCHS, [detectron_lr(it, SOLVER) for it in range(N_ITERS)],
                                 detectron_corrections(N_ITERS, SOLVER), 0.9, tape_grad_fn(plain),
                                 [caffe2_group(variable_name(v)) for v in model.trainable_variables],
                                 weight_decay=WD, weight_decay_gn=WD_NORM)
    rankutil.emit({"weights": [v.numpy() for v in model.trainable_variables], "reference": reference,
                   "iterations": int(model.optimizer.iterations.numpy())}, rank=0)
