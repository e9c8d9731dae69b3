"""Independent scalar re-derivations of the Detectron-family solvers, for checking hvd_sched's dialects.

Written from reading each repository's code (file and line references in ``docs/explanation/dialects.md``); nothing here
imports hvd_sched. Every function walks one iteration at a time with the repository's own operation order and
number types: Python floats where the repository computes in Python, ``np.float32`` where its LR blob or its
numpy arithmetic is float32.

Iteration convention: ``it`` is always the 0-based Keras iteration, equal to the repository's ``curr_iter``
(``cur_iter``) of ``for curr_iter in range(start, N)``. Where a repository passes another number to its LR
function (Large-Scale-VRD passes ``curr_iter + 1``) the offset is applied here, inside ``vrd_lr_at``.

A correction list holds ``(it, factor)``: before the update of iteration ``it`` the repository multiplies every
momentum buffer by ``factor`` (Caffe2's momentum holds ``lr * grad`` terms, see ``caffe2_momentum_sgd``).

NumPy semantics (video-nonlocal-net only): the repository ran under NumPy 1.x, where ``np.float32 * int`` and
``np.float32 * float`` promote to float64 (value-based casting, before NEP 50). ``numpy="legacy"`` (the default)
reproduces that; ``numpy="nep50"`` gives what the same source evaluates to under NumPy >= 2 (float32 throughout).
"""

import ast
import math

import numpy as np

__all__ = [
    "VRD_DEFAULTS", "VNL_DEFAULTS", "DETECTRON_DEFAULTS", "merge_solver", "vrd_solver", "vnl_solver",
    "vrd_lr_python", "vrd_lr_at", "vrd_corrections", "vnl_lr_func", "vnl_lr_at", "vnl_corrections",
    "detectron_lr_at", "detectron_walk", "caffe2_momentum_sgd", "param_rule",
]

#: Large-Scale-VRD ``lib/core/config_rel.py`` lines 346-367 (Python 2 ``b''`` strings written as ``str``).
VRD_DEFAULTS = {
    "NESTEROV": True, "BASE_LR": 0.1, "LR_FACTOR": 1.0, "STEP_SIZES": [150150, 150150, 150150],
    "NUM_ITERATIONS": 600600, "WEIGHT_DECAY": 0.0001, "WEIGHT_DECAY_BN": 0.0001, "MOMENTUM": 0.9,
    "LR_POLICY": "step", "LR_TYPE": "variable", "WARM_UP_ITERS": -1, "WARM_UP_LR": 1.0,
    "GRADUAL_INCREASE_LR": False, "GRADUAL_LR_STEP": 0.005, "GRADUAL_LR_START": 0.1, "SCALE_MOMENTUM": False,
    "GAMMA": 0.1, "WARM_UP_TYPE": "NA",
}

#: video-nonlocal-net ``lib/core/config.py`` lines 161-186. ``STEPS`` None is derived by ``vnl_solver``.
VNL_DEFAULTS = {
    "NESTEROV": True, "WEIGHT_DECAY": 0.0001, "WEIGHT_DECAY_BN": 0.0001, "MOMENTUM": 0.9,
    "LR_POLICY": "steps_with_relative_lrs", "BASE_LR": 0.1, "STEP_SIZES": [150150, 150150, 150150],
    "LRS": [1, 0.1, 0.01], "MAX_ITER": 500500, "STEPS": None, "GAMMA": 0.1, "SCALE_MOMENTUM": False,
    "WARMUP": {"WARMUP_ON": False, "WARMUP_START_LR": 0.1, "WARMUP_END_ITER": 5005 * 5},
}

#: Detectron ``detectron/core/config.py`` lines 573-646.
DETECTRON_DEFAULTS = {
    "BASE_LR": 0.001, "LR_POLICY": "step", "GAMMA": 0.1, "STEP_SIZE": 30000, "STEPS": [], "LRS": [],
    "MAX_ITER": 40000, "MOMENTUM": 0.9, "WEIGHT_DECAY": 0.0005, "WEIGHT_DECAY_GN": 0.0, "WARM_UP_ITERS": 500,
    "WARM_UP_FACTOR": 1.0 / 3.0, "WARM_UP_METHOD": "linear", "SCALE_MOMENTUM": True,
    "SCALE_MOMENTUM_THRESHOLD": 1.1, "LOG_LR_CHANGE_THRESHOLD": 1.1,
}


def merge_solver(solver, defaults):
    """A deep copy of ``defaults`` with ``solver`` merged in, checked as both repositories' ``merge_dicts`` does.

    Strings are decoded with ``ast.literal_eval`` where that succeeds, an unknown key raises ``KeyError`` and a
    value whose type differs from the default's (``int`` for a ``float`` default included; ``None`` allowed)
    raises ``ValueError``. Nested mappings (video-nonlocal-net's ``WARMUP``) are merged key by key.

    Args:
        solver: the SOLVER mapping of a YAML file (``None`` or missing: the defaults).
        defaults: one of the ``*_DEFAULTS`` dicts.

    Returns:
        A new dict.
    """
    merged = {key: dict(value) if isinstance(value, dict) else value for key, value in defaults.items()}
    for key, value in (solver or {}).items():
        if key not in merged:
            raise KeyError(f"Invalid key in config file: {key}")
        if isinstance(value, str):
            try:
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                pass
        if type(merged[key]) is not type(value) and value is not None:
            raise ValueError(f"Type mismatch ({type(merged[key])} vs. {type(value)}) for config key: {key}")
        merged[key] = merge_solver(value, merged[key]) if isinstance(value, dict) else value
    return merged


def _solver_section(document):
    return (document or {}).get("SOLVER") if "SOLVER" in (document or {}) else None


def vrd_solver(document):
    """Large-Scale-VRD's SOLVER for a whole YAML document (a mapping; no ``SOLVER`` section: the defaults)."""
    return merge_solver(_solver_section(document), VRD_DEFAULTS)


def vnl_solver(document):
    """video-nonlocal-net's SOLVER for a whole YAML document, with ``STEPS`` derived (``assert_and_infer_cfg``)."""
    cfg = merge_solver(_solver_section(document), VNL_DEFAULTS)
    if cfg["STEPS"] is None:
        steps = [0]
        for idx in range(len(cfg["STEP_SIZES"])):
            steps.append(cfg["STEP_SIZES"][idx] + steps[idx])
        cfg["STEPS"] = steps
    return cfg


# ------------------------------------------------------------------------------------------------------------ #
# Large-Scale-VRD: tools/train_net_rel.py + lib/modeling/model_builder_rel.py
# ------------------------------------------------------------------------------------------------------------ #

def _vrd_lr_iters(cfg):
    ends = []
    for idx, size in enumerate(int(step) for step in cfg["STEP_SIZES"]):
        ends.append(size + ends[idx - 1] if idx > 0 else size)
    return ends


def vrd_lr_python(cfg, i):
    """``learning_rate`` of ``add_variable_stepsize_lr`` for the 1-based iteration ``i`` (a Python float).

    Step decay ``BASE_LR * math.pow(GAMMA, k)``, ``k`` the number of running sums of STEP_SIZES below ``i``,
    then ``check_and_apply_warmup``: the absolute WARM_UP_LR while ``i <= WARM_UP_ITERS``; with
    GRADUAL_INCREASE_LR a linear ramp that replaces (not multiplies) the step LR.
    """
    lr_iters = _vrd_lr_iters(cfg)
    if i <= lr_iters[0]:
        gamma_pow = 0
    else:
        gamma_pow = 0
        while gamma_pow < len(lr_iters) and lr_iters[gamma_pow] < i:
            gamma_pow += 1
    lr = cfg["BASE_LR"] * math.pow(cfg["GAMMA"], gamma_pow)
    warm, base, step = cfg["WARM_UP_ITERS"], cfg["BASE_LR"], cfg["GRADUAL_LR_STEP"]
    if i <= warm:
        lr = cfg["WARM_UP_LR"]
    elif warm > 0 and cfg["GRADUAL_INCREASE_LR"]:
        num_steps = int(math.ceil((base - cfg["WARM_UP_LR"]) / step))
        if i <= warm + num_steps:
            lr = min(base, cfg["WARM_UP_LR"] + (step * (i - warm)))
    elif cfg["GRADUAL_INCREASE_LR"]:
        num_steps = int(math.ceil((base - cfg["GRADUAL_LR_START"]) / step))
        if i <= num_steps:
            lr = min(base, cfg["GRADUAL_LR_START"] + (step * (i - 1)))
    return lr


def vrd_lr_at(cfg, it):
    """The float32 ``gpu_N/lr`` blob during 0-based iteration ``it`` (``curr_iter + 1`` passed, as the repo does)."""
    return np.float32(vrd_lr_python(cfg, it + 1))


def vrd_corrections(cfg, stop=None):
    """``[(it, factor)]``: Large-Scale-VRD's ``scale_momentum`` calls for iterations ``0 .. stop - 1``.

    Every change of the Python-float LR (exact ``!=``, no threshold, no guard) scales by ``new / prev``, a Python
    float from the unrounded LRs. Never at ``it = 0``; empty unless SCALE_MOMENTUM (default False).
    """
    stop = cfg["NUM_ITERATIONS"] if stop is None else stop
    out, current = [], None
    for it in range(stop):
        new = vrd_lr_python(cfg, it + 1)
        prev = new if it + 1 == 1 else current
        if cfg["SCALE_MOMENTUM"] and not new == prev:
            out.append((it, new / float(prev)))
        current = new
    return out


# ------------------------------------------------------------------------------------------------------------ #
# video-nonlocal-net: lib/utils/lr_policy.py + lib/models/model_builder_video.py + tools/train_net_video.py
# ------------------------------------------------------------------------------------------------------------ #

def _step_index(steps, max_iter, it):
    assert steps[0] == 0, "The first step should always start at 0."
    bounds = list(steps) + [max_iter]
    for ind, step in enumerate(bounds):
        if it < step:
            break
    return ind - 1


def vnl_lr_func(cfg, it):
    """``get_lr_func()(it)``: the policy LR before warmup (Python number; ``IndexError`` past the LRS list)."""
    policy = cfg["LR_POLICY"]
    if policy == "steps_with_lrs":
        return cfg["LRS"][_step_index(cfg["STEPS"], cfg["MAX_ITER"], it)]
    if policy == "steps_with_relative_lrs":
        return cfg["LRS"][_step_index(cfg["STEPS"], cfg["MAX_ITER"], it)] * cfg["BASE_LR"]
    if policy == "steps_with_decay":
        return cfg["BASE_LR"] * cfg["GAMMA"] ** _step_index(cfg["STEPS"], cfg["MAX_ITER"], it)
    if policy == "step":  # lr_func_step reads SOLVER.STEP_SIZE, which video-nonlocal-net's config lacks
        raise AttributeError("STEP_SIZE")
    raise NotImplementedError(f"Unknown LR policy: {policy}")


def vnl_lr_at(cfg, it, numpy="legacy"):
    """``get_lr_at_iter(it)`` (0-based ``it``), an ``np.float32``.

    With WARMUP_ON and ``it < WARMUP_END_ITER``: ``it * (lr_end - lr_start) / (WARMUP_END_ITER - 1) + lr_start``,
    ``lr_start = float32(WARMUP_START_LR)``, ``lr_end = float32(policy LR at WARMUP_END_ITER)``; the difference is
    float32, the rest float64 under NumPy 1.x (``numpy="legacy"``) or float32 (``"nep50"``).
    """
    lr = np.float32(vnl_lr_func(cfg, it))
    warmup = cfg["WARMUP"]
    last_it = warmup["WARMUP_END_ITER"]
    if warmup["WARMUP_ON"] and it < last_it:
        lr_start = np.float32(warmup["WARMUP_START_LR"])
        lr_end = np.float32(vnl_lr_func(cfg, last_it))
        diff = np.float32(lr_end - lr_start)
        with np.errstate(all="ignore"):
            if numpy == "legacy":
                lr = np.float64(it) * np.float64(diff) / np.float64(last_it - 1) + np.float64(lr_start)
            else:
                lr = np.float32(it) * diff / np.float32(last_it - 1) + lr_start
    return np.float32(lr)


def vnl_corrections(cfg, stop=None, numpy="legacy"):
    """``[(it, factor)]``: video-nonlocal-net's ``_CorrectMomentum`` calls for iterations ``0 .. stop - 1``.

    ``current_lr`` starts at ``get_lr_at_iter(0)`` (``SetCurrentLr(0)`` in the model's constructor, and the LR
    blob is filled with it), so iteration 0 never changes the LR. On a change ``_SetNewLr`` asserts
    ``current_lr > 0`` (``AssertionError`` here too), corrects by the float32 ``new / current`` when SCALE_MOMENTUM
    and ``abs(new - current) > abs(1e-7 * new)``, then sets ``current_lr = new`` whether or not it corrected.
    """
    stop = cfg["MAX_ITER"] if stop is None else stop
    out, current = [], vnl_lr_at(cfg, 0, numpy)
    for it in range(stop):
        new = vnl_lr_at(cfg, it, numpy)
        if new != current:
            assert current > 0
            delta = abs(np.float32(new - current))
            if numpy == "legacy":
                changed = float(delta) > abs(1e-7 * float(new))
            else:
                changed = delta > abs(np.float32(1e-7) * new)
            if cfg["SCALE_MOMENTUM"] and changed:
                out.append((it, np.float32(new / current)))
            current = new
    return out


# ------------------------------------------------------------------------------------------------------------ #
# Detectron: detectron/utils/lr_policy.py, detectron/utils/train.py, detectron/modeling/detector.py
# ------------------------------------------------------------------------------------------------------------ #

def detectron_lr_at(cfg, it):
    """``get_lr_at_iter(it)`` for the step policies and the warmup (0-based ``it``), an ``np.float32``."""
    policy = cfg["LR_POLICY"]
    if policy == "step":
        lr = cfg["BASE_LR"] * cfg["GAMMA"] ** (it // cfg["STEP_SIZE"])
    elif policy == "steps_with_decay":
        lr = cfg["BASE_LR"] * cfg["GAMMA"] ** _step_index(cfg["STEPS"], cfg["MAX_ITER"], it)
    elif policy == "steps_with_lrs":
        lr = cfg["LRS"][_step_index(cfg["STEPS"], cfg["MAX_ITER"], it)]
    else:
        raise NotImplementedError(policy)
    if it < cfg["WARM_UP_ITERS"]:
        if cfg["WARM_UP_METHOD"] == "constant":
            factor = cfg["WARM_UP_FACTOR"]
        else:
            alpha = it / cfg["WARM_UP_ITERS"]
            factor = cfg["WARM_UP_FACTOR"] * (1 - alpha) + alpha
        lr *= factor
    return np.float32(lr)


def detectron_walk(cfg, stop=None):
    """``(corrections, logged)``: ``UpdateWorkspaceLr`` from an LR blob of 0.0 (``optimizer.py`` ConstantFill).

    ``logged`` lists the iterations at which Detectron logs "Changing learning rate" (ratio above
    LOG_LR_CHANGE_THRESHOLD; always iteration 0 of a fresh run, since the blob holds 0.0).
    """
    stop = cfg["MAX_ITER"] if stop is None else stop
    corrections, logged, cur = [], [], np.float32(0.0)
    for it in range(stop):
        new = detectron_lr_at(cfg, it)
        if cur != new:
            ratio = np.max((new / np.max((cur, 1e-10)), cur / np.max((new, 1e-10))))
            if ratio > cfg["LOG_LR_CHANGE_THRESHOLD"]:
                logged.append(it)
            # float(cur): NumPy 1.x (Detectron's) compares the float32 blob with 1e-7 in float64.
            if cfg["SCALE_MOMENTUM"] and float(cur) > 1e-7 and ratio > cfg["SCALE_MOMENTUM_THRESHOLD"]:
                corrections.append((it, np.float32(new / cur)))
            cur = new
    return corrections, logged


# ------------------------------------------------------------------------------------------------------------ #
# The per-parameter update (Caffe2 WeightedSum / Scale, then MomentumSGDUpdate)
# ------------------------------------------------------------------------------------------------------------ #

def caffe2_momentum_sgd(grad, momentum_buf, lr, mu, nesterov):
    """``momentum_sgd_update`` (``caffe2/sgd/momentum_sgd_op.h``): returns ``(step, new_momentum)``; w -= step."""
    if not nesterov:
        new = lr * grad + mu * momentum_buf
        return new, new
    new = mu * momentum_buf + lr * grad
    return (1 + mu) * new - mu * momentum_buf, new


def param_rule(dialect, cfg, *, is_bias=False, is_gn=False, name=""):
    """``(grad_multiplier, weight_decay)`` a trainable parameter gets: ``grad = mult * grad + wd * w``.

    Args:
        dialect: ``"detectron"``, ``"large_scale_vrd"`` or ``"video_nonlocal"``.
        cfg: that dialect's merged SOLVER dict.
        is_bias: the parameter is in Caffe2's ``model.biases`` (tagged BIAS: conv/FC biases, GroupNorm and
            BatchNorm shifts, AffineChannel biases).
        is_gn: the parameter is in Detectron's ``model.gn_params`` (both GroupNorm scale and shift).
        name: the blob name (video-nonlocal-net decides by ``'_bn' in name``).
    """
    if dialect == "detectron":
        if is_bias:
            return 2.0, 0.0
        if is_gn:
            return 1.0, cfg["WEIGHT_DECAY_GN"]
        return 1.0, cfg["WEIGHT_DECAY"] if cfg["WEIGHT_DECAY"] > 0 else 0.0
    if dialect == "large_scale_vrd":  # optimizer_rel.py: WEIGHT_DECAY_BN is never read
        if is_bias:
            return 2.0, 0.0
        return 1.0, cfg["WEIGHT_DECAY"] if cfg["WEIGHT_DECAY"] > 0 else 0.0
    if dialect == "video_nonlocal":  # no bias rule: biases are decayed like weights, at 1x
        return 1.0, cfg["WEIGHT_DECAY_BN"] if "_bn" in name else cfg["WEIGHT_DECAY"]
    raise ValueError(dialect)
