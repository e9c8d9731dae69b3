"""Detectron's solver re-derived one iteration at a time, in plain Python: the LR and the momentum-correction walk.

Written from Detectron's ``detectron/utils/lr_policy.py`` (``get_lr_at_iter``, ``lr_func_*``, ``get_step_index``,
which appends MAX_ITER to STEPS and walks the list), video-nonlocal-net's ``lr_func_steps_with_relative_lrs`` and
the seed's ``add_variable_stepsize_lr`` (1-based iterations, ``math.pow``): one Python ``int`` at a time, Python
floats, ``np.float32`` at the end. The correction walk is ``DetectionModelHelper.UpdateWorkspaceLr`` /
``_SetNewLr`` / ``_get_lr_change_ratio`` (``detectron/modeling/detector.py``) from an LR blob of 0.0. Nothing
here imports hvd_sched. The only deliberate difference from Detectron is hvd_sched's "hold past MAX_ITER" for
the policies listed in ``HELD``.

``valid_solvers()`` draws SOLVER sections that must load (every policy, warmup method, correction mode and
threshold, in ordinary ranges), for the property tests that compare hvd_sched with this walk.
"""

import math

import numpy as np
from hypothesis import strategies as st

__all__ = ["HELD", "DETECTRON_DEFAULTS", "get_step_index", "reference_lr", "reference_lr64", "reference_walk",
           "walk_stop", "valid_solvers"]

HELD = {"step", "cosine_decay", "exp_decay", "poly"}
DETECTRON_DEFAULTS = {
    "BASE_LR": 0.001, "LR_POLICY": "step", "GAMMA": 0.1, "STEP_SIZE": 30000, "STEPS": [], "LRS": [],
    "MAX_ITER": 40000, "WARM_UP_ITERS": 500, "WARM_UP_FACTOR": 1.0 / 3.0, "WARM_UP_METHOD": "linear",
    "STEP_SIZES": [], "POWER": 1.0,
}


def get_step_index(cfg, cur_iter):
    steps = cfg["STEPS"] + [cfg["MAX_ITER"]]
    for ind, step in enumerate(steps):  # noqa: B007 - Detectron's loop, kept as written
        if cur_iter < step:
            break
    return ind - 1


def _policy_lr(cfg, cur_iter):
    policy = cfg["LR_POLICY"]
    if policy == "step":
        return cfg["BASE_LR"] * cfg["GAMMA"] ** (cur_iter // cfg["STEP_SIZE"])
    if policy == "steps_with_decay":
        return cfg["BASE_LR"] * cfg["GAMMA"] ** get_step_index(cfg, cur_iter)
    if policy == "steps_with_lrs":
        return cfg["LRS"][get_step_index(cfg, cur_iter)]
    if policy == "steps_with_relative_lrs":
        return cfg["LRS"][get_step_index(cfg, cur_iter)] * cfg["BASE_LR"]
    if policy == "cosine_decay":
        iter_frac = float(cur_iter) / cfg["MAX_ITER"]
        cos_frac = 0.5 * (np.cos(np.pi * iter_frac) + 1)
        return cfg["BASE_LR"] * cos_frac
    if policy == "exp_decay":
        iter_frac = float(cur_iter) / cfg["MAX_ITER"]
        exp_frac = np.exp(iter_frac * np.log(cfg["GAMMA"]))
        return cfg["BASE_LR"] * exp_frac
    if policy == "poly":
        return cfg["BASE_LR"] * (1.0 - float(cur_iter) / cfg["MAX_ITER"]) ** cfg["POWER"]
    # the seed's add_variable_stepsize_lr, 1-based curr_iter
    curr_iter, lr_iters = cur_iter + 1, []
    for size in cfg["STEP_SIZES"]:
        lr_iters.append(size + (lr_iters[-1] if lr_iters else 0))
    if curr_iter <= lr_iters[0]:
        gamma_pow = 0
    else:
        idx = 0
        while idx < len(lr_iters) and lr_iters[idx] < curr_iter:
            idx += 1
        gamma_pow = idx
    return cfg["BASE_LR"] * math.pow(cfg["GAMMA"], gamma_pow)


def reference_lr(solver, it):
    """Detectron's ``get_lr_at_iter(it)`` for ``solver`` (upper-case keys over Detectron's defaults)."""
    return np.float32(reference_lr64(solver, it))


def reference_lr64(solver, it):
    """``get_lr_at_iter`` before its final ``np.float32``: the float64 value, to pin the operation order."""
    cfg = {**DETECTRON_DEFAULTS, **solver}
    policy_it = min(it, cfg["MAX_ITER"]) if cfg["LR_POLICY"] in HELD else it
    lr = _policy_lr(cfg, policy_it)
    if it < cfg["WARM_UP_ITERS"]:
        method = cfg["WARM_UP_METHOD"]
        if method == "constant":
            warmup_factor = cfg["WARM_UP_FACTOR"]
        elif method == "linear":
            alpha = it / cfg["WARM_UP_ITERS"]
            warmup_factor = cfg["WARM_UP_FACTOR"] * (1 - alpha) + alpha
        else:
            raise KeyError(method)
        lr *= warmup_factor
    return lr


def reference_walk(solver, stop, mode="threshold", threshold=1.1):
    """``(lrs, corrections)`` of iterations ``0 .. stop - 1``: each iteration's float32 LR, and ``[(it, factor)]``
    where ``_SetNewLr`` multiplies the momentum by ``factor`` (float32 ``new / cur``) before the update of ``it``.

    ``mode``: ``'threshold'`` (Detectron), ``'every_change'`` (the seed's rule: any change, with Detectron's
    ``cur > 1e-7`` guard) or ``'off'`` (``SCALE_MOMENTUM: False``).
    """
    lrs, corrections = [], []
    cur = np.float32(0.0)  # the LR blob before iteration 0 (ConstantFill 0.0)
    for it in range(stop):
        new = reference_lr(solver, it)
        if cur != new:
            # _get_lr_change_ratio: np.max of (float32, 1e-10) is a float64 array, so the ratio is float64;
            # new == 0 (cosine and poly at MAX_ITER) divides by zero there: an infinite ratio.
            cur_eps = max(float(cur), 1e-10)
            ratio = max(float(new) / cur_eps, cur_eps / float(new) if float(new) else math.inf)
            # `cur_lr > 1e-7`: an np.float32 against a Python float compares in float64 (both scalars).
            fires = {"threshold": ratio > threshold, "every_change": True, "off": False}[mode]
            if float(cur) > 1e-7 and fires:
                corrections.append((it, float(np.float32(new) / np.float32(cur))))
        lrs.append(new)
        cur = new
    return np.array(lrs, dtype=np.float32), corrections


def walk_stop(solver):
    """An iteration past every change of ``solver``'s LR (MAX_ITER, the warmup, the STEPS, the STEP_SIZES), + 50."""
    cfg = {**DETECTRON_DEFAULTS, **solver}
    ends = [cfg["MAX_ITER"], cfg["WARM_UP_ITERS"], *cfg["STEPS"], sum(cfg["STEP_SIZES"])]
    return max(ends) + 50


# ---------------------------------------------------------------------------- valid configs

POLICIES = ("step", "steps_with_decay", "steps_with_lrs", "steps_with_relative_lrs", "cosine_decay", "exp_decay",
            "poly", "variable_stepsize")


@st.composite
def valid_solvers(draw, max_iter=3000):
    """``(solver, mode, threshold)``: a SOLVER section ``from_detectron`` must accept, and its correction rule.

    Ranges keep every float32 LR normal (no overflow, no subnormal): at most ~30 decays of GAMMA in [0.3, 1.5]
    (step), BASE_LR and LRS in [1e-4, 10], WARM_UP_FACTOR in [1e-3, 1], POWER in [0.1, 3].
    """
    policy = draw(st.sampled_from(POLICIES))
    n_iter = draw(st.integers(1, max_iter))
    solver = {"LR_POLICY": policy, "MAX_ITER": n_iter, "BASE_LR": draw(st.floats(1e-4, 10))}
    lr_values = st.floats(1e-4, 10)
    if policy == "step":
        solver["STEP_SIZE"] = draw(st.integers(max(1, n_iter // 30), n_iter + 100))
        solver["GAMMA"] = draw(st.floats(0.3, 1.5))
    elif policy in ("steps_with_decay", "steps_with_lrs", "steps_with_relative_lrs"):
        steps = [0, *sorted(draw(st.sets(st.integers(1, n_iter + 200), max_size=5)))]
        solver["STEPS"] = steps
        if policy == "steps_with_decay":
            solver["GAMMA"] = draw(st.floats(0.01, 2.0))
        else:
            solver["LRS"] = draw(st.lists(lr_values if policy == "steps_with_lrs" else st.floats(1e-3, 10),
                                          min_size=len(steps), max_size=len(steps)))
    elif policy == "exp_decay":
        solver["GAMMA"] = draw(st.floats(1e-6, 10))
    elif policy == "poly":
        solver["POWER"] = draw(st.one_of(st.just(1.0), st.floats(0.1, 3)))
    elif policy == "variable_stepsize":
        solver["STEP_SIZES"] = draw(st.lists(st.integers(1, n_iter), min_size=1, max_size=5))
        solver["GAMMA"] = draw(st.floats(0.01, 2.0))
    method = draw(st.sampled_from(["none", "constant", "linear"]))
    if method != "none":
        solver.update(WARM_UP_METHOD=method, WARM_UP_ITERS=draw(st.integers(0, n_iter + 500)),
                      WARM_UP_FACTOR=draw(st.one_of(st.just(1.0), st.floats(1e-3, 1.0))))
    else:
        solver["WARM_UP_ITERS"] = 0
    mode = draw(st.sampled_from(["threshold", "every_change", "off"]))
    threshold = draw(st.one_of(st.just(1.1), st.just(1.0), st.floats(1.0, 5.0)))
    if mode == "off":
        solver["SCALE_MOMENTUM"] = False
    else:
        solver.update(SCALE_MOMENTUM=True, SCALE_MOMENTUM_MODE=mode, SCALE_MOMENTUM_THRESHOLD=threshold)
    if mode != "threshold":
        threshold = 1.1
    return solver, mode, threshold
