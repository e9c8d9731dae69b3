"""Run under horovodrun by tests/multirank/test_preemption.py: the ranks' agreement on where to stop.

Two stops, one after the other: "both_a_step_apart" (rank 0 receives SIGUSR1 after micro-batch 20, rank 1 after
21) and "rank1_only" (rank 1 after 21). Agreements run at every update (agree_every tiny), so the stop lands at 20
(both) or 21 (rank 1 alone) on every rank alike. For each: the stopped run and its resume from the checkpoint,
compared with the run never stopped, all in this process; the result says where each rank stopped and whether the
resumed weights equal the reference.
"""

import os
import signal

import hvd_sched._compat  # noqa: F401  (before Horovod)

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

import hvd_sched
import hvd_sched.keras as hk
import rankutil

tf.config.experimental.enable_op_determinism()
STEPS, EPOCHS, BATCH = 12, 3, 8
SOLVER = {"BASE_LR": 0.1, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 15, 30], "MAX_ITER": 36,
          "WARM_UP_ITERS": 6, "MOMENTUM": 0.9, "SCALE_MOMENTUM": True}

hvd.init()
rank = hvd.rank()
x, y = rankutil.make_regression(n=400, seed=11)
x, y = x[rank::2], y[rank::2]  # each rank its own data: the ranks' gradients differ until averaged
checkpoints = os.path.join(os.environ["HVD_SCHED_TEST_OUT"], "ckpt")


def model_():
    model = rankutil.make_mlp(seed=4)
    optimizer = hk.DistributedOptimizer(hk.ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9),
                                                              hvd_sched.from_detectron(SOLVER)))
    model.compile(optimizer, "mse")
    return model


def data(skip):
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH, drop_remainder=True).skip(skip)


def fit(model, parts, extra):
    for part in parts:
        model.fit(data(part.skip_batches), steps_per_epoch=part.steps_per_epoch, epochs=part.epochs,
                  initial_epoch=part.initial_epoch, verbose=0, callbacks=hk.horovod_callbacks() + extra)


class SignalAt(tf.keras.callbacks.Callback):
    def __init__(self, at):
        super().__init__()
        self.at, self.seen = at, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.at:
            os.kill(os.getpid(), signal.SIGUSR1)


reference = model_()
fit(reference, hk.resume_plan(None, STEPS, EPOCHS), [])
results = {}
for mode in ("both_a_step_apart", "rank1_only"):
    directory = os.path.join(checkpoints, mode)
    at = {"both_a_step_apart": {0: 20, 1: 21}, "rank1_only": {1: 21}}[mode].get(rank)
    stopped = model_()
    stop = None
    try:
        fit(stopped, hk.resume_plan(None, STEPS, EPOCHS),
            ([SignalAt(at)] if at else []) + [hk.TrainingCheckpoint(directory, stop_signals=("SIGUSR1",),
                                                                    agree_every=1e-9)])
    except hk.TrainingInterrupted as exc:
        stop = exc
    assert stop is not None, "the job was not stopped"
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL

    resumed = model_()
    meta = hk.restore_latest(directory, resumed)
    fit(resumed, hk.resume_plan(meta, STEPS, EPOCHS), [hk.TrainingCheckpoint(directory)])
    equal = all(np.array_equal(a, b) for a, b in zip(reference.get_weights(), resumed.get_weights()))
    results[mode] = {"stopped_at": stop.iteration, "code": stop.code, "signal": stop.signal,
                     "resumed_equal": bool(equal), "iterations": hk.iteration_count(resumed.optimizer),
                     "expected_iterations": STEPS * EPOCHS, "saved_iteration": meta["iteration"],
                     "weights": resumed.get_weights()}
rankutil.emit(results)
