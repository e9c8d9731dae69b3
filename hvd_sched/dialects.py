"""The Detectron-family SOLVER dialects: each repository's keys, defaults and semantics -> `Schedule` arguments.

Data and translation, below `hvd_sched.config` (which reads it and never the other way): each dialect's keys
and defaults, the messages' key names, and `schedule_arguments`, which turns a SOLVER mapping into `Schedule`
arguments. `from_detectron(..., dialect=NAME)` reads a YAML of that family unchanged:

- `'detectron'` (the default): Detectron's `detectron/core/config.py` keys plus hvd_sched's additions
  (`SOLVER_KEYS`, `EPOCH_KEYS`; their units and linear scaling are converted by `hvd_sched.config`). The
  additions (REFERENCE_WORLD_SIZE, ITER_SIZE, the epoch keys, ...) belong to this dialect only: the others
  reject them, naming `dialect='detectron'`.
- `'large_scale_vrd'`: facebookresearch/Large-Scale-VRD (`lib/core/config_rel.py`; its training loop,
  `tools/train_net_rel.py`, only ever calls `add_variable_stepsize_lr(curr_iter + 1)`): NUM_ITERATIONS,
  STEP_SIZES stages, an absolute WARM_UP_LR while `i <= WARM_UP_ITERS`, an optional GRADUAL_INCREASE_LR ramp,
  SCALE_MOMENTUM defaulting to False and, when on, a correction at every change of the unrounded LR.
- `'video_nonlocal'`: facebookresearch/video-nonlocal-net (`lib/core/config.py`, `lib/utils/lr_policy.py`):
  STEPS derived from STEP_SIZES, a nested `WARMUP:` section (a linear ramp to the policy LR at
  WARMUP_END_ITER), NESTEROV on by default, SCALE_MOMENTUM False by default and, when on, a correction when
  `abs(new - cur) > abs(1e-7 * new)`.

The full spec, with file and line references, is `docs/explanation/dialects.md`. Keys a repository accepts but whose
value its training never reads are accepted and listed in `NO_EFFECT` (the reason is given there).
"""

import inspect
import re

from ._validation import MAX_INT, boolean, close_match_hint, int_list, integer, string
from .schedules import Schedule

__all__ = ["DIALECTS", "LABELS", "SOLVER_KEYS", "EPOCH_KEYS", "DEFAULTS", "NO_EFFECT", "foreign_key_hint", "rename",
           "schedule_arguments"]

DIALECTS = ("detectron", "large_scale_vrd", "video_nonlocal")
"""The dialect names `from_detectron` accepts."""

LABELS = {"detectron": "Detectron", "large_scale_vrd": "Large-Scale-VRD", "video_nonlocal": "video-nonlocal-net"}
"""Each dialect's repository, for messages."""

# Schedule arguments that only the other dialects set; not Detectron SOLVER keys.
_DIALECT_ARGUMENTS = ("dialect", "warm_up_lr", "gradual_increase_lr", "gradual_lr_step", "gradual_lr_start",
                      "nesterov", "weight_decay_bn")


def _detectron_defaults():
    parameters = inspect.signature(Schedule.__init__).parameters.values()
    return {
        parameter.name.upper(): list(parameter.default) if isinstance(parameter.default, tuple) else parameter.default
        for parameter in parameters
        if parameter.name != "self" and parameter.name not in _DIALECT_ARGUMENTS
    }


SOLVER_KEYS = {**_detectron_defaults(), "REFERENCE_WORLD_SIZE": 0}
"""Every Detectron SOLVER key in iterations, upper case, with its default: Detectron's, then hvd_sched's additions,
among them ITER_SIZE 1 (Caffe's `iter_size`: micro-batches per iteration) and REFERENCE_WORLD_SIZE 0 (their
meaning: `from_detectron`). `Schedule`'s signature is the one source of the defaults."""

EPOCH_KEYS = {
    "MAX_EPOCHS": "MAX_ITER",
    "STEP_SIZE_EPOCHS": "STEP_SIZE",
    "STEPS_EPOCHS": "STEPS",
    "WARM_UP_EPOCHS": "WARM_UP_ITERS",
    "STEP_SIZES_EPOCHS": "STEP_SIZES",
}
"""The epoch-valued keys (hvd_sched's, Detectron dialect) and the iteration key each one is converted to, with
`from_detectron`'s `steps_per_epoch`."""

#: The SOLVER keys and defaults of the two other dialects (Detectron's are `SOLVER_KEYS`).
DEFAULTS = {
    "large_scale_vrd": {
        "NESTEROV": True, "BASE_LR": 0.1, "LR_FACTOR": 1.0, "STEP_SIZES": [150150, 150150, 150150],
        "NUM_ITERATIONS": 600600, "WEIGHT_DECAY": 0.0001, "WEIGHT_DECAY_BN": 0.0001, "MOMENTUM": 0.9,
        "LR_POLICY": "step", "LR_TYPE": "variable", "WARM_UP_ITERS": -1, "WARM_UP_LR": 1.0,
        "GRADUAL_INCREASE_LR": False, "GRADUAL_LR_STEP": 0.005, "GRADUAL_LR_START": 0.1, "SCALE_MOMENTUM": False,
        "GAMMA": 0.1, "WARM_UP_TYPE": "NA",
    },
    "video_nonlocal": {
        "NESTEROV": True, "WEIGHT_DECAY": 0.0001, "WEIGHT_DECAY_BN": 0.0001, "MOMENTUM": 0.9,
        "LR_POLICY": "steps_with_relative_lrs", "BASE_LR": 0.1, "STEP_SIZES": [150150, 150150, 150150],
        "LRS": [1, 0.1, 0.01], "MAX_ITER": 500500, "GAMMA": 0.1, "SCALE_MOMENTUM": False,
        "WARMUP": {"WARMUP_ON": False, "WARMUP_START_LR": 0.1, "WARMUP_END_ITER": 5005 * 5},
    },
}

#: Keys a dialect accepts whose value its repository's training never reads, and why.
NO_EFFECT = {
    "large_scale_vrd": {
        "LR_POLICY": "the loop always calls add_variable_stepsize_lr (variable step sizes)",
        "LR_TYPE": "only the variable step sizes exist",
        "WARM_UP_TYPE": "only logged",
        "NESTEROV": "its MomentumSGDUpdate is built without nesterov (the update is plain momentum)",
        "WEIGHT_DECAY_BN": "its optimizer has no BN rule (BN/GN shifts are biases, scales get WEIGHT_DECAY)",
        "LR_FACTOR": "it only fills an lr_x blob that no op reads",
    },
    "video_nonlocal": {},
}

# Schedule messages name hvd_sched's keys; a dialect's user reads its own.
_RENAMES = {
    "large_scale_vrd": {"MAX_ITER": "NUM_ITERATIONS", "SCALE_MOMENTUM_MODE": "SCALE_MOMENTUM"},
    "video_nonlocal": {"WARM_UP_ITERS": "WARMUP.WARMUP_END_ITER", "WARM_UP_LR": "WARMUP.WARMUP_START_LR",
                       "SCALE_MOMENTUM_MODE": "SCALE_MOMENTUM"},
}
_WARMUP_KEYS = ("WARMUP_ON", "WARMUP_START_LR", "WARMUP_END_ITER")


def foreign_key_hint(key, dialect):
    """` (a Large-Scale-VRD key: pass dialect='large_scale_vrd')` for a key another dialect has, else ''."""
    owners = [name for name in DIALECTS if name != dialect and name in DEFAULTS and key in DEFAULTS[name]]
    if dialect != "detectron" and key in SOLVER_KEYS:
        owners.insert(0, "detectron")
    if not owners:
        return ""
    labels = " and ".join(LABELS[name] for name in owners)
    passes = " or ".join(f"dialect={name!r}" for name in owners)
    return f" (a {labels} key: pass {passes})"


def rename(message, dialect):
    """An hvd_sched error message in the dialect's key names."""
    for ours, theirs in _RENAMES.get(dialect, {}).items():
        message = re.sub(rf"\b{ours}\b", theirs, message)
    return message


def _check_known(section, dialect, close_matches):
    known = DEFAULTS[dialect]
    for key in section:
        if not isinstance(key, str):
            raise TypeError(f"SOLVER keys must be strings, got {key!r}")
        if key in known:
            continue
        if key == "STEPS" and dialect == "video_nonlocal":
            raise ValueError("SOLVER key 'STEPS' cannot be set in a video-nonlocal-net config (its default is None "
                             "and its loader rejects a list there); it is derived from STEP_SIZES")
        hint = foreign_key_hint(key, dialect) or close_matches(key, list(known))
        raise ValueError(f"unknown SOLVER key {key!r} for dialect {dialect!r}{hint}")
    warmup = section.get("WARMUP")
    if dialect == "video_nonlocal" and warmup is not None:
        if not isinstance(warmup, dict):
            raise TypeError(f"WARMUP must be a mapping of {list(_WARMUP_KEYS)}, got {warmup!r}")
        for key in warmup:
            if key not in _WARMUP_KEYS:
                raise ValueError(f"unknown SOLVER.WARMUP key {key!r}; expected one of {list(_WARMUP_KEYS)}")


def schedule_arguments(section, dialect, close_matches=close_match_hint):
    """`(Schedule keyword arguments, notes)` for a SOLVER mapping of the `'large_scale_vrd'` or
    `'video_nonlocal'` dialect, merged over that repository's defaults.

    Only what the translation itself reads is checked here (the flags, STEP_SIZES, the warmup length, and the keys
    `Schedule` never sees, such as LR_TYPE); `Schedule` validates the rest, and `rename` puts its message in
    the dialect's key names.

    Args:
        section: the SOLVER mapping (upper-case keys).
        dialect: `'large_scale_vrd'` or `'video_nonlocal'`.
        close_matches: `(key, valid keys) -> hint` for an unknown key (default: the closest valid key).

    Raises:
        ValueError / TypeError: an unknown key (naming the dialect that has it), a value of the wrong type.
    """
    _check_known(section, dialect, close_matches)
    solver = {**DEFAULTS[dialect], **section}
    notes = [f"{key} is accepted but has no effect in {LABELS[dialect]}: {why}"
             for key, why in NO_EFFECT[dialect].items() if key in section]
    common = {"base_lr": solver["BASE_LR"], "gamma": solver["GAMMA"], "momentum": solver["MOMENTUM"],
              "weight_decay": solver["WEIGHT_DECAY"], "weight_decay_bn": solver["WEIGHT_DECAY_BN"],
              "scale_momentum": boolean("SCALE_MOMENTUM", solver["SCALE_MOMENTUM"]), "dialect": dialect}
    if dialect == "large_scale_vrd":
        for key in ("LR_POLICY", "LR_TYPE", "WARM_UP_TYPE"):
            string(key, solver[key])
        boolean("NESTEROV", solver["NESTEROV"])
        warm_up_iters = integer("warm_up_iters", solver["WARM_UP_ITERS"], low=-MAX_INT)
        return {**common, "lr_policy": "variable_stepsize", "max_iter": solver["NUM_ITERATIONS"],
                "step_sizes": int_list("step_sizes", solver["STEP_SIZES"], low=1),
                "warm_up_iters": max(warm_up_iters, 0),  # i <= -1 and i <= 0 never hold for i >= 1
                "warm_up_lr": solver["WARM_UP_LR"], "gradual_increase_lr": solver["GRADUAL_INCREASE_LR"],
                "gradual_lr_step": solver["GRADUAL_LR_STEP"], "gradual_lr_start": solver["GRADUAL_LR_START"],
                "lr_factor": solver["LR_FACTOR"], "nesterov": False, "scale_momentum_mode": "any_change"}, notes
    warmup = {**DEFAULTS[dialect]["WARMUP"], **(solver["WARMUP"] or {})}
    step_sizes = int_list("step_sizes", solver["STEP_SIZES"], low=1)
    steps = [0]
    for size in step_sizes:  # assert_and_infer_cfg
        steps.append(steps[-1] + size)
    on = boolean("WARMUP.WARMUP_ON", warmup["WARMUP_ON"])
    end_iter = integer("warm_up_iters", warmup["WARMUP_END_ITER"], low=1, label="WARMUP.WARMUP_END_ITER")
    return {**common, "lr_policy": string("LR_POLICY", solver["LR_POLICY"]), "steps": steps,
            "lrs": solver["LRS"], "max_iter": solver["MAX_ITER"], "warm_up_iters": end_iter if on else 0,
            "warm_up_lr": warmup["WARMUP_START_LR"], "nesterov": boolean("NESTEROV", solver["NESTEROV"]),
            "scale_momentum_mode": "relative_change"}, notes
