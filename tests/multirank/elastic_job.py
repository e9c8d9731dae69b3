"""An elastic Horovod Keras job for test_elastic.py (run by `horovodrun --min-np 1 --max-np 2 ...`).

After iteration HOLD_AT rank 0 waits for Horovod's hosts-updated notification (the test drops a slot when it
sees that iteration in OUT/progress; the driver notifies the coordinator, rank 0, which passes the change on at
the next commit, and rank 1 waits for it in the next step): the drop lands at a known point whatever the load.
"""

import json
import os
import threading

import hvd_sched._compat  # noqa: F401  (before Horovod: keras -> tf_keras on TF >= 2.16, clear stack errors)

import numpy as np
import tensorflow as tf

import horovod.common.elastic
import horovod.tensorflow.keras as hvd

import hvd_sched
import hvd_sched.keras
import rankutil
from stackutil import KERAS_MAJOR
from hvd_sched.keras import ElasticLRScaler, ScheduledOptimizer

EPOCHS, STEPS, BATCH = 4, 20, 8
HOLD_AT = 25
OUT = os.environ["HVD_SCHED_TEST_OUT"]

hvd.init()
x, y = rankutil.make_regression(n=STEPS * BATCH, seed=3)
schedule = hvd_sched.from_detectron({
    "BASE_LR": hvd_sched.linear_scaled_lr(0.05, hvd.size()), "LR_POLICY": "steps_with_decay", "GAMMA": 0.5,
    "STEPS": [0, 40], "MAX_ITER": EPOCHS * STEPS, "WARM_UP_ITERS": 10, "WARM_UP_METHOD": "linear"})
model = rankutil.make_mlp(seed=1)
model.compile(hvd_sched.keras.DistributedOptimizer(ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule)), "mse")
optimizer = model.optimizer
scaler = ElasticLRScaler(optimizer)
records = {"start_size": hvd.size(), "batches": [], "resets": []}


def slot_sum():
    return float(sum(np.abs(np.asarray(m.numpy())).sum() for m in hvd_sched.keras.scheduled_of(optimizer).momentums))


def before_reset():
    records["resets"].append({"slots_before": slot_sum()})


def after_reset():
    records["resets"][-1].update(scaler.history[-1], slots_after=slot_sum())


class Record(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        it = int(optimizer.iterations.numpy()) - 1  # the iteration this batch ran
        # The LR the step used: Keras 2 keeps it in a variable (`optimizer.learning_rate` read outside the step is
        # the next step's); Keras 3 evaluates the schedule when asked, so the same in-graph schedule is evaluated
        # at this batch's iteration.
        lr_used = (optimizer._current_learning_rate if KERAS_MAJOR == 2
                   else optimizer._learning_rate(tf.constant(it, tf.int64)))
        records["batches"].append({"it": it, "size": hvd.size(), "lr_used": float(lr_used.numpy()),
                                   "lr_scheduled": optimizer.lr_at(it), "lr_table": schedule.lr_at(it)})
        if hvd.rank() == 0:
            with open(os.path.join(OUT, "progress.tmp"), "w") as f:
                f.write(str(it))
            os.replace(os.path.join(OUT, "progress.tmp"), os.path.join(OUT, "progress"))
        if hvd.rank() == 0 and it == HOLD_AT and not records["resets"] and not hosts_updated.wait(timeout=150):
            raise RuntimeError(f"no hosts-updated notification within 150 s of iteration {HOLD_AT}")


class HostsUpdated:
    """A listener of Horovod's worker notifications (as hvd.elastic.State is): sets an event on a host change."""

    def on_hosts_updated(self, timestamp, update_res):
        hosts_updated.set()


hosts_updated = threading.Event()


listener = HostsUpdated()
state = hvd_sched.keras.elastic_state(model, batch=0, epoch=0)  # Keras 2: hvd.elastic.KerasState
state.register_reset_callbacks([before_reset, scaler, after_reset])
# A TrainingCheckpoint (stop signals and a period) in an elastic job: a reset is not a stop.
checkpoint = hvd_sched.keras.TrainingCheckpoint(os.path.join(OUT, "ckpt"), period=10)
callbacks = [hvd.elastic.CommitStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
             hvd.elastic.UpdateEpochStateCallback(state), Record(), checkpoint]


@hvd.elastic.run
def train(state):
    # hvd.elastic.run has started the notification service by now.
    horovod.common.elastic.notification_manager.register_listener(listener)
    state.model.fit(x, y, batch_size=BATCH, steps_per_epoch=STEPS, epochs=EPOCHS, initial_epoch=state.epoch,
                    shuffle=False, verbose=0, callbacks=callbacks)


train(state)
records["final_iteration"] = int(optimizer.iterations.numpy())
records["final_size"] = hvd.size()
records["checkpoint"] = hvd_sched.keras.latest_checkpoint(os.path.join(OUT, "ckpt"))
with open(os.path.join(OUT, f"elastic{os.getpid()}.json"), "w") as f:
    json.dump(records, f)
