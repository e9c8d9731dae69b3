"""Gradient accumulation under horovodrun: k micro-batches per update on every rank, one update per 32 rows.

Usage: accumulation_job.py SPEC [SPEC ...] (under `horovodrun -np 1` or `-np 2`), each SPEC `PATH:K[:FLAG...]`
trained in turn from the same initial weights, results emitted by SPEC; PATH one of
  iter_size  hvd_sched.keras.DistributedOptimizer(ScheduledOptimizer(SGD, schedule with ITER_SIZE K));
  bpps       hvd_sched.keras.DistributedOptimizer(ScheduledOptimizer(SGD, schedule), backward_passes_per_step=K,
             average_aggregated_gradients=True);
  horovod    (Keras 2) Horovod's own hvd.DistributedOptimizer(ScheduledOptimizer(...), backward_passes_per_step=K,
             average_aggregated_gradients=True): the line a Horovod user writes;
  keras3     (Keras 3) ScheduledOptimizer(SGD(gradient_accumulation_steps=K), schedule), distributed by hvd_sched;
  legacy     (Keras 2) iter_size with tf.keras.optimizers.legacy.SGD (OptimizerV2: its slots rescaled behind a tf.cond);
  build      build_optimizer(SOLVER with ITER_SIZE K, WEIGHT_DECAY), distributed by hvd_sched (Detectron's rules);
  summed     hvd_sched's DistributedOptimizer(backward_passes_per_step=K, op=hvd.Sum): Horovod's sums, over the
             micro-batches (average_aggregated_gradients=False, its default) and over the ranks;
  options    backward_passes_per_step=K with gradient_predivide_factor=2, groups=2, name and process_set;
FLAG: nesterov, xla (Keras 2: the optimizer's per-variable XLA update, as on a GPU), resume (2 epochs, an
EpochCheckpoint, then a new model and optimizer restored from it for the last 2 epochs), timeline (the variant's
training recorded in its own Horovod timeline, SPEC.json beside the script; needs HOROVOD_TIMELINE=DYNAMIC).

Every update averages the gradients of the same 32 rows whatever the ranks and K: update u's rows
[32u, 32u + 32) are cut into size x K equal parts, and rank r's micro-batch j is part j * size + r.
"""

import sys

import numpy as np
import tensorflow as tf

import hvd_sched
import hvd_sched.keras
import horovod.tensorflow.keras as hvd
import rankutil
from stackutil import KERAS_MAJOR

tf.config.experimental.enable_op_determinism()
hvd.init()
rank, size = hvd.rank(), hvd.size()
GLOBAL, UPDATES, EPOCHS = 32, 4, 4
SOLVER = {"BASE_LR": 0.1, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 8, 12],
          "MAX_ITER": UPDATES * EPOCHS, "WARM_UP_ITERS": 3, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "constant",
          "MOMENTUM": 0.9, "WEIGHT_DECAY": 0.01}


def shard(a, k):
    micro = GLOBAL // (size * k)
    parts = a.reshape(UPDATES, k, size, micro, -1)  # part j * size + r of every update
    return parts[:, :, rank].reshape(-1, a.shape[1])


def build(path, k, flags):
    schedule = hvd_sched.from_detectron(dict(SOLVER, ITER_SIZE=k if path in ("iter_size", "legacy") else 1))
    model = rankutil.make_mlp(seed=1)
    sgd = dict(momentum=0.9, nesterov="nesterov" in flags)
    if path == "build":
        opt = hvd_sched.keras.build_optimizer(dict(SOLVER, ITER_SIZE=k), model)
    elif path == "keras3":
        opt = hvd_sched.keras.ScheduledOptimizer(tf.keras.optimizers.SGD(**sgd, gradient_accumulation_steps=k),
                                                 schedule)
    elif path == "legacy":
        opt = hvd_sched.keras.ScheduledOptimizer(tf.keras.optimizers.legacy.SGD(**sgd), schedule)
    else:
        opt = hvd_sched.keras.ScheduledOptimizer(tf.keras.optimizers.SGD(**sgd), schedule)
    if path == "horovod":
        opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=k, average_aggregated_gradients=True)
    elif path == "bpps":
        opt = hvd_sched.keras.DistributedOptimizer(opt, backward_passes_per_step=k,
                                                   average_aggregated_gradients=True)
    elif path == "summed":  # Horovod's default: the k micro-batches summed, and with op=Sum the ranks too
        opt = hvd_sched.keras.DistributedOptimizer(opt, backward_passes_per_step=k, op=hvd.Sum)
    elif path == "options":  # Horovod's other arguments: the same average
        opt = hvd_sched.keras.DistributedOptimizer(opt, backward_passes_per_step=k, average_aggregated_gradients=True,
                                                   gradient_predivide_factor=2.0, groups=2, name="accumulated",
                                                   process_set=hvd.global_process_set)
    else:
        opt = hvd_sched.keras.DistributedOptimizer(opt)
    if "xla" in flags:
        opt.jit_compile = True  # what Keras 2 sets on a GPU machine
    model.compile(opt, "mse")
    return model


class BatchLR(tf.keras.callbacks.Callback):
    """The `learning_rate` LearningRateLogger writes into every batch's logs."""

    def __init__(self):
        super().__init__()
        self.lrs = []

    def on_train_batch_end(self, batch, logs=None):
        self.lrs.append(float(logs["learning_rate"]))


def train(spec):
    path, k, *flags = spec.split(":")
    k, flags = int(k), set(flags)
    x, y = rankutil.make_regression(n=GLOBAL * UPDATES, seed=3)
    x, y = shard(x, k), shard(y, k)
    fit = dict(batch_size=GLOBAL // (size * k), shuffle=False, verbose=0)
    batch_lr = BatchLR()
    model = build(path, k, flags)
    initial = [v.numpy().copy() for v in model.trainable_variables]
    if "timeline" in flags:
        hvd.start_timeline(f"{sys.argv[0]}.{spec}.json")
    if "resume" in flags:
        directory = f"{sys.argv[0]}.{spec}.ckpt"
        first = model.fit(x, y, epochs=2, callbacks=hvd_sched.keras.horovod_callbacks() + [
            hvd_sched.keras.EpochCheckpoint(directory), batch_lr], **fit)
        model = build(path, k, flags)  # a new model and optimizer, as in a new process
        meta = hvd_sched.keras.restore_latest(directory, model)
        history = model.fit(x, y, initial_epoch=meta["epoch"] + 1, epochs=EPOCHS,
                            callbacks=hvd_sched.keras.horovod_callbacks() + [batch_lr], **fit)
        epoch_lr = first.history["learning_rate"] + history.history["learning_rate"]
        checkpoint_iteration = meta["iteration"]
    else:
        history = model.fit(x, y, epochs=EPOCHS, callbacks=hvd_sched.keras.horovod_callbacks() + [batch_lr], **fit)
        epoch_lr = history.history["learning_rate"]
        checkpoint_iteration = None
    if "timeline" in flags:
        hvd.stop_timeline()  # rank 0 (which writes) returned from fit: its collectives are complete
    return {"weights": [v.numpy() for v in model.trainable_variables], "initial": initial,
            "names": [v.name for v in model.trainable_variables], "keras": KERAS_MAJOR,
            "raw_iterations": int(model.optimizer.iterations.numpy()), "batch_lr": batch_lr.lrs,
            "epoch_lr": epoch_lr, "checkpoint_iteration": checkpoint_iteration,
            "class": type(model.optimizer).__name__}


rankutil.emit({spec: train(spec) for spec in sys.argv[1:]})
