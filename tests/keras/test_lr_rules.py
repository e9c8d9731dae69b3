"""restore_latest at another world size or with another schedule (issue 46: a cluster checkpoint fine-tuned on one
machine): refused unless `lr_rule` says how the LR goes on; each rule's LR and momentum slots, checked against
numbers derived here (the slots read before the restore, the LRs of the configs), in one process.

The 2-rank end to end case, without Horovod and against Detectron's update in numpy, is
tests/multirank/test_exports.py; here the checkpoint's world size is written as another job's would be.
"""

import numpy as np
import pytest

import hvd_sched
import hvd_sched.keras as hk
import rankutil
from hvd_sched.keras import _backend
from hvd_sched.keras.checkpoint import schedule_meta, write_checkpoint

tf = pytest.importorskip("tensorflow")

SOLVER = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 4], "MAX_ITER": 20,
          "WARM_UP_ITERS": 0}
OTHER = {"BASE_LR": 0.05, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 8], "MAX_ITER": 20,
         "WARM_UP_ITERS": 0}
X, Y = rankutil.make_regression(n=48, seed=5)


def _model(solver, seed=2):
    model = rankutil.make_mlp(seed=seed)
    model.compile(hk.ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), hvd_sched.from_detectron(solver)),
                  "mse")
    return model


def _slots(model):
    return [np.array(slot) for slot in _backend.all_momentum_slots(model.optimizer)]


@pytest.fixture
def saved(tmp_path):
    """A checkpoint at iteration 6 of SOLVER, as 2 ranks would write it; (directory, weights, slots)."""
    model = _model(SOLVER)
    model.fit(X, Y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    meta = {"epoch": 0, "step": 6, "steps_per_epoch": 6, "iteration": 6, "micro_batches": 1, "signal": None,
            **schedule_meta(model.optimizer, 6)}
    assert meta["lr"] == meta["last_lr"] == pytest.approx(0.02) and meta["world_size"] == 1
    meta["world_size"] = 2
    write_checkpoint(str(tmp_path), model, meta)
    return str(tmp_path), model.get_weights(), _slots(model)


def test_another_world_size_is_refused_without_a_rule_naming_both(saved):
    directory, _, _ = saved
    with pytest.raises(ValueError) as error:
        hk.restore_latest(directory, _model(SOLVER))
    message = str(error.value)
    assert "(iteration 6) was written by 2 ranks and this job has 1" in message
    assert "lr_rule='linear'" in message and "lr_rule='schedule'" in message


def test_linear_scales_the_lr_and_the_slots_by_the_world_sizes(saved):
    directory, weights, slots = saved
    model = _model(SOLVER)
    meta = hk.restore_latest(directory, model, lr_rule="linear")
    assert meta["slot_factor"] == 0.5 and model.optimizer.lr_scale == 0.5
    assert model.optimizer.lr_at(6) == pytest.approx(0.01)
    for got, want in zip(model.get_weights(), weights):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(_slots(model), slots):
        np.testing.assert_array_equal(got, want * np.float32(0.5))


def test_schedule_follows_the_new_one_with_detectrons_correction(saved):
    directory, _, slots = saved
    model = _model(OTHER)
    meta = hk.restore_latest(directory, model, lr_rule="schedule")
    # Detectron at iteration 6: the LR goes from the job's 0.02 to OTHER's 0.05, V *= 0.05 / 0.02.
    factor = np.float32(np.float32(0.05) / np.float32(0.02))
    assert meta["slot_factor"] == pytest.approx(float(factor)) and model.optimizer.lr_scale == 1.0
    for got, want in zip(_slots(model), slots):
        np.testing.assert_allclose(got, want * factor, rtol=1e-6)


def test_linear_with_another_schedule_is_refused(saved):
    directory, _, _ = saved
    with pytest.raises(ValueError, match=r"last updated with LR 0\.02, and this optimizer's schedule gives 0\.05 "
                                         r"there: lr_rule='linear' continues the checkpoint's own schedule"):
        hk.restore_latest(directory, _model(OTHER), lr_rule="linear")


def test_the_same_world_size_with_another_schedule_is_refused(tmp_path):
    model = _model(SOLVER)
    model.fit(X, Y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    write_checkpoint(str(tmp_path), model, {"epoch": 0, "step": 6, "steps_per_epoch": 6, "iteration": 6,
                                            **schedule_meta(model.optimizer, 6)})
    with pytest.raises(ValueError, match=r"last updated with LR 0\.02 and this optimizer's schedule gives 0\.05 "
                                         r"there: another schedule"):
        hk.restore_latest(str(tmp_path), _model(OTHER))
    hk.restore_latest(str(tmp_path), _model(SOLVER))  # the job's own: as before


def test_bad_rules_and_old_checkpoints_are_named(saved, tmp_path):
    directory, _, _ = saved
    with pytest.raises(ValueError, match=r"lr_rule must be None, 'linear' or 'schedule', got 'linaer'"):
        hk.restore_latest(directory, _model(SOLVER), lr_rule="linaer")
    plain = rankutil.make_mlp(seed=2)
    plain.compile(tf.keras.optimizers.SGD(0.1, momentum=0.9), "mse")
    with pytest.raises(ValueError, match=r"lr_rule='linear' needs a ScheduledOptimizer"):
        hk.restore_latest(directory, plain, lr_rule="linear")
    old = _model(SOLVER)  # a checkpoint of before world_size and the LRs were recorded
    old.fit(X, Y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    write_checkpoint(str(tmp_path / "old"), old, {"epoch": 0, "step": 6, "steps_per_epoch": 6, "iteration": 6})
    with pytest.raises(ValueError, match=r"does not record its world size"):
        hk.restore_latest(str(tmp_path / "old"), _model(SOLVER), lr_rule="linear")
    with pytest.raises(ValueError, match=r"does not record its last LR"):
        hk.restore_latest(str(tmp_path / "old"), _model(OTHER), lr_rule="schedule")
    assert hk.restore_latest(str(tmp_path / "old"), _model(SOLVER))["iteration"] == 6  # as before
