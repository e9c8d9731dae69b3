"""An elastic Horovod Keras job for test_elastic.py (run by `horovodrun --min-np 1 --max-np 2 ...`)."""

import json
import os
import time

import hvd_sched._compat  # noqa: F401  (before Horovod: keras -> tf_keras on TF >= 2.16, clear stack errors)

import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd

import hvd_sched
import rankutil
from hvd_sched.keras import ElasticLRScaler, ScheduledOptimizer

EPOCHS, STEPS, BATCH = 4, 20, 8
OUT = os.environ["HVD_SCHED_TEST_OUT"]

hvd.init()
x, y = rankutil.make_regression(n=STEPS * BATCH, seed=3)
schedule = hvd_sched.from_detectron({
    "BASE_LR": hvd_sched.linear_scaled_lr(0.05, hvd.size()), "LR_POLICY": "steps_with_decay", "GAMMA": 0.5,
    "STEPS": [0, 40], "MAX_ITER": EPOCHS * STEPS, "WARM_UP_ITERS": 10, "WARM_UP_METHOD": "linear"})
model = rankutil.make_mlp(seed=1)
model.compile(hvd.DistributedOptimizer(ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule)), "mse")
optimizer = model.optimizer
scaler = ElasticLRScaler(optimizer)
records = {"start_size": hvd.size(), "batches": [], "resets": []}


def slot_sum():
    return float(sum(np.abs(m.numpy()).sum() for m in optimizer.momentums))


def before_reset():
    records["resets"].append({"slots_before": slot_sum()})


def after_reset():
    records["resets"][-1].update(scaler.history[-1], slots_after=slot_sum())


class Record(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        it = int(optimizer.iterations.numpy()) - 1  # the iteration this batch ran
        records["batches"].append({"it": it, "size": hvd.size(), "lr_used": float(optimizer.learning_rate.numpy()),
                                   "lr_scheduled": optimizer.lr_at(it), "lr_table": schedule.lr_at(it)})
        if hvd.rank() == 0:
            with open(os.path.join(OUT, "progress.tmp"), "w") as f:
                f.write(str(it))
            os.replace(os.path.join(OUT, "progress.tmp"), os.path.join(OUT, "progress"))
        time.sleep(0.1)  # leaves the test seconds to drop a slot before training ends


state = hvd.elastic.KerasState(model, batch=0, epoch=0)
state.register_reset_callbacks([before_reset, scaler, after_reset])
callbacks = [hvd.elastic.CommitStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
             hvd.elastic.UpdateEpochStateCallback(state), Record()]


@hvd.elastic.run
def train(state):
    state.model.fit(x, y, batch_size=BATCH, steps_per_epoch=STEPS, epochs=EPOCHS, initial_epoch=state.epoch,
                    shuffle=False, verbose=0, callbacks=callbacks)


train(state)
records["final_iteration"] = int(optimizer.iterations.numpy())
records["final_size"] = hvd.size()
with open(os.path.join(OUT, f"elastic{os.getpid()}.json"), "w") as f:
    json.dump(records, f)
