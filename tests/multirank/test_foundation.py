"""Foundation check with real `horovodrun -np 2 --gloo`: Horovod's allreduce + broadcast, no hvd_sched yet.

Two ranks that each see half of every global batch must end with identical weights, equal to one process
training on the full batches (DistributedOptimizer averages the gradients of equal-sized halves).
"""

import numpy as np
import pytest

import rows

# One Keras 2 row and the Keras 3 row (tests/rows.py): broadcast and averaged gradients: hvd_sched's own on Keras 3.
pytestmark = [pytest.mark.multirank, pytest.mark.depends_on(*rows.KERAS_PATH)]

COMMON = """
import os, numpy as np, tensorflow as tf
import rankutil
tf.keras.utils.set_random_seed(0)
tf.config.experimental.enable_op_determinism()
GLOBAL_BATCH, STEPS = 16, 6
x, y = rankutil.make_regression(n=GLOBAL_BATCH * STEPS)

def model():
    return rankutil.make_mlp(seed=0)
"""

DISTRIBUTED = COMMON + """
import horovod.tensorflow.keras as hvd
hvd.init()
r, n = hvd.rank(), hvd.size()
xs, ys = rankutil.shard_batches(x, y, GLOBAL_BATCH, r, n)  # rank r: the r-th half of every global batch
m = model()
import hvd_sched.keras
from stackutil import KERAS_MAJOR
opt = hvd_sched.keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9))  # Keras 2: Horovod's own
m.compile(opt, "mse")
broadcast = (hvd.callbacks.BroadcastGlobalVariablesCallback(0) if KERAS_MAJOR == 2
             else hvd_sched.keras.BroadcastVariables(0))  # Horovod's callbacks need Keras 2
m.fit(xs, ys, batch_size=GLOBAL_BATCH // n, epochs=2, shuffle=False, verbose=0, callbacks=[broadcast])
rankutil.emit({"size": n, "weights": m.get_weights(), "iterations": int(m.optimizer.iterations.numpy())})
"""

SINGLE = COMMON + """
m = model()
m.compile(tf.keras.optimizers.SGD(0.1, momentum=0.9), "mse")
m.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
rankutil.emit({"weights": m.get_weights(), "iterations": int(m.optimizer.iterations.numpy())}, rank=0)
"""


def test_two_ranks_equal_one_process_on_the_full_batch(run_ranks, run_single):
    ranks = run_ranks(DISTRIBUTED, np=2)
    single = run_single(SINGLE)
    assert [r["size"] for r in ranks] == [2, 2]
    assert ranks[0]["iterations"] == ranks[1]["iterations"] == single["iterations"] == 12
    for w0, w1, ws in zip(ranks[0]["weights"], ranks[1]["weights"], single["weights"]):
        np.testing.assert_array_equal(np.array(w0), np.array(w1))
        np.testing.assert_allclose(np.array(w0), np.array(ws), atol=1e-5, rtol=0)
