"""The job of test_elastic_nodes.py: elastic Horovod across hosts of their own, a host killed, then a relaunch that
resumes from the survivor's checkpoint.

Each rank trains on BATCH rows of its own, the same rows at every step (rank r: rows r*BATCH to (r+1)*BATCH of one
regression problem): the gradient of an iteration then depends only on the world (the average over the ranks'
rows), never on which batch an elastic restart of `fit` takes next, so a numpy re-derivation knows every update.

HVD_SCHED_TEST_PHASE=elastic (under `horovodrun --min-np 1 --max-np 2 --host-discovery-script ...`): after
iteration HOLD_AT rank 0 waits until OUT/KILLED exists (the test kills the other host, then writes it), so the kill
lands at a known point whatever the load; ElasticLRScaler is the reset callback; a TrainingCheckpoint saves every
10 iterations and at each epoch's end. HVD_SCHED_TEST_PHASE=resume (a plain 2-rank launch): `restore_latest(...,
lr_rule="linear")` of the newest checkpoint, and the remaining epochs. Rank 0 writes the initial weights, each rank
its final weights and what it saw to OUT/<phase>-rank<r>.npz / .json.
"""

import json
import os
import socket
import time

import hvd_sched._compat  # noqa: F401  (before Horovod: keras -> tf_keras on TF >= 2.16, clear stack errors)

import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd

import hvd_sched
import hvd_sched.keras
import rankutil
from hvd_sched.keras import ElasticLRScaler, ScheduledOptimizer

STEPS, BATCH, HOLD_AT = 20, 8, 25
SOLVER = {"LR_POLICY": "steps_with_decay", "GAMMA": 0.5, "STEPS": [0, 40], "MAX_ITER": 200, "WARM_UP_ITERS": 10,
          "WARM_UP_METHOD": "linear", "WARM_UP_FACTOR": 1.0 / 3.0}
OUT = os.environ["HVD_SCHED_TEST_OUT"]
PHASE = os.environ["HVD_SCHED_TEST_PHASE"]
EPOCHS = int(os.environ["HVD_SCHED_TEST_EPOCHS"])

hvd.init()
rank = hvd.rank()
print(f"elastic_nodes_job: {PHASE}, rank {rank} of {hvd.size()} on host {socket.gethostname()}", flush=True)
x_all, y_all = rankutil.make_regression(n=2 * BATCH, seed=3)
x = np.tile(x_all[rank * BATCH:(rank + 1) * BATCH], (STEPS, 1))
y = np.tile(y_all[rank * BATCH:(rank + 1) * BATCH], (STEPS, 1))
# The job's schedule for the world it starts with (the linear scaling rule: 0.05 per rank).
schedule = hvd_sched.from_detectron({**SOLVER, "BASE_LR": hvd_sched.linear_scaled_lr(0.05, hvd.size())})
model = rankutil.make_mlp(seed=1)
model.compile(hvd_sched.keras.DistributedOptimizer(ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9),
                                                                      schedule)), "mse")
optimizer = model.optimizer
checkpoint = hvd_sched.keras.TrainingCheckpoint(os.path.join(OUT, "ckpt"), period=10)
record = {"host": socket.gethostname(), "start_rank": rank, "start_size": hvd.size(), "resets": [],
          "solver": {**SOLVER, "BASE_LR": schedule.base_lr}}
if rank == 0 and PHASE == "elastic":
    np.savez(os.path.join(OUT, "initial.npz"), *[w.numpy() for w in model.weights])


class Hold(tf.keras.callbacks.Callback):
    """Rank 0 waits after iteration HOLD_AT (once) until the test has killed the other host."""

    def on_train_batch_end(self, batch, logs=None):
        it = int(optimizer.iterations.numpy()) - 1
        if hvd.rank() == 0 and it == HOLD_AT and not record["resets"]:
            with open(os.path.join(OUT, "held"), "w") as f:
                f.write(str(it))
            deadline = time.monotonic() + 150
            while not os.path.exists(os.path.join(OUT, "KILLED")):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the test did not kill a host within 150 s of iteration {HOLD_AT}")
                time.sleep(0.05)


if PHASE == "elastic":
    scaler = ElasticLRScaler(optimizer)
    state = hvd_sched.keras.elastic_state(model, batch=0, epoch=0)
    state.register_reset_callbacks([scaler, lambda: record["resets"].append(scaler.history[-1])])
    callbacks = [hvd.elastic.CommitStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.UpdateEpochStateCallback(state), Hold(), checkpoint]

    @hvd.elastic.run
    def train(state):
        state.model.fit(x, y, batch_size=BATCH, steps_per_epoch=STEPS, epochs=EPOCHS, initial_epoch=state.epoch,
                        shuffle=False, verbose=0, callbacks=callbacks)

    train(state)
else:
    meta = hvd_sched.keras.restore_latest(os.path.join(OUT, "ckpt"), model, lr_rule="linear")
    record["resumed"] = {key: meta[key] for key in ("iteration", "epoch", "step", "world_size", "slot_factor")}
    model.fit(x, y, batch_size=BATCH, steps_per_epoch=STEPS, epochs=EPOCHS, initial_epoch=meta["epoch"] + 1,
              shuffle=False, verbose=0, callbacks=hvd_sched.keras.horovod_callbacks(checkpoint=checkpoint))

record.update(final_rank=hvd.rank(), final_size=hvd.size(), final_iteration=int(optimizer.iterations.numpy()),
              lr_scale=hvd_sched.keras.scheduled_of(optimizer).lr_scale)
np.savez(os.path.join(OUT, f"{PHASE}-rank{hvd.rank()}.npz"), *[w.numpy() for w in model.weights])
with open(os.path.join(OUT, f"{PHASE}-rank{hvd.rank()}.json"), "w") as f:
    json.dump(record, f)
print(f"elastic_nodes_job: {PHASE} done on host {socket.gethostname()}: rank {hvd.rank()} of {hvd.size()} at "
      f"iteration {record['final_iteration']}", flush=True)
