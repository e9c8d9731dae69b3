"""Drop-in where users come from, on 2 real Gloo ranks (`horovodrun -np 2 --gloo`): Keras' and Horovod's LR callbacks
refused on every rank with a ScheduledOptimizer (no rank left waiting in a collective), Horovod's
`BroadcastVariables(local_variables=...)` meaning, and `hvd_sched.keras.load_model` resuming a 2-rank job from every
format Keras saves an optimizer in (.keras; Keras 2 also .h5 and SavedModel), ending where the uninterrupted run ends (which itself equals the numpy
Detectron update of tests/reference.py on the full batches)."""

import pathlib

import numpy as np
import pytest

from rankutil import make_regression
from reference import detectron_corrections, detectron_lr, train_detectron_sgd
from stackutil import KERAS_MAJOR
import rows

pytestmark = pytest.mark.multirank

JOB = pathlib.Path(__file__).with_name("dropin_job.py").read_text()
SOLVER = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 10, 20],
          "MAX_ITER": 30, "WARM_UP_ITERS": 5, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "constant"}
FIXES = {
    "LearningRateScheduler": ("Put the LR changes in the SOLVER config", 0),
    "ReduceLROnPlateau": ("A ScheduledOptimizer does not reduce its LR on a plateau", 20),  # end of epoch 1
    "LearningRateWarmupCallback": ("Put the warmup in the SOLVER config", 0),
    "LearningRateScheduleCallback": ("Put the LR changes in the SOLVER config", 0),
}


def test_lr_callbacks_are_refused_on_every_rank_and_local_variables_stay(run_ranks, tmp_path):
    ranks = run_ranks(JOB, np=2, args=["writers", tmp_path])
    names = ["LearningRateScheduler", "ReduceLROnPlateau"] + (
        ["LearningRateWarmupCallback", "LearningRateScheduleCallback"] if KERAS_MAJOR == 2 else [])
    for name in names:
        fix, iterations = FIXES[name]
        for rank in ranks:
            outcome = rank[name]["outcome"]
            assert f"{name} tried to set the learning rate of ScheduledSGD" in outcome and fix in outcome, outcome
        assert ranks[0][name]["iterations"] == ranks[1][name]["iterations"] == iterations
        for w0, w1 in zip(ranks[0][name]["weights"], ranks[1][name]["weights"]):
            np.testing.assert_array_equal(np.array(w0), np.array(w1))
    local = ranks[0]["broadcast"]["local_index"]
    for rank_index, rank in enumerate(ranks):
        for i, weight in enumerate(rank["broadcast"]["weights"]):
            # root_rank=1 filled its variables with 2.0; the local one keeps each rank's own (rank + 1).
            want = float(rank_index + 1) if i == local else 2.0
            np.testing.assert_array_equal(np.array(weight), np.full(np.shape(weight), want, np.float32))


def _reference(initial):
    x, y = make_regression(n=16 * 10, seed=3)
    batches = [(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16]) for i in range(10)] * 3
    return train_detectron_sgd([np.array(w) for w in initial], batches, [detectron_lr(it, SOLVER) for it in range(30)],
                               detectron_corrections(30, SOLVER), 0.9, multipliers=[1.0, 2.0, 1.0, 2.0])


@pytest.mark.depends_on(*rows.KERAS_PATH)  # Keras 3 saves and restores by its own path
def test_load_model_resumes_two_ranks_from_every_format_exactly(run_ranks, tmp_path):
    full = run_ranks(JOB, np=2, args=["train", tmp_path])
    resumed = run_ranks(JOB, np=2, args=["resume", tmp_path], timeout=360)
    formats = ["model.keras"] + (["model.h5", "savedmodel"] if KERAS_MAJOR == 2 else [])
    assert sorted(resumed[0]) == sorted(formats)
    assert full[0]["iterations"] == full[1]["iterations"] == 30
    expected = _reference(full[0]["initial"])
    for w0, w1, want in zip(full[0]["weights"], full[1]["weights"], expected):
        np.testing.assert_array_equal(np.array(w0), np.array(w1))
        np.testing.assert_allclose(np.array(w0), want, atol=1e-5, rtol=0)
    for name in formats:
        for rank in resumed:
            got = rank[name]
            assert got["class"] == "ScheduledSGD" and got["distributed"], (name, got["class"])
            assert (got["start"], got["iterations"]) == (20, 30), name
            for w, want in zip(got["weights"], full[0]["weights"]):
                np.testing.assert_allclose(np.array(w), np.array(want), atol=1e-6, rtol=0, err_msg=name)
