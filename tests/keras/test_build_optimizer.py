"""`build_optimizer`: Detectron's per-parameter update (coupled decay, biases x2 without decay, norm decay, momentum
correction, Nesterov) on a model with Conv/Dense kernels, biases, a GroupNorm and a BatchNorm, against the numpy
re-derivation of Caffe2's update in tests/reference.py; serialization, save/load and resume keep the rules."""

import json

import numpy as np
import pytest
import tensorflow as tf

import hvd_sched
from hvd_sched.keras import ScheduledOptimizer, build_optimizer, describe_optimizer, parameter_groups
from stackutil import keras2_only, variable_name
from reference import (caffe2_group, detectron_corrections, detectron_lr, make_conv_data, make_conv_model,
                       tape_grad_fn, train_caffe2_sgd)

BATCH, STEPS_PER_EPOCH, EPOCHS = 8, 4, 3
N_ITERS = STEPS_PER_EPOCH * EPOCHS
MU, WD, WD_NORM = 0.9, 0.01, 0.005
SOLVER = {"BASE_LR": 0.1, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 6, 9], "MAX_ITER": N_ITERS,
          "WARM_UP_ITERS": 3, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "linear", "MOMENTUM": MU,
          "WEIGHT_DECAY": WD}


def _data():
    return make_conv_data(BATCH * STEPS_PER_EPOCH, seed=3)


def _nesterov_optimizer(model, nesterov):
    """build_optimizer, with Nesterov from the config's NESTEROV where hvd_sched reads it, else the same rules on a
    Nesterov SGD."""
    if not nesterov:
        return build_optimizer(SOLVER, model, norm_weight_decay=WD_NORM)
    if "NESTEROV" in hvd_sched.SOLVER_KEYS:
        return build_optimizer(dict(SOLVER, NESTEROV=True), model, norm_weight_decay=WD_NORM)
    built = build_optimizer(SOLVER, model, norm_weight_decay=WD_NORM)
    return ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=MU, nesterov=True), built.schedule,
                              lr_multipliers=built.lr_multipliers, weight_decays=built.weight_decays)


def _reference(initial, names, nesterov=False, weight_decay=WD, weight_decay_gn=WD_NORM, corrections=True):
    x, y = _data()
    batches = [(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]) for i in range(STEPS_PER_EPOCH)]
    lrs = [detectron_lr(it, SOLVER) for it in range(N_ITERS)]
    plain = make_conv_model(seed=1)
    return train_caffe2_sgd(initial, batches * EPOCHS, lrs,
                            detectron_corrections(N_ITERS, SOLVER) if corrections else {}, MU,
                            tape_grad_fn(plain), [caffe2_group(n) for n in names], nesterov=nesterov,
                            weight_decay=weight_decay, weight_decay_gn=weight_decay_gn)


def _max_diff(model, expected):
    return max(float(np.abs(v.numpy() - w).max()) for v, w in zip(model.trainable_variables, expected))


def _fit(model, optimizer, epochs=EPOCHS, initial_epoch=0):
    if getattr(model, "optimizer", None) is None:  # Keras 3 models have no optimizer attribute before compile
        model.compile(optimizer, "mse")
    x, y = _data()
    model.fit(x, y, batch_size=BATCH, epochs=epochs, initial_epoch=initial_epoch, shuffle=False, verbose=0)


@pytest.mark.parametrize("nesterov", [False, True], ids=["momentum", "nesterov"])
def test_build_optimizer_matches_caffe2_reference(nesterov):
    model = make_conv_model(seed=1)
    initial = [v.numpy().copy() for v in model.trainable_variables]
    names = [variable_name(v) for v in model.trainable_variables]
    opt = _nesterov_optimizer(model, nesterov)
    assert opt.nesterov is nesterov and opt.momentum == MU
    _fit(model, opt)
    assert int(opt.iterations.numpy()) == N_ITERS
    expected = _reference(initial, names, nesterov=nesterov)
    diff = _max_diff(model, expected)
    print(f"max |keras - caffe2 reference| = {diff:.3g}")
    assert diff < 1e-5
    # Not vacuous: without the decay, or without the momentum correction, the reference ends elsewhere.
    assert max(np.abs(a - b).max() for a, b in
               zip(expected, _reference(initial, names, nesterov=nesterov, weight_decay=0.0))) > 1e-4
    assert max(np.abs(a - b).max() for a, b in
               zip(expected, _reference(initial, names, nesterov=nesterov, weight_decay_gn=0.0))) > 1e-5
    assert max(np.abs(a - b).max() for a, b in
               zip(expected, _reference(initial, names, nesterov=nesterov, corrections=False))) > 1e-4


def test_rules_follow_caffe2_groups_and_describe():
    model = make_conv_model(seed=1)
    opt = build_optimizer(SOLVER, model)
    groups = parameter_groups(model)
    assert [len(groups[g]) for g in ("kernel", "bias", "norm_scale", "norm_shift")] == [3, 3, 2, 2]
    for v in model.trainable_variables:
        group = caffe2_group(variable_name(v))
        assert opt.weight_decay_for(v) == {"bias": 0.0, "gn": 0.0, "weight": WD}[group], variable_name(v)
        assert opt.lr_multiplier_for(v) == {"bias": 2.0, "gn": 1.0, "weight": 1.0}[group], variable_name(v)
    assert describe_optimizer(opt, model) == \
        "weight decay 0.01 on 3 kernels, 0 on 5 biases at 2x LR (2 norm shifts), 0 on 2 norm scales"
    custom = build_optimizer(SOLVER, model, bias_lr_factor=1.0, bias_weight_decay=1e-3, norm_weight_decay=1e-4)
    assert describe_optimizer(custom, model) == \
        "weight decay 0.01 on 3 kernels, 0.001 on 5 biases (2 norm shifts), 0.0001 on 2 norm scales"
    schedule = hvd_sched.from_detectron(SOLVER)
    assert build_optimizer(schedule, model).get_config()["weight_decays"] == opt.get_config()["weight_decays"]


def test_config_round_trips_through_json_and_horovod_rebuild():
    import horovod.tensorflow.keras as hvd

    hvd.init()
    model = make_conv_model(seed=1)
    initial = [v.numpy().copy() for v in model.trainable_variables]
    names = [variable_name(v) for v in model.trainable_variables]
    opt = build_optimizer(SOLVER, model, norm_weight_decay=WD_NORM)
    config = opt.get_config()
    restored = type(opt).from_config(json.loads(json.dumps(config)))
    assert restored.get_config() == config
    assert list(restored.weight_decays) == list(opt.weight_decays)  # first match wins: the order is kept
    wrapped = hvd_sched.keras.DistributedOptimizer(opt)
    assert wrapped.weight_decays == opt.weight_decays and wrapped.lr_multipliers == opt.lr_multipliers
    _fit(model, wrapped)  # one Horovod rank: the rebuilt optimizer's update is Caffe2's
    assert _max_diff(model, _reference(initial, names)) < 1e-5


def test_model_save_and_load_model_keep_the_rules(tmp_path):
    model = make_conv_model(seed=1)
    initial = [v.numpy().copy() for v in model.trainable_variables]
    names = [variable_name(v) for v in model.trainable_variables]
    opt = build_optimizer(SOLVER, model, norm_weight_decay=WD_NORM)
    _fit(model, opt, epochs=2)
    model.save(tmp_path / "m.keras")
    loaded = hvd_sched.keras.load_model(tmp_path / "m.keras")
    assert loaded.optimizer.weight_decays == opt.weight_decays
    assert loaded.optimizer.lr_multipliers == opt.lr_multipliers
    assert int(loaded.optimizer.iterations.numpy()) == 2 * STEPS_PER_EPOCH
    _fit(loaded, None, epochs=EPOCHS, initial_epoch=2)
    assert _max_diff(loaded, _reference(initial, names)) < 1e-5


RESUME = """
import sys, numpy as np, tensorflow as tf
import hvd_sched.keras, rankutil
from hvd_sched.keras import EpochCheckpoint, build_optimizer, restore_latest
from reference import make_conv_data, make_conv_model
tf.config.experimental.enable_op_determinism()
SOLVER = %r
stage, directory = sys.argv[1], sys.argv[2]
x, y = make_conv_data(%d, seed=3)
m = make_conv_model(seed=1)
m.compile(build_optimizer(SOLVER, m, norm_weight_decay=%r), "mse")
fit = dict(batch_size=%d, shuffle=False, verbose=0)
if stage == "first":
    m.fit(x, y, epochs=2, callbacks=[EpochCheckpoint(directory)], **fit)
else:
    meta = restore_latest(directory, m)
    assert meta["epoch"] == 1, meta
    assert m.optimizer.weight_decays == build_optimizer(SOLVER, m, norm_weight_decay=%r).weight_decays
    m.fit(x, y, initial_epoch=meta["epoch"] + 1, epochs=%d, **fit)
rankutil.emit({"weights": [v.numpy() for v in m.trainable_variables],
               "iterations": int(m.optimizer.iterations.numpy())}, rank=0)
""" % (SOLVER, BATCH * STEPS_PER_EPOCH, WD_NORM, BATCH, WD_NORM, EPOCHS)


def test_epoch_checkpoint_resume_in_a_new_process_ends_with_the_uninterrupted_weights(run_single, tmp_path):
    directory = str(tmp_path / "ckpt")
    first = run_single(RESUME, args=["first", directory])
    assert first["iterations"] == 2 * STEPS_PER_EPOCH
    resumed = run_single(RESUME, args=["second", directory])
    assert resumed["iterations"] == N_ITERS
    model = make_conv_model(seed=1)
    _fit(model, build_optimizer(SOLVER, model, norm_weight_decay=WD_NORM))
    for got, want in zip(resumed["weights"], model.trainable_variables):
        np.testing.assert_allclose(np.array(got), want.numpy(), atol=1e-6, rtol=0)


def _unbuilt():
    return tf.keras.Sequential([tf.keras.layers.Dense(3)])


def _frozen():
    return tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Flatten()])


@pytest.mark.parametrize("model, kwargs, error, match", [
    ("unbuilt", {}, ValueError, r"Argument `model` must be built.*model.build\(input_shape\)"),
    ("frozen", {}, ValueError, r"Argument `model` has no trainable variables"),
    ("not_a_model", {}, TypeError, r"Argument `model` must be a tf.keras.Model. Received: model='conv'"),
    ("conv", {"bias_lr_factor": -1}, ValueError,
     r"Argument `bias_lr_factor` must be a finite number >= 0. Received: bias_lr_factor=-1"),
    ("conv", {"bias_weight_decay": "0"}, TypeError,
     r"Argument `bias_weight_decay` must be a number. Received: bias_weight_decay='0' \(str\)"),
    ("conv", {"norm_weight_decay": float("nan")}, ValueError,
     r"Argument `norm_weight_decay` must be a finite number >= 0 or None. Received: norm_weight_decay=nan"),
    ("conv", {"world_size": 2, "schedule": True}, ValueError,
     r"Argument `world_size` converts a SOLVER config; `solver` is already a Schedule"),
])
def test_bad_input_is_refused_before_the_first_step(model, kwargs, error, match):
    kwargs = dict(kwargs)
    solver = hvd_sched.from_detectron(SOLVER) if kwargs.pop("schedule", False) else SOLVER
    built = {"unbuilt": _unbuilt, "frozen": _frozen, "conv": make_conv_model,
             "not_a_model": lambda: "conv"}[model]()
    with pytest.raises(error, match=match):
        build_optimizer(solver, built, **kwargs)


def test_a_weight_decay_rule_that_matches_nothing_names_it_and_the_variables():
    model = make_conv_model(seed=1)
    schedule = hvd_sched.from_detectron(SOLVER)
    opt = ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=MU), schedule, weight_decays={"bais": 0.0, "": WD})
    match = r"weight_decays pattern 'bais' matches no trainable variable; the variable names are \[.*conv2d"
    with pytest.raises(ValueError, match=match):
        opt.check_rules(model.trainable_variables)
    model.compile(opt, "mse")
    x, y = _data()
    with pytest.raises(ValueError, match=match):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert int(opt.iterations.numpy()) == 0


@pytest.mark.parametrize("weight_decays, error, match", [
    (["bias"], TypeError, r"weight_decays must be a dict of variable-name regex -> decay, got list"),
    ({"bias": -1e-4}, ValueError, r"weight_decays\['bias'\] must be a finite number >= 0, got -0.0001"),
    ({"(": 0.0}, ValueError, r"weight_decays key '\(' is not a valid regex"),
])
def test_bad_weight_decays(weight_decays, error, match):
    with pytest.raises(error, match=match):
        ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=MU), hvd_sched.from_detectron(SOLVER),
                           weight_decays=weight_decays)


def test_coupled_and_decoupled_decay_together_is_refused():
    with pytest.raises(ValueError, match=r"weight_decays= \(coupled L2.*weight_decay=0.0001 \(SGD: decoupled"):
        ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=MU, weight_decay=1e-4), hvd_sched.from_detectron(SOLVER),
                           weight_decays={"": 1e-4})


@keras2_only("no legacy optimizers")
def test_legacy_sgd_with_weight_decays_matches_the_new_sgd():
    runs = []
    for sgd in (tf.keras.optimizers.SGD, tf.keras.optimizers.legacy.SGD):
        model = make_conv_model(seed=1)
        built = build_optimizer(SOLVER, model, norm_weight_decay=WD_NORM)
        opt = ScheduledOptimizer(sgd(momentum=MU), built.schedule, lr_multipliers=built.lr_multipliers,
                                 weight_decays=built.weight_decays)
        _fit(model, opt)
        runs.append([v.numpy() for v in model.trainable_variables])
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
