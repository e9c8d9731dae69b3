"""hvd_sched.keras.DistributedOptimizer on 2 real Gloo ranks, on every row (Keras 2: Horovod's own wrapper;
Keras 3: hvd_sched's, on Horovod's TensorFlow collectives): ranks identical, equal to one process on the full
batch and to the numpy re-derivation of Caffe2's update; sparse gradients; a loss-scale skip decided the same on
every rank; an XLA-compiled step refused with a clear error; on Keras 3, Horovod's own Keras wrapper refused."""

import pathlib

import numpy as np
import pytest

from launch import RankFailure
from rankutil import make_regression
from reference import detectron_corrections, detectron_lr, mlp_grads, train_caffe2_sgd
from stackutil import KERAS_MAJOR
import rows

# One Keras 2 row and the Keras 3 row (tests/rows.py):
# Keras 3: hvd_sched's own allreduce, loss-scale agreement and wrapper refusal.
pytestmark = [pytest.mark.multirank, pytest.mark.depends_on(*rows.KERAS_PATH)]

JOB = pathlib.Path(__file__).with_name("distributed_job.py").read_text()
SOLVER = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 6, 9], "MAX_ITER": 12,
          "WARM_UP_ITERS": 3, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "linear"}


def _assert_ranks_identical(ranks):
    assert ranks[0]["iterations"] == ranks[1]["iterations"]
    for w0, w1 in zip(ranks[0]["weights"], ranks[1]["weights"]):
        np.testing.assert_array_equal(np.array(w0), np.array(w1))


def test_rules_two_ranks_equal_one_process_and_caffe2(run_ranks, run_single):
    """lr_multipliers bias x2 and weight_decays {bias: 0, "": 1e-2}: Caffe2's coupled decay with biases x2 and no
    decay, momentum correction at iteration 6 and 9. Rank 1 starts from other weights than rank 0: the initial
    broadcast gives it rank 0's before the first step (as Detectron broadcasts from device 0 before training), so
    the first gradient is the full batch's at rank 0's weights (Horovod's own Keras 2 callback broadcasts at the
    end of the first batch: that step's average mixed rank 1's weights in: 0.08 away here)."""
    ranks = run_ranks(JOB, np=2, args=["rules", "ranks"])
    single = run_single(JOB, args=["rules", "single"])
    assert not np.array_equal(np.array(ranks[0]["initial"][0]), np.array(ranks[1]["initial"][0]))
    np.testing.assert_array_equal(np.array(ranks[0]["initial"][0]), np.array(single["initial"][0]))
    _assert_ranks_identical(ranks)
    assert ranks[0]["iterations"] == single["iterations"] == 12
    x, y = make_regression(n=16 * 6, seed=3)
    batches = [(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16]) for i in range(6)] * 2
    expected = train_caffe2_sgd([np.array(w) for w in single["initial"]], batches,
                                [detectron_lr(it, SOLVER) for it in range(12)], detectron_corrections(12, SOLVER),
                                0.9, mlp_grads, ["weight", "bias", "weight", "bias"], weight_decay=1e-2)
    for w0, ws, want in zip(ranks[0]["weights"], single["weights"], expected):
        np.testing.assert_allclose(np.array(w0), np.array(ws), atol=1e-5, rtol=0)
        np.testing.assert_allclose(np.array(w0), want, atol=1e-5, rtol=0)
    # The History's learning_rate is the schedule's LR of each epoch's last iteration, on every rank.
    assert ranks[0]["lr"] == ranks[1]["lr"] == [np.float32(detectron_lr(it, SOLVER)).item() for it in (5, 11)]
    # MetricAverage: the epoch loss is the same on both ranks (each saw its own half).
    assert ranks[0]["loss"] == ranks[1]["loss"]


def test_sparse_gradients_two_ranks_equal_one_process(run_ranks, run_single):
    ranks = run_ranks(JOB, np=2, args=["sparse", "ranks"])
    single = run_single(JOB, args=["sparse", "single"])
    _assert_ranks_identical(ranks)
    for w0, ws in zip(ranks[0]["weights"], single["weights"]):
        np.testing.assert_allclose(np.array(w0), np.array(ws), atol=1e-5, rtol=0)


def test_a_rank_local_overflow_is_skipped_on_every_rank(run_ranks):
    """mixed_float16: rank 1's half of batch 3 overflows; averaged first, the gradients are non-finite on both
    ranks, both skip (no rank waits in an allreduce the other skipped) and stay identical."""
    ranks = run_ranks(JOB, np=2, args=["overflow", "ranks"], timeout=180)
    _assert_ranks_identical(ranks)
    # Batch 3 comes once per epoch, and overflows at 2**15 and 2**14: two skips, each halving the scale.
    assert ranks[0]["loss_scale"] == ranks[1]["loss_scale"] == 2.0 ** 13
    # Keras 2 counts a skipped step in `iterations`, Keras 3 does not.
    assert ranks[0]["iterations"] == (12 if KERAS_MAJOR == 2 else 10)


def test_xla_compiled_step_stops_every_rank_with_a_clear_error(run_ranks):
    with pytest.raises(RankFailure) as failure:
        run_ranks(JOB, np=2, args=["xla", "ranks"], timeout=180)
    message = str(failure.value)
    assert "jit_compile=False" in message and "no XLA kernels" in message
    assert "[0]<stderr>" in message and "[1]<stderr>" in message


HOROVOD_OWN = """
import sys
first = sys.argv[1]
if first == "horovod":
    import horovod.tensorflow.keras as hvd
    import hvd_sched.keras
else:
    import hvd_sched.keras
    import horovod.tensorflow.keras as hvd
import tensorflow as tf, rankutil
hvd.init()
try:
    hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9))
    outcome = "accepted"
except ValueError as error:
    outcome = str(error)
rankutil.emit({"outcome": outcome}, rank=0)
"""


@pytest.mark.skipif(KERAS_MAJOR != 3, reason="Keras 2: Horovod's own wrapper averages and is what hvd_sched uses")
@pytest.mark.parametrize("first", ["horovod", "hvd_sched"])
def test_horovods_own_keras_wrapper_is_refused_on_keras_3(run_single, first):
    outcome = run_single(HOROVOD_OWN, args=[first])["outcome"]
    assert "hvd_sched.keras.DistributedOptimizer" in outcome and "train apart" in outcome
