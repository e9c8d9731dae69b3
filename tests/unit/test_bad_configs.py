"""A corpus of invalid Detectron SOLVER configs: each raises ``ValueError``/``TypeError`` naming the key and value.

Table-driven: for every key of ``SOLVER_KEYS`` and ``EPOCH_KEYS``, every wrong type and every out-of-range value,
then the list rules (empty, unsorted, duplicates, STEPS not from 0, LRS length), unknown / lower-case / non-string
keys, the solver argument and its SOLVER section, ``steps_per_epoch`` / ``world_size``, and the YAML files of
``tests/unit/bad_configs/`` (one invalid file per case). Every case asserts the exact exception type and, with
``match=``, that the message names the key (or argument, or file) and the bad value. All of it is
``from_detectron`` alone: the errors come before any schedule is evaluated, let alone a training step.

The last section, "Fixed bugs", holds the regression tests of inputs that used to escape as other exceptions
(huge ints, epoch overflow, arrays, undecodable YAML, a directory), or to build a schedule whose float32 LR is not
finite and positive; each was marked as an expected failure until its bug was fixed.
"""

import math
import os
import pathlib
import re
from decimal import Decimal

import numpy as np
import pytest

from hvd_sched import (
    EPOCH_KEYS,
    SOLVER_KEYS,
    Schedule,
    from_detectron,
    gradual_warmup_factor,
    linear_scaled_lr,
    load_solver,
)

BAD_CONFIGS = pathlib.Path(__file__).with_name("bad_configs")
NAN, INF = float("nan"), float("inf")


def _naming(*texts):
    """A ``match=`` pattern requiring every text, in any order, anywhere in the message."""
    return "".join(f"(?=[\\s\\S]*{re.escape(str(text))})" for text in texts)


def _raises(error, call, *texts):
    """``call()`` raises exactly ``error`` (not a subclass) and the message contains every text."""
    with pytest.raises(error, match=_naming(*texts)) as excinfo:
        call()
    assert type(excinfo.value) is error, f"{type(excinfo.value).__name__}: {excinfo.value}"
    return excinfo.value


def _case(solver, error, *texts, id, **kwargs):
    return pytest.param(solver, kwargs, error, texts, id=id)


# ---------------------------------------------------------------------------- the value table, key by key

# Values of the wrong type for a number, shared by every numeric key (bool is not a number; nor are str, complex,
# Decimal, bytes, containers, None). The message shows repr(value).
NOT_A_NUMBER = ["0.1", "", [0.1], (0.1,), {"value": 0.1}, None, True, False, 1j, b"0.1", Decimal("0.1"),
                np.array([0.1]), np.bool_(True)]
# ...and, for an int key, every float (integral or not, numpy or not, nan and inf too).
NOT_AN_INT = NOT_A_NUMBER + [100.0, 1.5, np.float64(100.0), np.float32(2.0), NAN, INF]

NUMBER_RANGES = {
    "> 0": [0, 0.0, -0.0, -1, -1e-3, NAN, INF, -INF, np.float64(-2.5)],
    ">= 0": [-1, -1e-4, -INF, NAN, INF, np.float32(-0.5)],
    "(0, 1]": [0, 0.0, -0.1, 1.0000001, 2, NAN, INF, -INF],
    "[0, 1]": [-0.1, -1e-9, 1.0000001, 2, NAN, INF, -INF],
    ">= 1": [0.999, 0, -1, NAN, INF, -INF],
}
INT_RANGES = {">= 1": [0, -1, -40000, np.int64(0)], ">= 0": [-1, -500, np.int64(-1)]}

NUMBER_KEYS = {"BASE_LR": "> 0", "GAMMA": "> 0", "LR_FACTOR": "> 0", "POWER": "> 0", "WEIGHT_DECAY": ">= 0",
               "WEIGHT_DECAY_GN": ">= 0",
               "WARM_UP_FACTOR": "(0, 1]", "MOMENTUM": "[0, 1]", "SCALE_MOMENTUM_THRESHOLD": ">= 1",
               "LOG_LR_CHANGE_THRESHOLD": ">= 1"}
INT_KEYS = {"MAX_ITER": ">= 1", "STEP_SIZE": ">= 1", "WARM_UP_ITERS": ">= 0", "REFERENCE_WORLD_SIZE": ">= 0",
            "ITER_SIZE": ">= 1"}
CHOICE_KEYS = {
    "LR_POLICY": ["cosine", "Step", "step ", "", "steps-with-decay", "multistep", "STEPS_WITH_DECAY", "warmup"],
    "WARM_UP_METHOD": ["gradual", "Linear", "", "exponential", "none"],
    # 'off' is a momentum-correction mode, but in a SOLVER it is spelled SCALE_MOMENTUM: False.
    "SCALE_MOMENTUM_MODE": ["always", "Threshold", "", "off", "every-change"],
}
NOT_A_STRING = [1, 0.5, None, True, ["step"], {"step": 1}, b"linear", np.int64(3)]
NOT_A_BOOL = [1, 0, 1.0, "True", "yes", "", None, [True], np.int64(1)]
NOT_A_LIST = ["0, 10", "", 10, 10.0, None, True, {0: 1}, {0, 10}, range(3), b"\x00\x0a", np.int64(10)]


def _shown(value):
    """How the message shows a value: ``repr``, with numpy scalars as their Python value (``int(value)!r`` etc.)."""
    return repr(value.item() if isinstance(value, np.number) else value)


def _key_cases():
    for key, bound in NUMBER_KEYS.items():
        for value in NOT_A_NUMBER:
            # WARM_UP_FACTOR also takes the string 'horovod', so any other string is a ValueError.
            error = ValueError if key == "WARM_UP_FACTOR" and isinstance(value, str) else TypeError
            yield _case({key: value}, error, key, repr(value), id=f"{key}={value!r}")
        for value in NUMBER_RANGES[bound]:
            yield _case({key: value}, ValueError, f"{key} must be", bound, _shown(value), id=f"{key}={value!r}")
    for key, bound in INT_KEYS.items():
        for value in NOT_AN_INT:
            yield _case({key: value}, TypeError, f"{key} must be an int", repr(value), id=f"{key}={value!r}")
        for value in INT_RANGES[bound]:
            yield _case({key: value}, ValueError, f"{key} must be {bound}", _shown(value), id=f"{key}={value!r}")
    for key, unknown in CHOICE_KEYS.items():
        for value in NOT_A_STRING:
            yield _case({key: value}, TypeError, f"{key} must be a string", repr(value), id=f"{key}={value!r}")
        for value in unknown:
            yield _case({key: value}, ValueError, f"unknown {key} {value!r}; expected one of", id=f"{key}={value!r}")
    for value in NOT_A_BOOL:
        yield _case({"SCALE_MOMENTUM": value}, TypeError, "SCALE_MOMENTUM must be a bool", repr(value),
                    id=f"SCALE_MOMENTUM={value!r}")


def _list_cases():
    for key in ("STEPS", "LRS", "STEP_SIZES"):
        for value in NOT_A_LIST:
            yield _case({key: value}, TypeError, f"{key} must be a list", repr(value), id=f"{key}={value!r}")
    for key, low in (("STEPS", 0), ("STEP_SIZES", 1)):
        first = 10 if key == "STEP_SIZES" else 0  # a valid first entry, so the second one is what fails
        for bad in (1.5, 10.0, "10", None, True, [10], np.float64(10), 1j):
            entries = [first, bad]
            yield _case({key: entries}, TypeError, f"{key} must be a list of ints", repr(list(entries)),
                        id=f"{key}={entries!r}")
        for entries in ([0, -10], [-1], [10, low - 1], (5, -3)):
            yield _case({key: entries}, ValueError, f"{key} entries must be >= {low}", repr(list(entries)),
                        id=f"{key}={entries!r}")
    for entries in (["0.1"], [None], [True], [[0.1]], [1j], [0.1, Decimal("0.01")]):
        yield _case({"LRS": entries}, TypeError, "LRS must be a list of numbers", repr(entries),
                    id=f"LRS={entries!r}")
    for entries in ([0.1, 0], [-0.1], [NAN], [INF], [0.1, -INF], [0.0]):
        yield _case({"LRS": entries}, ValueError, "LRS entries must be finite and > 0", repr(entries),
                    id=f"LRS={entries!r}")

    # The rules between keys: STEPS for the step-list policies, LRS against STEPS, STEP_SIZES for its policy.
    for policy in ("steps_with_decay", "steps_with_lrs", "steps_with_relative_lrs"):
        lrs = {"LRS": []} if policy != "steps_with_decay" else {}
        yield _case({"LR_POLICY": policy, "STEPS": [], **lrs}, ValueError, "STEPS must be non-empty",
                    repr(policy), "got []", id=f"{policy}-STEPS=[]")
        yield _case({"LR_POLICY": policy, **lrs}, ValueError, "STEPS must be non-empty", repr(policy),
                    id=f"{policy}-STEPS-missing")
    increasing = "must be strictly increasing"
    for steps, rule in (([5, 10], "must start at 0"), ([1], "must start at 0"), ([0, 20, 10], increasing),
                        ([0, 10, 10], increasing), ([0, 0], increasing), ((0, 30, 20, 40), increasing)):
        yield _case({"LR_POLICY": "steps_with_decay", "STEPS": steps}, ValueError, f"STEPS {rule}",
                    repr(list(steps)), id=f"STEPS={steps!r}")
    yield _case({"STEPS": [3, 4]}, ValueError, "STEPS must start at 0", "[3, 4]", id="STEPS=[3, 4]-unused-by-step")
    for policy, steps, lrs in (("steps_with_lrs", [0, 10], [0.1]), ("steps_with_lrs", [0], []),
                               ("steps_with_lrs", [0], [0.1, 0.01]),
                               ("steps_with_relative_lrs", [0, 10], [1, 0.1, 0.01]),
                               ("steps_with_relative_lrs", [0, 10, 20], [1])):
        yield _case({"LR_POLICY": policy, "STEPS": steps, "LRS": lrs}, ValueError,
                    f"LRS must have one entry per STEPS entry ({len(steps)})", repr(policy),
                    repr([float(lr) for lr in lrs]), id=f"{policy}-STEPS={steps}-LRS={lrs}")
    yield _case({"LR_POLICY": "steps_with_lrs", "STEPS": [0, 10]}, ValueError, "LRS must have one entry per STEPS",
                "got []", id="steps_with_lrs-LRS-missing")
    yield _case({"LR_POLICY": "variable_stepsize", "STEP_SIZES": []}, ValueError, "STEP_SIZES must be non-empty",
                "'variable_stepsize'", "got []", id="variable_stepsize-STEP_SIZES=[]")
    # A GAMMA whose BASE_LR * GAMMA ** k overflows float64 for the policy's number of decays.
    for solver, decays in (({"GAMMA": 1e10, "STEP_SIZE": 10, "MAX_ITER": 400}, 40),
                           ({"GAMMA": 2.0, "LR_POLICY": "variable_stepsize", "STEP_SIZES": [1] * 1100}, 1100),
                           ({"GAMMA": 1e200, "LR_POLICY": "steps_with_decay", "STEPS": [0, 1, 2]}, 2)):
        yield _case(solver, ValueError, f"GAMMA {solver['GAMMA']!r} overflows", f"GAMMA ** {decays}",
                    id=f"GAMMA={solver['GAMMA']!r}-overflows-{decays}-decays")


SPE = 10  # steps_per_epoch for the epoch-key cases


def _epoch_cases():
    for key, bound in (("MAX_EPOCHS", "> 0"), ("STEP_SIZE_EPOCHS", "> 0"), ("WARM_UP_EPOCHS", ">= 0")):
        for value in NOT_A_NUMBER:
            yield _case({key: value}, TypeError, f"{key} must be a number", repr(value), id=f"{key}={value!r}",
                        steps_per_epoch=SPE)
        for value in ([0, -1e-3, NAN, INF, -INF] if bound == "> 0" else [-0.5, -INF, NAN, INF]):
            yield _case({key: value}, ValueError, f"{key} must be {bound}", repr(value), id=f"{key}={value!r}",
                        steps_per_epoch=SPE)
    for key, low in (("STEPS_EPOCHS", ">= 0"), ("STEP_SIZES_EPOCHS", "> 0")):
        for value in NOT_A_LIST:
            yield _case({key: value}, TypeError, f"{key} must be a list", repr(value), id=f"{key}={value!r}",
                        steps_per_epoch=SPE)
        for entry in ("8", None, True, [8], 1j):
            yield _case({key: [0, entry] if key == "STEPS_EPOCHS" else [entry]}, TypeError,
                        f"{key} must be a number", repr(entry), id=f"{key}-entry={entry!r}", steps_per_epoch=SPE)
        for entry in ([-1, NAN, INF] if low == ">= 0" else [0, -1, NAN, INF]):
            yield _case({key: [0, entry] if key == "STEPS_EPOCHS" else [entry]}, ValueError, f"{key} must be {low}",
                        repr(entry), id=f"{key}-entry={entry!r}", steps_per_epoch=SPE)
    steps_policy = {"LR_POLICY": "steps_with_decay"}
    for epochs in ([0.5, 8], [3]):
        yield _case({**steps_policy, "STEPS_EPOCHS": epochs}, ValueError, "STEPS_EPOCHS must start at 0",
                    repr(epochs), id=f"STEPS_EPOCHS={epochs}", steps_per_epoch=SPE)
    # Rules checked after the conversion name the converted key and, in the note, the epoch key and value.
    for epochs, steps, rule in (([0, 8, 4], [0, 80, 40], "STEPS must be strictly increasing"),
                                ([0, 8, 8], [0, 80, 80], "STEPS must be strictly increasing"),
                                ([0, 0.04], [0, 0], "STEPS must be strictly increasing"),
                                ([], [], "STEPS must be non-empty")):
        yield _case({**steps_policy, "STEPS_EPOCHS": epochs}, ValueError, rule, f"got {steps!r}",
                    f"converted from STEPS_EPOCHS={epochs!r} with steps_per_epoch={SPE}",
                    id=f"STEPS_EPOCHS={epochs}-converted", steps_per_epoch=SPE)
    yield _case({"STEP_SIZE_EPOCHS": 0.01}, ValueError, "STEP_SIZE must be >= 1, got 0",
                "converted from STEP_SIZE_EPOCHS=0.01", id="STEP_SIZE_EPOCHS=0.01-rounds-to-0", steps_per_epoch=SPE)
    yield _case({"STEP_SIZES_EPOCHS": [1, 0.04]}, ValueError, "STEP_SIZES entries must be >= 1, got [10, 0]",
                "converted from STEP_SIZES_EPOCHS=[1, 0.04]", id="STEP_SIZES_EPOCHS-rounds-to-0", steps_per_epoch=SPE)
    yield _case({"LR_POLICY": "variable_stepsize", "STEP_SIZES_EPOCHS": []}, ValueError,
                "STEP_SIZES must be non-empty", "converted from STEP_SIZES_EPOCHS=[]", id="STEP_SIZES_EPOCHS=[]",
                steps_per_epoch=SPE)
    for epoch_key in EPOCH_KEYS:
        value = [0, 1] if epoch_key == "STEPS_EPOCHS" else ([1] if epoch_key == "STEP_SIZES_EPOCHS" else 1)
        yield _case({"SOLVER": {epoch_key: value}}, ValueError, f"steps_per_epoch is required when {epoch_key}",
                    id=f"SOLVER-{epoch_key}-without-steps_per_epoch")


def _argument_cases():
    for value in (0, -1, np.int64(-3)):
        yield _case({"MAX_EPOCHS": 1}, ValueError, "steps_per_epoch must be >= 1", _shown(value),
                    id=f"steps_per_epoch={value!r}", steps_per_epoch=value)
    for value in (10.0, np.float64(10), "10", True, [10], 1j):
        yield _case({"MAX_EPOCHS": 1}, TypeError, "steps_per_epoch must be an int", repr(value),
                    id=f"steps_per_epoch={value!r}", steps_per_epoch=value)
    # steps_per_epoch is checked even when no epoch key needs it.
    yield _case({}, ValueError, "steps_per_epoch must be >= 1, got 0", id="steps_per_epoch=0-unused",
                steps_per_epoch=0)
    for value in (-2, np.int64(0)):
        yield _case({"REFERENCE_WORLD_SIZE": 8}, ValueError, "world_size must be >= 1", _shown(value),
                    id=f"world_size={value!r}", world_size=value)
    for value in (2.0, "4", True, [4], np.float32(8)):
        yield _case({"REFERENCE_WORLD_SIZE": 8}, TypeError, "world_size must be an int", repr(value),
                    id=f"world_size={value!r}", world_size=value)
    for solver in ({"REFERENCE_WORLD_SIZE": 1}, {"SOLVER": {"REFERENCE_WORLD_SIZE": 2}}):
        reference = solver.get("SOLVER", solver)["REFERENCE_WORLD_SIZE"]
        yield _case(solver, ValueError, f"REFERENCE_WORLD_SIZE={reference} requires the world_size argument",
                    id=f"REFERENCE_WORLD_SIZE={reference}-without-world_size")
    yield _case({"WARM_UP_FACTOR": "horovod", "REFERENCE_WORLD_SIZE": 2}, ValueError,
                "REFERENCE_WORLD_SIZE=2 requires the world_size argument",
                id="horovod-and-reference-without-world_size")
    # Linear scaling runs before Schedule, so it validates the keys it reads, naming them too.
    for key, value, error in (("BASE_LR", "0.1", TypeError), ("BASE_LR", 0, ValueError),
                              ("LRS", "0.1", TypeError), ("MAX_ITER", 9e4, TypeError), ("STEPS", [0, "8"], TypeError),
                              ("STEP_SIZE", -1, ValueError), ("WARM_UP_ITERS", None, TypeError),
                              ("STEP_SIZES", [1, -1], ValueError)):
        policy = {"LR_POLICY": "steps_with_lrs", "STEPS": [0, 8]} if key == "LRS" else {}
        yield _case({**policy, key: value, "REFERENCE_WORLD_SIZE": 1}, error, key, repr(value),
                    id=f"scaled-{key}={value!r}", world_size=2)
    # Values that become invalid only once scaled: named with the scaling note.
    yield _case({"MAX_ITER": 10, "REFERENCE_WORLD_SIZE": 1}, ValueError, "MAX_ITER must be >= 1, got 0",
                "world_size / REFERENCE_WORLD_SIZE = 64 / 1", id="scaled-MAX_ITER-rounds-to-0", world_size=64)
    yield _case({"LR_POLICY": "steps_with_lrs", "STEPS": [0, 8], "LRS": [1e308, 1.0], "REFERENCE_WORLD_SIZE": 1},
                ValueError, "LRS entries must be finite and > 0", "inf", "64 / 1", id="scaled-LRS-overflow",
                world_size=64)
    yield _case({"BASE_LR": 1e308, "REFERENCE_WORLD_SIZE": 1}, ValueError, "BASE_LR must be > 0, got inf",
                "64 / 1", id="scaled-BASE_LR-overflow", world_size=64)
    yield _case({"WARM_UP_FACTOR": "horovod", "REFERENCE_WORLD_SIZE": 4}, ValueError,
                "WARM_UP_FACTOR must be in (0, 1], got 2.0", "'horovod' = 4 / world_size 2",
                id="horovod-factor-above-1", world_size=2)
    # ITER_SIZE is read by both scaling rules, so it is checked before them, naming it and the value.
    for value, error in ((0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError), ("2", TypeError)):
        shown = f"got {value!r}" if error is ValueError else repr(value)
        yield _case({"ITER_SIZE": value, "REFERENCE_WORLD_SIZE": 1}, error, "ITER_SIZE must be", shown,
                    id=f"scaled-ITER_SIZE={value!r}", world_size=2)
        yield _case({"ITER_SIZE": value, "WARM_UP_FACTOR": "horovod"}, error, "ITER_SIZE must be", shown,
                    id=f"horovod-ITER_SIZE={value!r}", world_size=2)
    # The global batch counts the micro-batches: ranks x ITER_SIZE, in the value and in the note.
    yield _case({"MAX_ITER": 10, "ITER_SIZE": 4, "REFERENCE_WORLD_SIZE": 1}, ValueError,
                "MAX_ITER must be >= 1, got 0", "world_size x ITER_SIZE / REFERENCE_WORLD_SIZE = 16 x 4 / 1",
                id="scaled-by-ITER_SIZE-MAX_ITER-rounds-to-0", world_size=16)
    yield _case({"WARM_UP_FACTOR": "horovod", "REFERENCE_WORLD_SIZE": 8, "ITER_SIZE": 2}, ValueError,
                "WARM_UP_FACTOR must be in (0, 1], got 2.0", "'horovod' = 8 / (world_size 2 x ITER_SIZE 2)",
                id="horovod-ITER_SIZE-factor-above-1", world_size=2)


TYPOS = {
    "BASE_LRR": "BASE_LR", "BASE-LR": "BASE_LR", "LR_POLCY": "LR_POLICY", "GAMMMA": "GAMMA", "STEPSIZE": "STEP_SIZE",
    "MAXITER": "MAX_ITER", "WARM_UP_ITER": "WARM_UP_ITERS", "WARMUP_FACTOR": "WARM_UP_FACTOR",
    "WARMUP_METHOD": "WARM_UP_METHOD", "SCALE_MOMENTUMS": "SCALE_MOMENTUM",
    "SCALE_MOMENTUM_TRESHOLD": "SCALE_MOMENTUM_THRESHOLD", "SCALE_MOMENTUM_MOD": "SCALE_MOMENTUM_MODE",
    "LOG_LR_CHANGE_THRESHHOLD": "LOG_LR_CHANGE_THRESHOLD", "MOMENTUN": "MOMENTUM", "WEIGHTDECAY": "WEIGHT_DECAY",
    "LR_FACTORS": "LR_FACTOR", "STEPSIZES": "STEP_SIZES", "POWR": "POWER", "LRS_": "LRS",
    "REFERENCE_WORLDSIZE": "REFERENCE_WORLD_SIZE", "MAX_EPOCS": "MAX_EPOCHS", "STEP_SIZE_EPOCH": "STEP_SIZE_EPOCHS",
    "STEPS_EPOCH": "STEPS_EPOCHS", "WARMUP_EPOCHS": "WARM_UP_EPOCHS", "STEP_SIZES_EPOCH": "STEP_SIZES_EPOCHS",
}


def _key_name_cases():
    for typo, suggestion in TYPOS.items():
        yield _case({typo: 1}, ValueError, f"unknown SOLVER key {typo!r}; did you mean {suggestion!r}?",
                    id=f"typo-{typo}")
        yield _case({"SOLVER": {typo: 1}}, ValueError, f"unknown SOLVER key {typo!r}; did you mean {suggestion!r}?",
                    id=f"typo-in-SOLVER-{typo}")
    for unknown in ("FOO", "solver", "NUM_GPUS", "MODEL", ""):
        # Nothing close: the message lists the valid keys instead.
        yield _case({unknown: 1}, ValueError, f"unknown SOLVER key {unknown!r}; valid keys: [", "'BASE_LR'",
                    "'STEP_SIZES_EPOCHS'", id=f"unknown-{unknown or 'empty'}")
    yield _case({"SOLVER": {"SOLVER": {"BASE_LR": 0.1}}}, ValueError, "unknown SOLVER key 'SOLVER'; valid keys",
                id="SOLVER-inside-SOLVER")
    for key in [*SOLVER_KEYS, *EPOCH_KEYS]:
        lower = key.lower()
        yield _case({lower: SOLVER_KEYS.get(key, 1)}, ValueError, f"SOLVER key {lower!r} is not upper case",
                    f"did you mean {key!r}?", "Schedule.from_config", id=f"lower-case-{lower}")
    yield _case({"Base_Lr": 0.1}, ValueError, "SOLVER key 'Base_Lr' is not upper case; did you mean 'BASE_LR'?",
                id="mixed-case-Base_Lr")
    for key in (1, None, 1.5, ("BASE_LR",), b"BASE_LR", True):
        yield _case({key: 0.1}, TypeError, f"SOLVER keys must be strings, got {key!r}", id=f"key={key!r}")
        yield _case({"SOLVER": {"BASE_LR": 0.1, key: 0.1}}, TypeError, f"SOLVER keys must be strings, got {key!r}",
                    id=f"SOLVER-key={key!r}")


def _solver_argument_cases():
    # The message names the argument and the type received (the value can be a whole config).
    for solver in (3.5, None, True, [("BASE_LR", 0.1)], b"config.yaml", {"BASE_LR"}, (("BASE_LR", 0.1),)):
        yield _case(solver, TypeError, "solver must be a mapping of SOLVER keys or a YAML path",
                    f"got {type(solver).__name__}", id=f"solver={solver!r}")
    for section in (None, "steps", 3, ("BASE_LR", 0.1), [{"BASE_LR": 0.1}]):
        yield _case({"SOLVER": section}, TypeError, "the SOLVER section must be a mapping", f"got {section!r}",
                    id=f"SOLVER={section!r}")
    yield _case({"SOLVER": {}, "MAX_EPOCHS": 1, "BASE_LR": 0.1}, ValueError,
                "SOLVER keys ['BASE_LR', 'MAX_EPOCHS'] given next to a SOLVER section", id="keys-next-to-SOLVER")
    for epoch_key, iteration_key in EPOCH_KEYS.items():
        value = [0, 1] if epoch_key == "STEPS_EPOCHS" else ([1] if epoch_key == "STEP_SIZES_EPOCHS" else 1)
        yield _case({"SOLVER": {epoch_key: value, iteration_key: value}}, ValueError,
                    f"give either {iteration_key} or {epoch_key}, not both",
                    f"{iteration_key}={value!r}, {epoch_key}={value!r}", id=f"SOLVER-{iteration_key}-and-{epoch_key}",
                    steps_per_epoch=SPE)


CASES = [*_key_cases(), *_list_cases(), *_epoch_cases(), *_argument_cases(), *_key_name_cases(),
         *_solver_argument_cases()]


@pytest.mark.parametrize("solver, kwargs, error, texts", CASES)
def test_invalid_config_names_key_and_value(solver, kwargs, error, texts):
    _raises(error, lambda: from_detectron(solver, **kwargs), *texts)


def test_every_key_is_in_the_table():
    assert {*NUMBER_KEYS, *INT_KEYS, *CHOICE_KEYS, "SCALE_MOMENTUM", "STEPS", "LRS", "STEP_SIZES"} == set(SOLVER_KEYS)
    swept = {key for param in CASES if isinstance(param.values[0], dict) for key in param.values[0]}
    assert {*SOLVER_KEYS, *EPOCH_KEYS} <= swept


def test_the_caller_mapping_is_untouched_by_a_failure():
    section = {"LR_POLICY": "steps_with_decay", "STEPS_EPOCHS": [0, 8, 4], "MAX_EPOCHS": 12}
    solver = {"SOLVER": section}
    with pytest.raises(ValueError):
        from_detectron(solver, steps_per_epoch=SPE)
    assert solver == {"SOLVER": {"LR_POLICY": "steps_with_decay", "STEPS_EPOCHS": [0, 8, 4], "MAX_EPOCHS": 12}}


# ---------------------------------------------------------------------------- YAML files

# One invalid file per case in tests/unit/bad_configs/: (error, texts the message must contain). "{path}" stands
# for the file's path: file-level errors name the file (and the line for malformed YAML); value errors name the key.
YAML_CASES = {
    "unclosed_bracket.yaml": (ValueError, "malformed YAML in {path}, line 6, column", "expected ',' or ']'"),
    "bad_indentation.yaml": (ValueError, "malformed YAML in {path}, line 4, column 13",
                             "mapping values are not allowed here"),
    "tab_indentation.yaml": (ValueError, "malformed YAML in {path}, line 3, column 1", "'\\t'"),
    "unclosed_quote.yaml": (ValueError, "malformed YAML in {path}, line 5", "end of stream"),
    "missing_colon.yaml": (ValueError, "malformed YAML in {path}, line 4"),
    "two_documents.yaml": (ValueError, "malformed YAML in {path}, line 4", "another document"),
    "not_utf8.yaml": (ValueError, "{path}: not UTF-8 text"),
    "top_level_list.yaml": (ValueError, "{path}: expected a mapping at the top level, got list"),
    "top_level_scalar.yaml": (ValueError, "{path}: expected a mapping at the top level, got str"),
    "solver_is_list.yaml": (ValueError, "{path}: the SOLVER section must be a mapping",
                            "got [{'BASE_LR': 0.02}, {'MAX_ITER': 90000}]"),
    "solver_is_scalar.yaml": (ValueError, "{path}: the SOLVER section must be a mapping, got 'steps_with_decay'"),
    "base_lr_words.yaml": (TypeError, "BASE_LR must be a number, got 'zero point two'"),
    "null_value.yaml": (TypeError, "BASE_LR must be a number, got None"),
    "steps_tuple_unclosed.yaml": (TypeError, "STEPS must be a list, got '(0, 60000'"),
    "max_iter_float.yaml": (TypeError, "MAX_ITER must be an int, got 90000.0"),
    "momentum_yes.yaml": (TypeError, "MOMENTUM must be a number, got True"),
    "scale_momentum_int.yaml": (TypeError, "SCALE_MOMENTUM must be a bool, got 1"),
    "steps_unsorted.yaml": (ValueError, "STEPS must be strictly increasing, got [0, 80000, 60000]"),
    "steps_not_from_zero.yaml": (ValueError, "STEPS must start at 0, got [60000, 80000]"),
    "lrs_length_mismatch.yaml": (ValueError, "LRS must have one entry per STEPS entry (2)", "got [0.02]"),
    "typo_key.yaml": (ValueError, "unknown SOLVER key 'WARMUP_ITERS'; did you mean 'WARM_UP_ITERS'?"),
    "lower_case_key.yaml": (ValueError, "SOLVER key 'base_lr' is not upper case; did you mean 'BASE_LR'?"),
    "unknown_policy.yaml": (ValueError, "unknown LR_POLICY 'multistep'"),
    "warm_up_factor_above_one.yaml": (ValueError, "WARM_UP_FACTOR must be in (0, 1], got 3"),
    "epochs_without_steps_per_epoch.yaml": (ValueError, "steps_per_epoch is required when MAX_EPOCHS is given"),
    "reference_world_size_without_world_size.yaml": (ValueError,
                                                     "REFERENCE_WORLD_SIZE=8 requires the world_size argument"),
    "nested_solver.yaml": (ValueError, "unknown SOLVER key 'SOLVER'; valid keys"),
    "key_not_string.yaml": (TypeError, "SOLVER keys must be strings, got 1"),
    "both_units.yaml": (ValueError, "give either MAX_ITER or MAX_EPOCHS, not both", "MAX_ITER=90000, MAX_EPOCHS=12"),
    "iter_size_zero.yaml": (ValueError, "ITER_SIZE must be >= 1, got 0"),
    "iter_size_float.yaml": (TypeError, "ITER_SIZE must be an int, got 2.0 (float)"),
}


def test_every_bad_config_file_has_a_case():
    assert sorted(path.name for path in BAD_CONFIGS.iterdir()) == sorted(YAML_CASES)


@pytest.mark.parametrize("name", sorted(YAML_CASES))
@pytest.mark.parametrize("as_path", [False, True], ids=["str", "Path"])
def test_invalid_yaml_file(name, as_path):
    path = BAD_CONFIGS / name
    error, *texts = YAML_CASES[name]
    _raises(error, lambda: from_detectron(path if as_path else str(path)),
            *(text.replace("{path}", str(path)) for text in texts))


@pytest.mark.parametrize("name", [name for name, (error, *texts) in YAML_CASES.items()
                                  if any("{path}" in text for text in texts)])
def test_load_solver_alone_rejects_the_malformed_files(name):
    path = BAD_CONFIGS / name
    error, *texts = YAML_CASES[name]
    _raises(error, lambda: load_solver(path), *(text.replace("{path}", str(path)) for text in texts))


@pytest.mark.parametrize("name", ["nope.yaml", "no/such/dir/config.yaml"])
def test_missing_yaml_file_names_the_path(tmp_path, name):
    # FileNotFoundError is neither ValueError nor TypeError, but it is what open() raises and from_detectron's
    # docstring documents it ("Raises: FileNotFoundError: for a missing YAML file"); the message names the path.
    missing = tmp_path / name
    for solver in (missing, str(missing)):
        error = _raises(FileNotFoundError, lambda: from_detectron(solver), "Detectron config file not found",
                        repr(str(missing)))
        assert error.errno == 2 and error.filename == str(missing)


def test_empty_yaml_files_are_detectrons_defaults(tmp_path):
    # Not an error, by design (load_solver's docstring): an empty file, a comment-only file and an empty SOLVER
    # section all leave every key at its default, as merging an empty YAML into Detectron's config does.
    for name, text in (("empty.yaml", ""), ("comments.yaml", "# nothing\n"), ("bare.yaml", "SOLVER:\n")):
        path = tmp_path / name
        path.write_text(text)
        assert from_detectron(path) == Schedule()


# ---------------------------------------------------------------------------- Fixed bugs (regressions)

def _sample_iterations(schedule):
    """0, 1, MAX_ITER - 1, MAX_ITER, hold_iter and the first steps: enough to evaluate a huge schedule."""
    points = {0, 1, schedule.max_iter - 1, schedule.max_iter, schedule.hold_iter, *schedule.steps[:8]}
    return sorted(point for point in points if point >= 0)


def _assert_rejected_naming_or_sound(build, *texts):
    """Either ``build()`` raises ValueError/TypeError naming every text, or the schedule it returns is sound: its
    float32 LR is finite everywhere and > 0 before MAX_ITER (cosine_decay and poly are exactly 0 at MAX_ITER), and
    its momentum corrections are finite and > 0. Any other exception fails."""
    try:
        schedule = build()
    except (ValueError, TypeError) as error:
        missing = [text for text in texts if str(text) not in str(error)]
        assert not missing, f"{type(error).__name__} {error!s} does not name {missing}"
        return
    with np.errstate(all="ignore"):
        if schedule.max_iter <= 10**5:
            lrs = schedule.lr_at(np.arange(schedule.max_iter + 1))
            iterations = range(schedule.max_iter + 1)
        else:
            iterations = _sample_iterations(schedule)
            lrs = np.array([schedule.lr_at(it) for it in iterations])
        assert np.isfinite(lrs).all(), f"lr_at is not finite at {np.flatnonzero(~np.isfinite(lrs))[:5]}"
        before_end = [lr for it, lr in zip(iterations, lrs) if it < schedule.max_iter]
        assert min(before_end) > 0, f"lr_at is 0 before MAX_ITER for {schedule!r}"
        for it, factor in schedule.momentum_corrections(min(schedule.max_iter, 10**5)):
            assert math.isfinite(factor) and factor > 0, f"momentum correction {factor} at {it}"


# Huge Python ints used to pass the int checks (no upper bound), then overflow float64 / int64 later.
HUGE = 10**400


@pytest.mark.parametrize("solver, kwargs, key", [
    pytest.param({"BASE_LR": HUGE}, {}, "BASE_LR", id="BASE_LR=10**400-OverflowError-at-build"),
    pytest.param({"MOMENTUM": HUGE}, {}, "MOMENTUM", id="MOMENTUM=10**400-OverflowError-at-build"),
    pytest.param({"LRS": [HUGE]}, {}, "LRS", id="LRS=[10**400]-OverflowError-at-build"),
    pytest.param({"LR_POLICY": "cosine_decay", "MAX_ITER": HUGE}, {}, "MAX_ITER",
                 id="cosine-MAX_ITER=10**400-OverflowError-in-lr_at"),
    pytest.param({"LR_POLICY": "exp_decay", "MAX_ITER": 2**64}, {}, "MAX_ITER",
                 id="exp_decay-MAX_ITER=2**64-unnamed-TypeError-in-lr_at"),
    pytest.param({"STEP_SIZE": HUGE}, {}, "STEP_SIZE", id="STEP_SIZE=10**400-IndexError-in-lr_at"),
    pytest.param({"WARM_UP_ITERS": HUGE}, {}, "WARM_UP_ITERS", id="WARM_UP_ITERS=10**400-OverflowError-in-lr_at"),
    pytest.param({"LR_POLICY": "steps_with_decay", "STEPS": [0, 2**63]}, {}, "STEPS",
                 id="STEPS=[0, 2**63]-OverflowError-in-lr_at"),
    pytest.param({"LR_POLICY": "variable_stepsize", "STEP_SIZES": [2**62, 2**62]}, {}, "STEP_SIZES",
                 id="STEP_SIZES-sum-over-int64-OverflowError-in-lr_at"),
    pytest.param({"MAX_ITER": HUGE, "REFERENCE_WORLD_SIZE": 1}, {"world_size": 2}, "MAX_ITER",
                 id="scaled-MAX_ITER=10**400-OverflowError-at-build"),
    pytest.param({"REFERENCE_WORLD_SIZE": HUGE}, {"world_size": 2}, "REFERENCE_WORLD_SIZE",
                 id="REFERENCE_WORLD_SIZE=10**400-ZeroDivisionError-at-build"),
    pytest.param({"REFERENCE_WORLD_SIZE": 1}, {"world_size": HUGE}, "world_size",
                 id="world_size=10**400-OverflowError-at-build"),
    pytest.param({"MAX_EPOCHS": 1}, {"steps_per_epoch": HUGE}, "steps_per_epoch",
                 id="steps_per_epoch=10**400-OverflowError-at-build"),
    pytest.param({"MAX_EPOCHS": HUGE}, {"steps_per_epoch": 10}, "MAX_EPOCHS",
                 id="MAX_EPOCHS=10**400-OverflowError-at-build"),
])
def test_bug_huge_integers(solver, kwargs, key):
    _assert_rejected_naming_or_sound(lambda: from_detectron(solver, **kwargs), key)


@pytest.mark.parametrize("call, name", [
    pytest.param(lambda: linear_scaled_lr(0.1, HUGE), "world_size", id="linear_scaled_lr-world_size=10**400"),
    pytest.param(lambda: gradual_warmup_factor(1, HUGE), "reference_world_size",
                 id="gradual_warmup_factor-reference=10**400"),
])
def test_bug_huge_world_sizes_in_helpers(call, name):
    try:
        result = call()
    except (ValueError, TypeError) as error:
        assert name in str(error)
    else:
        assert math.isfinite(result) and result > 0


@pytest.mark.parametrize("solver, key", [
    pytest.param({"MAX_EPOCHS": 1e308}, "MAX_EPOCHS", id="MAX_EPOCHS=1e308"),
    pytest.param({"STEP_SIZE_EPOCHS": 1e308}, "STEP_SIZE_EPOCHS", id="STEP_SIZE_EPOCHS=1e308"),
    pytest.param({"WARM_UP_EPOCHS": 1e308}, "WARM_UP_EPOCHS", id="WARM_UP_EPOCHS=1e308"),
    pytest.param({"LR_POLICY": "steps_with_decay", "STEPS_EPOCHS": [0, 1e308]}, "STEPS_EPOCHS",
                 id="STEPS_EPOCHS=[0, 1e308]"),
    pytest.param({"LR_POLICY": "variable_stepsize", "STEP_SIZES_EPOCHS": [1e308]}, "STEP_SIZES_EPOCHS",
                 id="STEP_SIZES_EPOCHS=[1e308]"),
])
def test_bug_epoch_conversion_overflow(solver, key):
    _assert_rejected_naming_or_sound(lambda: from_detectron(solver, steps_per_epoch=10), key)


@pytest.mark.parametrize("solver, key", [
    pytest.param({"BASE_LR": 1e39, "MAX_ITER": 10}, "BASE_LR", id="BASE_LR=1e39-lr-inf"),
    pytest.param({"BASE_LR": 1e-46, "MAX_ITER": 10}, "BASE_LR", id="BASE_LR=1e-46-lr-0"),
    pytest.param({"LR_POLICY": "steps_with_lrs", "STEPS": [0], "LRS": [1e39], "MAX_ITER": 10}, "LRS",
                 id="LRS=[1e39]-lr-inf"),
    pytest.param({"LR_POLICY": "steps_with_lrs", "STEPS": [0, 5], "LRS": [1e-6, 1e38], "MAX_ITER": 10,
                  "WARM_UP_ITERS": 0}, "LRS", id="LRS=[1e-6, 1e38]-momentum-factor-inf"),
    pytest.param({"GAMMA": 1e300}, "GAMMA", id="default-step-GAMMA=1e300-lr-inf-after-30000"),
    pytest.param({"GAMMA": 10.0, "STEP_SIZE": 1, "MAX_ITER": 50}, "GAMMA", id="step-GAMMA=10-50-decays-lr-inf"),
    pytest.param({"GAMMA": 1e-10, "STEP_SIZE": 1, "MAX_ITER": 50}, "GAMMA", id="step-GAMMA=1e-10-lr-0"),
    pytest.param({"LR_POLICY": "exp_decay", "GAMMA": 1e300, "BASE_LR": 1e10, "MAX_ITER": 10}, "GAMMA",
                 id="exp_decay-GAMMA=1e300-lr-inf"),
    pytest.param({"LR_POLICY": "exp_decay", "GAMMA": 1e-300, "MAX_ITER": 10}, "GAMMA",
                 id="exp_decay-GAMMA=1e-300-lr-0"),
    pytest.param({"LR_POLICY": "poly", "POWER": 1e10, "MAX_ITER": 10}, "POWER", id="poly-POWER=1e10-lr-0"),
    pytest.param({"WARM_UP_FACTOR": 1e-300, "WARM_UP_METHOD": "constant", "MAX_ITER": 10}, "WARM_UP_FACTOR",
                 id="WARM_UP_FACTOR=1e-300-lr-0"),
])
def test_bug_lr_outside_float32(solver, key):
    _assert_rejected_naming_or_sound(lambda: from_detectron(solver), key)


def test_bug_linear_scaled_lr_overflow():
    try:
        result = linear_scaled_lr(1e308, 4)
    except ValueError as error:
        assert "BASE_LR" in str(error) or "base_lr" in str(error)
    else:
        assert math.isfinite(result)


@pytest.mark.parametrize("solver, kwargs, key", [
    pytest.param({"WARM_UP_FACTOR": np.array([0.1, 0.2])}, {}, "WARM_UP_FACTOR", id="WARM_UP_FACTOR=array"),
    pytest.param({"LR_POLICY": np.array(["step", "poly"]), "REFERENCE_WORLD_SIZE": 1}, {"world_size": 2},
                 "LR_POLICY", id="scaled-LR_POLICY=array"),
])
def test_bug_array_values(solver, kwargs, key):
    with pytest.raises((ValueError, TypeError), match=_naming(key, "array(")):
        from_detectron(solver, **kwargs)


@pytest.mark.parametrize("text", [
    pytest.param('SOLVER:\n  BASE_LR: "{[]: 1}"\n', id="unhashable-literal-TypeError"),
    pytest.param('SOLVER:\n  BASE_LR: "' + "-" * 5000 + '1"\n', id="deep-literal-RecursionError"),
    pytest.param("SOLVER:\n  BASE_LR: " + "9" * 5000 + "\n", id="5000-digit-int-ValueError-unnamed"),
])
def test_bug_yaml_values_that_break_decoding(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    try:
        from_detectron(path)
    except (ValueError, TypeError) as error:
        assert "BASE_LR" in str(error) or str(path) in str(error), f"{type(error).__name__}: {str(error)[:200]}"
    else:
        raise AssertionError("accepted")


def test_bug_directory_path(tmp_path):
    _raises(ValueError, lambda: from_detectron(os.fspath(tmp_path)), str(tmp_path))


def test_a_config_without_a_solver_section_uses_the_defaults_and_says_so():
    """Issue 11: Detectron's merge keeps every SOLVER default when the file has no SOLVER section (this file was
    read as a bare SOLVER mapping before, and rejected for 'MODEL')."""
    path = pathlib.Path(__file__).parents[1] / "fixtures" / "no_solver_section.yaml"
    with pytest.warns(UserWarning, match="no SOLVER section; the solver's defaults are used"):
        schedule = from_detectron(path)
    assert schedule == from_detectron({})
