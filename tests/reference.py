"""An independent numpy re-derivation of Detectron's training update, for checking the Keras glue.

Detectron (Caffe2) MomentumSGDUpdate keeps V := mu*V + lr*grad and applies w -= V (Nesterov:
w -= (1+mu)*V_new - mu*V_old); on a momentum correction it first scales V by new_lr/old_lr
(`DetectionModelHelper._CorrectMomentum`). A parameter with an LR multiplier uses lr * factor. The LR at each
iteration comes from a plain loop over Detectron's formulas written here, not from hvd_sched.

The model is the tests' MLP: Dense(hidden, tanh) -> Dense(out), Keras' mean squared error, written out by hand
(forward and backward) in float64.

`train_caffe2_sgd` is Detectron's whole per-parameter update (`add_single_gpu_param_update_ops`): for each
parameter, by its Caffe2 group, biases `grad *= 2` (no decay), GroupNorm scales `grad += WEIGHT_DECAY_GN * w`,
the rest `grad += WEIGHT_DECAY * w`, then MomentumSGDUpdate, in float64 numpy; the gradient at the reference's own
weights comes from any `grad_fn` (the conv model's from plain TensorFlow: `tape_grad_fn`, on an unscheduled model
whose weights are set to the reference's each step). The group is read from the variable name here (Caffe2 tags
every `*_b` shift of a conv / norm layer BIAS), independently of the Keras glue's layer-based rule.
"""

import math

import numpy as np

__all__ = ["detectron_lr", "detectron_corrections", "mlp_grads", "train_detectron_sgd", "caffe2_group",
           "caffe2_param_grads", "train_caffe2_sgd", "make_conv_model", "make_conv_data", "tape_grad_fn",
           "train_sgd_with_skips", "keras_loss_grad_fn", "sharded_grad_fn", "dynamic_scale_grad_fn",
           "momentum_step_residuals"]


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
    elif policy == "step":
        lr = solver["BASE_LR"] * solver["GAMMA"] ** (it // solver["STEP_SIZE"])
    elif policy == "exp_decay":
        # Detectron: GAMMA is the final/initial LR ratio.
        lr = solver["BASE_LR"] * np.exp(float(it) / solver["MAX_ITER"] * np.log(solver["GAMMA"]))
    elif policy == "poly":
        # mmcv / detectron2: BASE_LR * (1 - it / MAX_ITER) ** POWER (POWER 1.0 by default).
        lr = solver["BASE_LR"] * (1.0 - float(it) / solver["MAX_ITER"]) ** solver.get("POWER", 1.0)
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
            if float(cur) > 1e-7 and (every_change or ratio > threshold):  # float64, as NumPy 1.x
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


def _momentum_sgd(param, v_old, grad, lr, momentum, nesterov):
    """Caffe2's MomentumSGDUpdate for one parameter: V = mu*V + lr*g; w -= V (Nesterov: (1+mu)*V - mu*V_old)."""
    v_new = momentum * v_old + lr * grad
    step = (1 + momentum) * v_new - momentum * v_old if nesterov else v_new
    return param - step, v_new


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
            params[i], velocity[i] = _momentum_sgd(p, velocity[i], g, lr, momentum, nesterov)
    return params


def caffe2_group(name):
    """Detectron's branch for a parameter by its Keras variable name: "bias" (Caffe2's model.biases: every layer
    bias and every norm layer's shift `beta`, tagged BIAS), "gn" (a norm layer's scale `gamma`: model.gn_params),
    "weight" (the rest)."""
    leaf = name.split("/")[-1].split(":")[0]
    if leaf in ("bias", "beta"):
        return "bias"
    if leaf == "gamma":
        return "gn"
    return "weight"


def caffe2_param_grads(params, grads, groups, weight_decay, weight_decay_gn, bias_factor=2.0, bias_weight_decay=0.0):
    """The gradients after Detectron's per-parameter ops, before MomentumSGDUpdate.

    biases: `Scale(grad, 2.0)` (Detectron has no bias decay; a `bias_weight_decay` is added before the scale, as
    Caffe2's WeightDecayBuilder rewrites the gradient before the optimizer's LR multiplies it); GroupNorm scales:
    `WeightedSum([grad, ONE, param, WD_GN])`; others: `WeightedSum([grad, ONE, param, WD])`.
    """
    out = []
    for p, g, group in zip(params, grads, groups):
        if group == "bias":
            out.append((g + bias_weight_decay * p) * bias_factor)
        elif group == "gn":
            out.append(g + weight_decay_gn * p)
        else:
            out.append(g + weight_decay * p)
    return out


def train_caffe2_sgd(params, batches, lrs, corrections, momentum, grad_fn, groups, *, nesterov=False,
                     weight_decay=0.0, weight_decay_gn=0.0, bias_factor=2.0, bias_weight_decay=0.0):
    """Detectron's training loop with its per-parameter update, from `params` (copied, float64).

    Args:
        params: initial parameter arrays.
        batches: list of (x, y), one per iteration.
        lrs: the float32 LR of each iteration.
        corrections: {iteration: factor}; every V is scaled by it before that iteration's update.
        momentum: MOMENTUM.
        grad_fn: grad_fn(params, x, y) -> the loss gradients (list aligned with params).
        groups: `caffe2_group` of each parameter.
        nesterov: Caffe2's Nesterov MomentumSGDUpdate.
        weight_decay, weight_decay_gn, bias_factor, bias_weight_decay: see `caffe2_param_grads`.

    Returns:
        The final parameters (float64 arrays).
    """
    params = [np.array(p, dtype=np.float64) for p in params]
    velocity = [np.zeros_like(p) for p in params]
    for it, (x, y) in enumerate(batches):
        if it in corrections:
            velocity = [v * float(corrections[it]) for v in velocity]
        grads = [np.asarray(g, np.float64) for g in grad_fn(params, x, y)]
        grads = caffe2_param_grads(params, grads, groups, weight_decay, weight_decay_gn, bias_factor,
                                   bias_weight_decay)
        lr = float(np.float32(lrs[it]))
        for i, (p, g) in enumerate(zip(params, grads)):
            params[i], velocity[i] = _momentum_sgd(p, velocity[i], g, lr, momentum, nesterov)
    return params


def make_conv_model(seed=1, half_batch=None):
    """Conv2D(4, 3) -> GroupNormalization(2) -> tanh -> Conv2D(4, 3) -> BatchNormalization -> tanh -> Flatten ->
    Dense(3) on 6x6x2 inputs: Dense and Conv kernels, biases, a GroupNorm and a BatchNorm.

    With `half_batch`, BatchNormalization uses `virtual_batch_size=half_batch`: its statistics are those of each
    half of a batch, as on two Horovod ranks that each hold half, so one process on the full batch computes the
    same gradients. Keras' virtual batches are strided: virtual batch k holds rows k, k + B/V, k + 2B/V, ... of a
    batch of B (it reshapes to [V, B / V, ...]), and gamma and beta then have shape (1, 1, 1, 1, C). (Keras 2.15 cannot reload such a layer from `model.save`: its saved `axis` is off by one.)
    """
    import tensorflow as tf  # only the Keras and multi-rank tests build the model

    from stackutil import batch_normalization  # Keras 3 has no virtual_batch_size: the same statistics

    tf.keras.utils.set_random_seed(seed)
    layers = tf.keras.layers
    return tf.keras.Sequential([
        tf.keras.Input((6, 6, 2)), layers.Conv2D(4, 3), layers.GroupNormalization(2), layers.Activation("tanh"),
        layers.Conv2D(4, 3), batch_normalization(half_batch), layers.Activation("tanh"),
        layers.Flatten(), layers.Dense(3)])


def make_conv_data(n, seed=3):
    """Inputs (n, 6, 6, 2) and regression targets (n, 3), float32."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6, 6, 2)).astype(np.float32)
    y = np.tanh(x.reshape(n, -1)[:, :3] + x.reshape(n, -1)[:, 3:6]).astype(np.float32)
    return x, y


def tape_grad_fn(model):
    """grad_fn for `train_caffe2_sgd`: mse gradients of a plain (unscheduled) Keras `model` in training mode at the
    given weights (set into the model's trainable variables, cast to float32)."""
    import tensorflow as tf

    variables = model.trainable_variables

    def grad_fn(params, x, y):
        for var, value in zip(variables, params):
            var.assign(np.asarray(value, np.float32))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        return [g.numpy() for g in tape.gradient(loss, variables)]

    return grad_fn


def train_sgd_with_skips(params, batches, lrs, corrections, momentum, *, skipped=(), skip_advances_iteration=True,
                         nesterov=False, multipliers=None, grad_fn=None):
    """Detectron's MomentumSGD where some batches are SKIPPED (mixed precision: non-finite gradients).

    A skipped batch changes neither the parameters nor V. Keras 2's LossScaleOptimizer still advances the
    iteration on it (`skip_advances_iteration=True`), Keras 3's does not (the next batch runs at the same
    iteration, with that iteration's LR). Either way V must follow the LR of the step that is applied: before the
    update at iteration `it`, V is scaled by the product of the corrections due at every iteration after the last
    APPLIED one, up to `it` (each correction exactly once, none lost at a skipped iteration).

    Args:
        params: initial parameters (copied, float64).
        batches: list of (x, y), one per batch, in order (skipped ones included).
        lrs: the float32 LR of each iteration (at least as many as the iterations reached).
        corrections: {iteration: factor}.
        momentum: mu.
        skipped: the positions in `batches` whose step is skipped.
        skip_advances_iteration: whether a skipped batch advances the iteration counter.
        nesterov: Caffe2's Nesterov variant.
        multipliers: per-parameter LR factor (list aligned with params), default all 1.
        grad_fn: grad_fn(params, x, y) -> gradients; default `mlp_grads` in float64.

    Returns:
        (final parameters as float64 arrays, the iteration counter at the end).
    """
    params = [np.array(p, dtype=np.float64) for p in params]
    velocity = [np.zeros_like(p) for p in params]
    multipliers = multipliers or [1.0] * len(params)
    grad_fn = grad_fn or (lambda p, x, y: mlp_grads(p, x.astype(np.float64), y.astype(np.float64)))
    skipped = set(skipped)
    it, last_applied = 0, -1
    for position, (x, y) in enumerate(batches):
        if position in skipped:
            it += 1 if skip_advances_iteration else 0
            continue
        factor = 1.0
        for due, value in corrections.items():
            if last_applied < due <= it:
                factor *= float(value)
        velocity = [v * factor for v in velocity]
        grads = [np.asarray(g, np.float64) for g in grad_fn(params, x, y)]
        for i, (p, g) in enumerate(zip(params, grads)):
            lr = float(np.float32(lrs[it]) * np.float32(multipliers[i]))
            params[i], velocity[i] = _momentum_sgd(p, velocity[i], g, lr, momentum, nesterov)
        last_applied = it
        it += 1
    return params, it


def keras_loss_grad_fn(model, loss_scale=1.0):
    """grad_fn for the reference trainers: the gradients of a plain (unscheduled, compiled) Keras `model`'s own
    loss at the given weights, computed by TensorFlow under the dtype policy the model was built with.

    For mixed precision only the gradient comes from TensorFlow (float16 / bfloat16 forward and backward, as the
    scheduled model computes it); the update stays the reference's (float64 numpy). `loss_scale` multiplies the
    loss before the backward pass and divides the gradients after it, as Keras' LossScaleOptimizer does (a power
    of 2 changes no float16 mantissa, only keeps small gradients from underflowing to subnormals or zero).
    """
    import tensorflow as tf

    variables = model.trainable_variables

    @tf.function  # a graph, as Keras' train step (and one trace per batch shape instead of eager ops per batch)
    def gradients(x, y):
        with tf.GradientTape() as tape:
            pred = model(x, training=True)
            loss = model.compute_loss(x=x, y=y, y_pred=pred)
            scaled = loss * tf.cast(loss_scale, loss.dtype)
        grads = tape.gradient(scaled, variables)
        return [tf.cast(g, tf.float32) * np.float32(1.0 / loss_scale) for g in grads]

    def grad_fn(params, x, y):
        for var, value in zip(variables, params):
            var.assign(np.asarray(value, np.float32))
        grads = gradients(tf.constant(np.asarray(x, np.float32)), tf.constant(np.asarray(y, np.float32)))
        return [g.numpy() for g in grads]

    return grad_fn


def sharded_grad_fn(grad_fn, n):
    """The gradient n Horovod ranks average: rank r takes rows [r*B/n, (r+1)*B/n) of a batch of B (as
    `rankutil.shard_batches`), computes `grad_fn` on its part, and the n results are averaged."""

    def averaged(params, x, y):
        part = len(x) // n
        per_rank = [grad_fn(params, x[r * part:(r + 1) * part], y[r * part:(r + 1) * part]) for r in range(n)]
        return [np.mean([np.asarray(g[i], np.float64) for g in per_rank], axis=0) for i in range(len(per_rank[0]))]

    return averaged


def dynamic_scale_grad_fn(grad_fn_at_scale, initial_scale, skipped):
    """grad_fn for `train_sgd_with_skips` with Keras' dynamic loss scale: it starts at `initial_scale` and halves at
    every skipped step (no growth: Keras doubles it only after 2000 applied steps in a row).

    Args:
        grad_fn_at_scale: scale -> grad_fn (e.g. `lambda s: keras_loss_grad_fn(model, s)`).
        initial_scale: the scale of the first step.
        skipped: the skipped batch positions (as passed to `train_sgd_with_skips`).

    Returns:
        A grad_fn for ONE reference run: its k-th call is the k-th applied batch.
    """
    skipped = set(skipped)
    calls = {"n": 0}

    def grad_fn(params, x, y):
        applied, position = -1, -1
        while applied < calls["n"]:
            position += 1
            applied += position not in skipped
        calls["n"] += 1
        scale = initial_scale / 2.0 ** sum(1 for s in skipped if s < position)
        return grad_fn_at_scale(scale)(params, x, y)

    return grad_fn


def momentum_step_residuals(trajectory, batches, lrs, corrections, momentum, grad_fn, *, skipped=(),
                            skip_advances_iteration=True, multipliers=None, grad_transform=None):
    """One reference step from each recorded state of a run, against the run's next recorded weights.

    A trajectory in low precision cannot be followed step by step from the reference's own weights: a difference of
    one float32 rounding moves a weight across a float16 rounding boundary of the forward pass now and then, and
    the runs drift apart chaotically (up to ~2e-4 on the tests' MLP in 30 steps). Starting every step from the
    run's own weights removes that: the gradient (`grad_fn`, e.g. `keras_loss_grad_fn`) is the one the run saw, and
    what remains is this step's update, with this reference's LR and momentum correction, to float32 rounding.

    Plain momentum only (w -= V, V = mu*V + lr*g, no Nesterov): V before a step is recovered from the run itself,
    the weights before the last applied step minus those after it (0 before the first). A skipped batch (see
    `train_sgd_with_skips`) must leave the weights exactly as they were; the step applied after it scales V by
    every correction due since the last applied step.

    Args:
        trajectory: the run's weights before batch 0, then after each batch (len(batches) + 1 lists).
        batches, lrs, corrections, momentum, skipped, skip_advances_iteration, multipliers: as
            `train_sgd_with_skips`.
        grad_fn: grad_fn(params, x, y) -> gradients.
        grad_transform: optional (params, grads) -> grads applied before the update (e.g. Caffe2's weight decay,
            `caffe2_param_grads`).

    Returns:
        The max abs residual of each batch (0.0 for a skipped one left exactly in place).
    """
    skipped = set(skipped)
    states = [[np.asarray(w, np.float64) for w in weights] for weights in trajectory]
    multipliers = multipliers or [1.0] * len(states[0])
    residuals = []
    it, last_applied, velocity = 0, -1, [np.zeros_like(w) for w in states[0]]
    for position, (x, y) in enumerate(batches):
        before, after = states[position], states[position + 1]
        if position in skipped:
            residuals.append(max(float(np.abs(a - b).max()) for a, b in zip(after, before)))
            it += 1 if skip_advances_iteration else 0
            continue
        factor = 1.0
        for due, value in corrections.items():
            if last_applied < due <= it:
                factor *= float(value)
        grads = [np.asarray(g, np.float64) for g in grad_fn(trajectory[position], x, y)]
        if grad_transform is not None:
            grads = grad_transform(before, grads)
        step = []
        for i, (w, v, g) in enumerate(zip(before, velocity, grads)):
            lr = float(np.float32(lrs[it]) * np.float32(multipliers[i]))
            step.append(momentum * factor * v + lr * g)
        residuals.append(max(float(np.abs(w - s - a).max()) for w, s, a in zip(before, step, after)))
        velocity = [b - a for b, a in zip(before, after)]  # the run's own V after this step
        last_applied = it
        it += 1
    return residuals
