"""ScheduledOptimizer / ScheduleCallback under real `horovodrun -np 2 --gloo`, against one process on the full batch.

Each rank sees half of every global batch; Horovod averages the gradients, so both ranks must end with identical
weights equal (1e-5) to a single process training on the full batches with the same schedule and corrections, and
both equal (1e-5) to the independent numpy Detectron MomentumSGD of tests/reference.py.
"""

import numpy as np
import pytest

from rankutil import make_regression
from reference import detectron_corrections, detectron_lr, train_detectron_sgd

pytestmark = pytest.mark.multirank

COMMON = """
import json, sys, numpy as np, tensorflow as tf
import hvd_sched, hvd_sched.keras, rankutil
from hvd_sched.keras import ScheduledOptimizer, ScheduleCallback, horovod_callbacks
tf.config.experimental.enable_op_determinism()
GLOBAL_BATCH, STEPS, EPOCHS = 16, 10, 3
SOLVER = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 10, 20],
          "MAX_ITER": 30, "WARM_UP_ITERS": 5, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "constant"}
schedule = hvd_sched.from_detectron(SOLVER)
PATH = sys.argv[1]
x, y = rankutil.make_regression(n=GLOBAL_BATCH * STEPS, seed=3)

def model():
    return rankutil.make_mlp(seed=1)

def optimizer(wrap=lambda o: o):
    if PATH == "wrapper":
        return wrap(ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule,
                                       lr_multipliers={"bias": 2.0}))
    return wrap(tf.keras.optimizers.SGD(0.5, momentum=0.9))
"""

DISTRIBUTED = COMMON + """
import horovod.tensorflow.keras as hvd
hvd.init()
r, n = hvd.rank(), hvd.size()
xs, ys = rankutil.shard_batches(x, y, GLOBAL_BATCH, r, n)
m = model()
m.compile(optimizer(hvd_sched.keras.DistributedOptimizer), "mse")  # Keras 2: Horovod's own
cb = horovod_callbacks(ScheduleCallback(schedule) if PATH == "callback" else None)
h = m.fit(xs, ys, batch_size=GLOBAL_BATCH // n, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=cb)
rankutil.emit({"weights": m.get_weights(), "lr": h.history["learning_rate"], "loss": h.history["loss"],
               "class": type(m.optimizer).__name__, "iterations": int(m.optimizer.iterations.numpy())})
"""

SINGLE = COMMON + """
m = model()
initial = m.get_weights()
m.compile(optimizer(), "mse")
cb = [ScheduleCallback(schedule)] if PATH == "callback" else []
m.fit(x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=cb)
rankutil.emit({"weights": m.get_weights(), "initial": initial}, rank=0)
"""
SOLVER = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 10, 20],
          "MAX_ITER": 30, "WARM_UP_ITERS": 5, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "constant"}


def _reference(initial, path):
    """The numpy Detectron run from the same initial weights on the same full batches."""
    x, y = make_regression(n=16 * 10, seed=3)
    batches = [(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16]) for i in range(10)] * 3
    multipliers = [1.0, 2.0, 1.0, 2.0] if path == "wrapper" else None
    return train_detectron_sgd([np.array(w) for w in initial], batches, [detectron_lr(it, SOLVER) for it in range(30)],
                               detectron_corrections(30, SOLVER), 0.9, multipliers=multipliers)


@pytest.mark.parametrize("path", ["wrapper", "callback"])
def test_two_ranks_half_batches_equal_one_rank_full_batch(run_ranks, run_single, path):
    ranks = run_ranks(DISTRIBUTED, np=2, args=[path])
    single = run_single(SINGLE, args=[path])
    assert ranks[0]["iterations"] == ranks[1]["iterations"] == 30
    if path == "wrapper":
        assert ranks[0]["class"] == "ScheduledSGD"
    assert ranks[0]["lr"] == ranks[1]["lr"]
    expected = _reference(single["initial"], path)
    for w0, w1, ws, want in zip(ranks[0]["weights"], ranks[1]["weights"], single["weights"], expected):
        np.testing.assert_array_equal(np.array(w0), np.array(w1))
        np.testing.assert_allclose(np.array(w0), np.array(ws), atol=1e-5, rtol=0)
        np.testing.assert_allclose(np.array(ws), want, atol=1e-5, rtol=0)
        np.testing.assert_allclose(np.array(w0), want, atol=1e-5, rtol=0)
