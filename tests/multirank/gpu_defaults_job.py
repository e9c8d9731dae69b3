"""The GPU defaults (issue 19) on 2 Horovod ranks: `ranks` under horovodrun (each rank half of every global batch),
`single` in one process on the full batches, which also emits the numpy references (tests/reference.py) and
checks every step of the ranks' run (read from their rank0.json) against the reference's step.

Usage: gpu_defaults_job.py ranks | gpu_defaults_job.py single RANKS_RANK0_JSON. Phases, in this order:
1. `xla_step` (ranks only): `model.compile(..., jit_compile=True)` with DistributedOptimizer and horovod_callbacks()
   must stop on every rank with the ValueError naming jit_compile=False, before any weight changes (no hang). It
   runs before TensorFlow's op determinism is turned on, because Keras 3 silently compiles without XLA while it is.
2. `xla_update` (Keras 2 only): DistributedOptimizer(ScheduledOptimizer(SGD)) with `opt.jit_compile = True` on
   the optimizer Horovod rebuilt (a GPU's default): each variable's update inside `_update_step_xla`.
3. `mixed`: the mixed_float16 policy set before the optimizers are built; model.compile wraps in a
   LossScaleOptimizer (Keras 3: hvd_sched's DistributedOptimizer puts it inside itself); Keras 2 with the XLA
   update too.
4. `mixed_skip`: as 3, one epoch of 30 distinct batches, whose batch 10 overflows in rank 1's rows only.
"""

import json
import sys

import numpy as np
import tensorflow as tf

import hvd_sched
import hvd_sched.keras
import rankutil
from hvd_sched.keras import KERAS_MAJOR, ScheduledOptimizer, horovod_callbacks, scheduled_of
from reference import (caffe2_group, detectron_corrections, detectron_lr, dynamic_scale_grad_fn, keras_loss_grad_fn,
                       mlp_grads, momentum_step_residuals, sharded_grad_fn, train_caffe2_sgd, train_sgd_with_skips)

GLOBAL_BATCH, STEPS, EPOCHS = 16, 10, 3
N_ITERS = STEPS * EPOCHS
MU, WD, BIAS_WD, LOSS_SCALE = 0.9, 0.01, 1e-3, 2.0 ** 15
SOLVER = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 10, 20], "MAX_ITER": N_ITERS,
          "WARM_UP_ITERS": 5, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "constant"}
RULES = {"lr_multipliers": {"bias": 2.0}, "weight_decays": {"bias": BIAS_WD, "": WD}}
MIXED_RULES = {"lr_multipliers": {"bias": 2.0}}
BIAS_2X = [1.0, 2.0, 1.0, 2.0]
SKIPPED = 10  # the global batch of phase 4 that overflows: the 0.2 -> 0.02 correction's iteration
mode = sys.argv[1]
x, y = rankutil.make_regression(n=GLOBAL_BATCH * STEPS, seed=3)
# Phase 4's data: 30 distinct global batches; one target of 150 in rank 1's half of batch 10, so rank 1's float16
# backward pass overflows at the loss scale 2**15 (rank 0's does not). The LossScaleOptimizer decides on the averaged
# gradients, so both ranks must skip that step (a rank that skipped alone would leave the other in its allreduce).
xs, ys = rankutil.make_regression(n=GLOBAL_BATCH * N_ITERS, seed=3)
ys[SKIPPED * GLOBAL_BATCH + GLOBAL_BATCH // 2, 0] = 150.0
schedule = hvd_sched.from_detectron(SOLVER)
out = {}

if mode == "ranks":
    import horovod.tensorflow as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    shard = lambda a, b: rankutil.shard_batches(a, b, GLOBAL_BATCH, rank, size)  # noqa: E731
    batch = GLOBAL_BATCH // size
    wrap = hvd_sched.keras.DistributedOptimizer
else:
    rank, shard, batch, wrap = 0, lambda a, b: (a, b), GLOBAL_BATCH, lambda opt: opt


def scheduled(**rules):
    return ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=MU), schedule, **rules)


class BatchLog(tf.keras.callbacks.Callback):
    """The optimizer's iterations and the weights after every batch."""

    def on_train_begin(self, logs=None):
        self.iterations, self.weights = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.iterations.append(int(self.model.optimizer.iterations.numpy()))
        self.weights.append(self.model.get_weights())


def train(opt, jit_update, data, epochs=EPOCHS):
    model = rankutil.make_mlp(seed=1)
    initial = model.get_weights()
    if jit_update:
        opt.jit_compile = True  # on the optimizer Horovod rebuilt from the config, as a GPU would have it
    model.compile(opt, "mse")
    log = BatchLog()
    callbacks = [*horovod_callbacks(), log] if mode == "ranks" else [log]
    history = model.fit(*shard(*data), batch_size=batch, callbacks=callbacks, epochs=epochs, shuffle=False, verbose=0)
    scale = getattr(model.optimizer, "loss_scale" if KERAS_MAJOR == 2 else "dynamic_scale", None)
    return initial, {
        "weights": model.get_weights(), "initial": initial, "trajectory": [initial] + log.weights,
        "iterations": int(model.optimizer.iterations.numpy()), "iterations_after": log.iterations,
        "loss_scale": None if scale is None else float(np.asarray(scale)),
        "class": type(model.optimizer).__name__, "lr": history.history.get("learning_rate"),
        "traces": scheduled_of(model.optimizer)._update_step_xla.experimental_get_tracing_count() if jit_update else 0,
        "groups": [caffe2_group(v.name) for v in model.trainable_variables]}


def batches_of(a, b):
    n = len(a) // GLOBAL_BATCH
    return [(a[i * GLOBAL_BATCH:(i + 1) * GLOBAL_BATCH], b[i * GLOBAL_BATCH:(i + 1) * GLOBAL_BATCH]) for i in range(n)]


if mode == "ranks":
    model = rankutil.make_mlp(seed=1)
    before = model.get_weights()
    model.compile(wrap(scheduled(**MIXED_RULES)), "mse", jit_compile=True)
    try:
        model.fit(*shard(x, y), batch_size=batch, callbacks=horovod_callbacks(), epochs=EPOCHS, shuffle=False,
                  verbose=0)
        error = None
    except ValueError as exc:
        error = str(exc)
    out["xla_step"] = {"error": error, "jit_compile": model.jit_compile,
                       "unchanged": all(np.array_equal(a, b) for a, b in zip(before, model.get_weights())),
                       "iterations": int(model.optimizer.iterations.numpy())}

tf.config.experimental.enable_op_determinism()
batches = batches_of(x, y) * EPOCHS
lrs = [detectron_lr(it, SOLVER) for it in range(N_ITERS)]
corrections = detectron_corrections(N_ITERS, SOLVER)

if KERAS_MAJOR == 2:
    initial, out["xla_update"] = train(wrap(scheduled(**RULES)), True, (x, y))
    if mode == "single":
        out["xla_update"]["reference"] = train_caffe2_sgd(
            initial, batches, lrs, corrections, MU, lambda p, xb, yb: mlp_grads(p, xb.astype(float), yb.astype(float)),
            out["xla_update"]["groups"], weight_decay=WD, bias_weight_decay=BIAS_WD)

tf.keras.mixed_precision.set_global_policy("mixed_float16")
initial, out["mixed"] = train(wrap(scheduled(**MIXED_RULES)), KERAS_MAJOR == 2, (x, y))
initial_skip, out["mixed_skip"] = train(wrap(scheduled()), KERAS_MAJOR == 2, (xs, ys), epochs=1)

if mode == "single":
    plain = rankutil.make_mlp(seed=1)
    plain.compile(tf.keras.optimizers.SGD(), "mse")
    at_scale = {}

    def float16(ranks=1, skipped=()):
        """The float16 gradients (Keras' loss scale, halved at each skip), averaged over `ranks` halves."""
        def grad_fn_at(scale):
            if scale not in at_scale:
                at_scale[scale] = keras_loss_grad_fn(plain, scale)
            return sharded_grad_fn(at_scale[scale], ranks) if ranks > 1 else at_scale[scale]

        return dynamic_scale_grad_fn(grad_fn_at, LOSS_SCALE, skipped)

    with open(sys.argv[2]) as f:
        ranks_run = json.load(f)  # rank 0 of the `ranks` job (identical to rank 1: the test checks)
    run = lambda *args, **kwargs: train_sgd_with_skips(*args, **kwargs)[0]  # noqa: E731
    out["mixed"]["reference"] = {
        "full_batch": run(initial, batches, lrs, corrections, MU, multipliers=BIAS_2X, grad_fn=float16()),
        "two_ranks": run(initial, batches, lrs, corrections, MU, multipliers=BIAS_2X, grad_fn=float16(2)),
        "float64": run(initial, batches, lrs, corrections, MU, multipliers=BIAS_2X),
        "no_corrections": run(initial, batches, lrs, {}, MU, multipliers=BIAS_2X, grad_fn=float16(2))}
    out["mixed"]["residuals"] = {
        "single": momentum_step_residuals(out["mixed"]["trajectory"], batches, lrs, corrections, MU, float16(),
                                          multipliers=BIAS_2X),
        "ranks": momentum_step_residuals(ranks_run["mixed"]["trajectory"], batches, lrs, corrections, MU,
                                         float16(2), multipliers=BIAS_2X)}
    skip_batches = batches_of(xs, ys)
    skip = dict(skipped=[SKIPPED], skip_advances_iteration=KERAS_MAJOR == 2)
    lost = {k: v for k, v in corrections.items() if k != SKIPPED}
    out["mixed_skip"]["reference"] = {
        "full_batch": train_sgd_with_skips(initial_skip, skip_batches, lrs, corrections, MU,
                                           grad_fn=float16(1, [SKIPPED]), **skip),
        "two_ranks": train_sgd_with_skips(initial_skip, skip_batches, lrs, corrections, MU,
                                          grad_fn=float16(2, [SKIPPED]), **skip),
        "correction_lost": train_sgd_with_skips(initial_skip, skip_batches, lrs, lost, MU,
                                                grad_fn=float16(2, [SKIPPED]), **skip)}
    out["mixed_skip"]["residuals"] = {
        "single": momentum_step_residuals(out["mixed_skip"]["trajectory"], skip_batches, lrs, corrections, MU,
                                          float16(1, [SKIPPED]), **skip),
        "ranks": momentum_step_residuals(ranks_run["mixed_skip"]["trajectory"], skip_batches, lrs, corrections, MU,
                                         float16(2, [SKIPPED]), **skip)}
out["lr_expected"] = [schedule.lr_at((e + 1) * STEPS - 1) for e in range(EPOCHS)]
rankutil.emit(out, rank=rank)
