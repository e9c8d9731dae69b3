"""An independent numpy re-derivation of Detectron's training update, for checking the Keras glue.

Detectron (Caffe2) MomentumSGDUpdate keeps V := mu*V + lr*grad and applies w -= V (Nesterov:
w -= (1+mu)*V_new - mu*V_old); on a momentum correction it first scales V by new_lr/old_lr
(`DetectionModelHelper._CorrectMomentum`). A parameter with an LR multiplier uses lr * factor. The LR at each
iteration comes from a plain loop over Detectron's formulas written here, not from hvd_sched.

The model is the tests' MLP: Dense(hidden, tanh) -> Dense(out), Keras' mean squared error, written out by hand
(forward and backward) in float64.
"""

import math

import numpy as np

__all__ = ["detectron_lr", "detectron_corrections", "mlp_grads", "train_detectron_sgd"]


def detectron_lr(it, solver):
    """Detectron's get_lr_at_iter for the policies the Keras tests use (plain Python floats, then float32)."""
    policy = solver["LR_POLICY"]
    if policy == "steps_with_decay":
        steps = list(solver["STEPS"]) + [solver["MAX_ITER"]]
        for ind, step in enumerate(steps):
            if it < step:
                break
        ind = ind - 1
        lr = solver["BASE_LR"] * solver["GAMMA"] ** ind
    elif policy == "cosine_decay":
        lr = solver["BASE_LR"] * 0.5 * (math.cos(math.pi * it / solver["MAX_ITER"]) + 1.0)
    else:
        raise NotImplementedError(policy)
    if it < solver.get("WARM_UP_ITERS", 0):
        if solver["WARM_UP_METHOD"] == "constant":
            factor = solver["WARM_UP_FACTOR"]
        else:
            alpha = it / solver["WARM_UP_ITERS"]
            factor = solver["WARM_UP_FACTOR"] * (1 - alpha) + alpha
        lr *= factor
    return np.float32(lr)


def detectron_corrections(n_iters, solver, threshold=1.1, every_change=False):
    """{iteration: float32 factor} as Detectron's UpdateWorkspaceLr/_SetNewLr walk decides."""
    out = {}
    cur = np.float32(0.0)
    for it in range(n_iters):
        new = detectron_lr(it, solver)
        if cur != new:
            ratio = max(float(new) / max(float(cur), 1e-10), float(cur) / max(float(new), 1e-10))
            if cur > 1e-7 and (every_change or ratio > threshold):
                out[it] = np.float32(new / cur)
        cur = new
    return out


def mlp_grads(params, x, y):
    """Gradients of Keras' mse(y, W2 tanh(x W1 + b1) + b2) for params = [W1, b1, W2, b2]."""
    w1, b1, w2, b2 = params
    h_pre = x @ w1 + b1
    h = np.tanh(h_pre)
    pred = h @ w2 + b2
    d_pred = 2.0 * (pred - y) / (y.shape[0] * y.shape[1])
    g_w2 = h.T @ d_pred
    g_b2 = d_pred.sum(axis=0)
    d_h = (d_pred @ w2.T) * (1.0 - h ** 2)
    g_w1 = x.T @ d_h
    g_b1 = d_h.sum(axis=0)
    return [g_w1, g_b1, g_w2, g_b2]


def train_detectron_sgd(params, batches, lrs, corrections, momentum, nesterov=False, multipliers=None):
    """Run Detectron's MomentumSGD over `batches` ((x, y) per iteration) from `params`.

    Args:
        params: initial [W1, b1, W2, b2] (copied).
        batches: list of (x, y), one per iteration.
        lrs: the float32 LR of each iteration.
        corrections: {iteration: factor}; V is scaled by the factor before that iteration's update.
        momentum: mu.
        nesterov: Caffe2's Nesterov variant.
        multipliers: per-parameter LR factor (list aligned with params), default all 1.

    Returns:
        The final parameters (float64 arrays).
    """
    params = [np.array(p, dtype=np.float64) for p in params]
    velocity = [np.zeros_like(p) for p in params]
    multipliers = multipliers or [1.0] * len(params)
    for it, (x, y) in enumerate(batches):
        if it in corrections:
            velocity = [v * float(corrections[it]) for v in velocity]
        grads = mlp_grads(params, x.astype(np.float64), y.astype(np.float64))
        for i, (p, g) in enumerate(zip(params, grads)):
            lr = float(np.float32(lrs[it]) * np.float32(multipliers[i]))
            v_old = velocity[i]
            v_new = momentum * v_old + lr * g
            step = (1 + momentum) * v_new - momentum * v_old if nesterov else v_new
            params[i] = p - step
            velocity[i] = v_new
    return params
