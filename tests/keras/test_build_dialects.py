"""build_optimizer's per-parameter rules for each dialect, against the reference's reading of each repository.

``dialect_reference.param_rule`` gives (gradient multiplier, weight decay) per Caffe2 parameter from each
repository's optimizer code; the Keras model's parameters are mapped onto Caffe2's tags as a port would name
them (a Dense/Conv bias and a norm shift are BIAS-tagged; GroupNorm params are Detectron's ``gn_params``;
video-nonlocal-net's BatchNorm params are named ``<prefix>_bn_s`` / ``_bn_b``).
"""

import numpy as np
import pytest
import tensorflow as tf

import dialect_reference as ref
from hvd_sched import from_detectron
from hvd_sched.keras import build_optimizer
from stackutil import variable_name

SOLVERS = {
    "detectron": {"BASE_LR": 0.01, "LR_POLICY": "steps_with_decay", "STEPS": [0, 50], "MAX_ITER": 100,
                  "WEIGHT_DECAY": 1e-4, "WEIGHT_DECAY_GN": 3e-5},
    "large_scale_vrd": {"BASE_LR": 0.01, "STEP_SIZES": [50, 50], "NUM_ITERATIONS": 100, "WEIGHT_DECAY": 1e-4,
                        "WEIGHT_DECAY_BN": 7e-5, "NESTEROV": True},
    "video_nonlocal": {"BASE_LR": 0.01, "STEP_SIZES": [50, 50], "LRS": [1, 0.1, 0.01], "MAX_ITER": 100,
                       "WEIGHT_DECAY": 1e-4, "WEIGHT_DECAY_BN": 7e-5},
}
DEFAULTS = {"detectron": ref.DETECTRON_DEFAULTS, "large_scale_vrd": ref.VRD_DEFAULTS,
            "video_nonlocal": ref.VNL_DEFAULTS}


def _model():
    inputs = tf.keras.Input((6, 6, 2))
    x = tf.keras.layers.Conv2D(4, 3, name="conv")(inputs)
    x = tf.keras.layers.GroupNormalization(groups=2, name="gn")(x)
    x = tf.keras.layers.Conv2D(4, 1, use_bias=False, name="conv2")(x)
    x = tf.keras.layers.BatchNormalization(name="res_bn")(x)
    x = tf.keras.layers.Flatten()(x)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(3, name="fc")(x))


def _caffe2_tags(variable):
    """(is_bias, is_gn, Caffe2-style name) of a Keras parameter of ``_model``."""
    name = variable_name(variable)
    layer, kind = name.split("/")[0], name.split("/")[-1].split(":")[0]
    is_bias = kind in ("bias", "beta")
    name = {"gamma": f"{layer}_s", "beta": f"{layer}_b", "bias": f"{layer}_b", "kernel": f"{layer}_w"}[kind]
    return is_bias, layer == "gn", name


@pytest.mark.parametrize("dialect", sorted(SOLVERS))
def test_each_parameter_gets_its_repositorys_rule(dialect):
    model = _model()
    optimizer = build_optimizer(SOLVERS[dialect], model, dialect=dialect)
    cfg = {**DEFAULTS[dialect], **SOLVERS[dialect]}
    for variable in model.trainable_variables:
        is_bias, is_gn, name = _caffe2_tags(variable)
        multiplier, decay = ref.param_rule(dialect, cfg, is_bias=is_bias, is_gn=is_gn, name=name)
        if dialect == "large_scale_vrd" and is_gn and not is_bias:
            decay = cfg["WEIGHT_DECAY"]  # its optimizer predates GroupNorm: a norm scale is "everything else"
        if dialect == "detectron" and name == "res_bn_s":
            # Detectron never trains a BN (AffineChannel is frozen); a trainable BN scale gets the norm decay
            # WEIGHT_DECAY_GN, as Goyal et al. exempt BN (issue 11), not WEIGHT_DECAY.
            decay = cfg["WEIGHT_DECAY_GN"]
        assert optimizer.lr_multiplier_for(variable) == multiplier, variable_name(variable)
        assert np.isclose(optimizer.weight_decay_for(variable), decay, rtol=0, atol=0), variable_name(variable)
    expected_nesterov = {"detectron": False, "large_scale_vrd": False, "video_nonlocal": True}[dialect]
    assert optimizer.nesterov is expected_nesterov


def test_a_schedule_of_a_dialect_carries_its_rules():
    model = _model()
    schedule = from_detectron(SOLVERS["video_nonlocal"], dialect="video_nonlocal")
    optimizer = build_optimizer(schedule, model)
    bias = next(v for v in model.trainable_variables if variable_name(v).startswith("fc/bias"))
    assert optimizer.weight_decay_for(bias) == 1e-4 and optimizer.lr_multiplier_for(bias) == 1.0


@pytest.mark.parametrize("dialect", ["large_scale_vrd", "video_nonlocal"])
def test_a_dialects_correction_rule_runs_in_the_optimizer(dialect):
    """SCALE_MOMENTUM on: the dialect's rule (any_change / relative_change) drives the in-graph factor."""
    model = _model()
    solver = {**SOLVERS[dialect], "SCALE_MOMENTUM": True}
    optimizer = build_optimizer(solver, model, dialect=dialect)
    assert optimizer.momentum_correction_mode == {"large_scale_vrd": "any_change",
                                                  "video_nonlocal": "relative_change"}[dialect]
    model.compile(optimizer, "mse")
    x, y = np.ones((4, 6, 6, 2), np.float32), np.zeros((4, 3), np.float32)
    model.fit(x, y, batch_size=2, epochs=30, verbose=0, shuffle=False)  # 60 steps: through the step at iteration 50
    assert int(optimizer.iterations) == 60
    assert all(np.all(np.isfinite(v.numpy())) for v in model.trainable_variables)
