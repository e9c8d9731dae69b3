"""``hvd_sched._validation``: the validators every layer uses, in the two wordings (config keys, Keras arguments)."""

import math
import re

import numpy as np
import pytest

from hvd_sched import _validation as v


@pytest.mark.parametrize("call, error, message", [
    (lambda: v.number("base_lr", "0.1", low=0, low_open=True), TypeError, "BASE_LR must be a number, got '0.1' (str)"),
    (lambda: v.number("warm_up_factor", 1.5, low=0, high=1, low_open=True), ValueError,
     "WARM_UP_FACTOR must be in (0, 1], got 1.5"),
    (lambda: v.number("gamma", 10**400, low=0, low_open=True), ValueError, "GAMMA must be > 0, got 1000"),
    (lambda: v.integer("max_iter", 1.0, low=1), TypeError, "MAX_ITER must be an int, got 1.0 (float)"),
    (lambda: v.integer("world_size", 0, low=1, label="world_size"), ValueError, "world_size must be >= 1, got 0"),
    (lambda: v.integer("steps", 2**53 + 1), ValueError, f"STEPS must be <= {2**53}, got {2**53 + 1}"),
    (lambda: v.int_list("steps", [0, True]), TypeError, "STEPS must be a list of ints, got [0, True]"),
    (lambda: v.int_list("steps", np.array(3)), TypeError, "STEPS must be a list, got array(3) (ndarray)"),
    (lambda: v.float_list("lrs", [0.1, math.inf]), ValueError, "LRS entries must be finite and > 0, got [0.1, inf]"),
    (lambda: v.choice("lr_policy", "cos", ("step", "poly")), ValueError,
     "unknown LR_POLICY 'cos'; expected one of ['step', 'poly']"),
    (lambda: v.choice("lr_policy", 1, ("step",)), TypeError, "LR_POLICY must be a string, got 1 (int)"),
    (lambda: v.boolean("NESTEROV", 1), TypeError, "NESTEROV must be a bool, got 1 (int)"),
])
def test_config_key_messages_name_the_key_and_the_value(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call()


def test_config_validators_return_plain_new_values():
    steps = (0, np.int64(10))
    assert v.int_list("steps", steps) == [0, 10] and all(type(item) is int for item in v.int_list("steps", steps))
    lrs = [1, np.float32(0.5)]
    assert v.float_list("lrs", lrs) == [1.0, 0.5] and v.float_list("lrs", lrs) is not lrs
    assert type(v.number("base_lr", np.float32(0.25), low=0)) is float
    assert v.close_match_hint("max_itr", ["MAX_ITER", "STEPS"]) == "; did you mean 'MAX_ITER'?"
    assert v.close_match_hint("zzz", ["STEPS", "MAX_ITER"]) == "; valid keys: ['MAX_ITER', 'STEPS']"


# The messages of hvd_sched.keras.build's argument checks (tests/keras/test_build_optimizer.py), reproduced.
@pytest.mark.parametrize("kwargs, error, message", [
    (dict(argument="bias_lr_factor", value=-1, allow_none=True, say_none=False), ValueError,
     "Argument `bias_lr_factor` must be a finite number >= 0. Received: bias_lr_factor=-1"),
    (dict(argument="bias_weight_decay", value="0", allow_none=True, say_none=False), TypeError,
     "Argument `bias_weight_decay` must be a number. Received: bias_weight_decay='0' (str)"),
    (dict(argument="norm_weight_decay", value=math.nan, allow_none=True), ValueError,
     "Argument `norm_weight_decay` must be a finite number >= 0 or None. Received: norm_weight_decay=nan"),
    (dict(argument="decay", value=True, allow_none=True), TypeError,
     "Argument `decay` must be a number or None. Received: decay=True (bool)"),
    (dict(argument="decay", value=None), TypeError, "Argument `decay` must be a number. Received: decay=None (NoneType)"),
    (dict(argument="factor", value=0, low_open=True), ValueError,
     "Argument `factor` must be a finite number > 0. Received: factor=0"),
    (dict(argument="threshold", value=0.5, low=1), ValueError,
     "Argument `threshold` must be a finite number >= 1. Received: threshold=0.5"),
    (dict(argument="ratio", value=0.1, low=0.25), ValueError,
     "Argument `ratio` must be a finite number >= 0.25. Received: ratio=0.1"),
    (dict(argument="decay", value=-10**400), ValueError, "Argument `decay` must be a finite number >= 0. Received: "),
])
def test_argument_number_messages(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        v.argument_number(**kwargs)


def test_argument_number_values():
    assert v.argument_number("decay", None, allow_none=True) is None
    assert v.argument_number("decay", 0) == 0.0 and type(v.argument_number("decay", 0)) is float
    assert v.argument_number("factor", np.float32(0.5), low_open=True) == 0.5


@pytest.mark.parametrize("rules, error, message", [
    (["bias"], TypeError, "weight_decays must be a dict of variable-name regex -> decay, got list: ['bias']"),
    ({"bias": -1e-4}, ValueError, "weight_decays['bias'] must be a finite number >= 0, got -0.0001"),
    ({"bias": "0"}, ValueError, "weight_decays['bias'] must be a finite number >= 0, got '0'"),
    ({"bias": True}, ValueError, "weight_decays['bias'] must be a finite number >= 0, got True"),
    ({"bias": math.inf}, ValueError, "weight_decays['bias'] must be a finite number >= 0, got inf"),
    ({"(": 0.0}, ValueError, "weight_decays key '(' is not a valid regex"),
    ({1: 0.0}, TypeError, "weight_decays keys must be regex strings, got 1"),
])
def test_name_rules_messages(rules, error, message):
    with pytest.raises(error, match=re.escape(message)):
        v.name_rules("weight_decays", rules, "decay")


def test_name_rules_keep_the_order_and_the_callers_dict():
    rules = {"bias": 2, "kernel$": 0.5}
    parsed = v.name_rules("lr_multipliers", rules, "factor")
    assert [(pattern, value) for pattern, _, value in parsed] == [("bias", 2.0), ("kernel$", 0.5)]
    assert parsed[1][1].search("dense/kernel") and type(parsed[0][2]) is float
    assert rules == {"bias": 2, "kernel$": 0.5}
    assert v.name_rules("lr_multipliers", None, "factor") == ()
