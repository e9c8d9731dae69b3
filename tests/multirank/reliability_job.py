"""A Horovod Keras job used by test_reliability.py: 2 ranks, per-epoch atomic checkpoints, optional resume.

Run under `horovodrun -np 2 --gloo` with HVD_SCHED_TEST_OUT set (see tests/conftest.py).
"""

import argparse
import os
import time

import hvd_sched._compat  # noqa: F401  (before Horovod: keras -> tf_keras on TF >= 2.16, clear stack errors)

import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd

import hvd_sched
import hvd_sched.keras
import rankutil
from hvd_sched.keras import EpochCheckpoint, ScheduledOptimizer, horovod_callbacks, restore_latest

parser = argparse.ArgumentParser()
parser.add_argument("--ckpt", required=True)
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--hold-rank1-at", type=int, default=-1,
                    help="rank 1 writes HVD_SCHED_TEST_OUT/held and waits there (to be killed) before this iteration")
parser.add_argument("--resume", action="store_true")
parser.add_argument("--diverge-at", type=int, default=0, help="iteration from which the LR is 1e8")
parser.add_argument("--rank1-base-lr", type=float, default=None, help="a misconfigured rank 1")
args = parser.parse_args()

hvd.init()
rank, size = hvd.rank(), hvd.size()
with open(os.path.join(os.environ["HVD_SCHED_TEST_OUT"], f"pid{rank}"), "w") as f:
    f.write(str(os.getpid()))
tf.config.experimental.enable_op_determinism()

GLOBAL_BATCH, STEPS = 16, 10
x, y = rankutil.make_regression(n=GLOBAL_BATCH * STEPS, seed=3)
xs, ys = rankutil.shard_batches(x, y, GLOBAL_BATCH, rank, size)

solver = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.5, "STEPS": [0, 20, 40],
          "MAX_ITER": 60, "WARM_UP_ITERS": 5, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "linear"}
if args.diverge_at:
    solver.update(LR_POLICY="steps_with_lrs", STEPS=[0, args.diverge_at], LRS=[0.05, 1e8])
if rank == 1 and args.rank1_base_lr is not None:
    solver["BASE_LR"] = args.rank1_base_lr
schedule = hvd_sched.from_detectron(solver)

model = rankutil.make_mlp(seed=1)
model.compile(hvd_sched.keras.DistributedOptimizer(ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule)), "mse")

meta = restore_latest(args.ckpt, model) if args.resume else None
start = 0 if meta is None else meta["epoch"] + 1


class HoldRank1(tf.keras.callbacks.Callback):
    """Rank 1 stops before iteration --hold-rank1-at and says so: the test kills it there, whatever the load."""

    def on_train_batch_begin(self, batch, logs=None):
        if rank == 1 and int(self.model.optimizer.iterations.numpy()) == args.hold_rank1_at:
            with open(os.path.join(os.environ["HVD_SCHED_TEST_OUT"], "held"), "w") as f:
                f.write(str(args.hold_rank1_at))
            time.sleep(600)  # killed by the test long before; rank 0 waits in the next allreduce meanwhile
            raise SystemExit("rank 1 was held for 600 s and not killed")


callbacks = horovod_callbacks(checkpoint_dir=args.ckpt) + [EpochCheckpoint(args.ckpt)]
if args.hold_rank1_at >= 0:
    callbacks.append(HoldRank1())
model.fit(xs, ys, batch_size=GLOBAL_BATCH // size, epochs=args.epochs, initial_epoch=start, shuffle=False,
          verbose=0, callbacks=callbacks)
rankutil.emit({"weights": model.get_weights(), "start": start,
               "iterations": int(model.optimizer.iterations.numpy()),
               "finite": bool(all(np.isfinite(w).all() for w in model.get_weights()))})
