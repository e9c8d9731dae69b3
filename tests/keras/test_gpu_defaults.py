"""What a GPU machine turns on by default, forced on the CPU without mocks (issue 19), against the numpy reference.

- Keras 2's per-variable XLA update: a TF 2.11+ optimizer with `jit_compile=True` (Keras sets it when a GPU is
  visible; here `opt.jit_compile = True` after construction, and after `DistributedOptimizer`, which rebuilds it
  from its config) runs each variable's `update_step` inside `_update_step_xla`, a nested
  `tf.function(jit_compile=True)`. Keras' legacy optimizers (OptimizerV2) have no such path: no `jit_compile`, no
  `_update_step_xla`; a GPU trains them as on the CPU. Keras 3 optimizers have no per-variable XLA either (only
  the whole step is compiled, or nothing).
- Whole-step XLA, `model.compile(..., jit_compile=True)`: works in one process without Horovod; with Horovod's
  collectives in the step it must stop with a clear error naming `jit_compile=False`.
- Mixed precision: `mixed_float16` (model.compile wraps the optimizer in a LossScaleOptimizer), a hand-built
  LossScaleOptimizer, a step skipped for non-finite gradients, and `mixed_bfloat16` (no loss scaling).

Tolerances. float32 runs: 1e-5 from the float64 numpy reference (tests/reference.py, as the other Keras tests)
and 1e-6 between the XLA and non-XLA runs. Mixed precision: the forward and backward passes run in float16
(bfloat16), which the float64 numpy reference cannot reproduce, so the gradients come from TensorFlow under the
same policy, with Keras' loss scale (`keras_loss_grad_fn`, an unscheduled model); every LR, correction and update
stays the numpy reference's. Three checks:
(1) every step from the run's own weights (`momentum_step_residuals`): 1e-6 (seen ~8e-8, float32 rounding): this
    is where a correction is exact or not, and a skipped batch must leave the weights bit for bit in place;
(2) the whole run against the reference started from the same weights: 1e-3 (seen 5e-8 to 2.3e-4): the
    reference's float64 update differs from Keras' float32 one by ~1e-7, and now and then such a difference moves
    a weight across a float16 rounding boundary of the forward pass, after which the two runs drift apart
    chaotically (tf2.20, cosine schedule: 4e-8 after step 4, 4e-6 after step 5, 2.3e-4 at the end, while every
    single step agrees to 8e-8);
(3) the float64 reference with float64 gradients: 5e-3 for float16 (seen 3e-4 to 7e-4: float16 keeps 11
    significant bits, every gradient is off by ~5e-4 relative), 2e-2 for bfloat16 (seen 3.5e-3 to 5e-3; 8 bits).
None of these bounds hides a correction: without the corrections the weights are 0.36 from the reference, and the
skipped-step tests check that a lost, doubled or misplaced correction (the other Keras major's iteration counting)
is farther than twice the bound of (2).
"""

import contextlib
import json
import math
import re

import numpy as np
import pytest
import tensorflow as tf

import hvd_sched
import hvd_sched.keras
from hvd_sched.keras import (KERAS_MAJOR, EpochCheckpoint, LearningRateLogger, NonFiniteLossError,
                             ScheduleCallback, ScheduledOptimizer, StopOnNonFinite, build_optimizer,
                             describe_optimizer, horovod_callbacks, latest_checkpoint, scheduled_of)
from rankutil import make_mlp, make_regression
from reference import (caffe2_group, caffe2_param_grads, detectron_corrections, detectron_lr, dynamic_scale_grad_fn,
                       keras_loss_grad_fn, mlp_grads, momentum_step_residuals, train_caffe2_sgd, train_sgd_with_skips)

BATCH, STEPS_PER_EPOCH, EPOCHS = 16, 10, 3
N_ITERS = STEPS_PER_EPOCH * EPOCHS
MU, WD, BIAS_WD = 0.9, 0.01, 1e-3
LOSS_SCALE = 2.0 ** 15  # Keras' initial dynamic loss scale
STEP_ATOL = 1e-6  # mixed precision: one reference step from the run's own weights (module docstring)
TRAJECTORY_ATOL = 1e-3  # mixed precision: the whole run vs the reference on low-precision gradients
# Corrections at 5 (x4), 10 (x0.1) and 20 (x0.1).
STEPS = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 10, 20], "MAX_ITER": N_ITERS,
         "WARM_UP_ITERS": 5, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "constant"}
# Every iteration changes the LR; the threshold rule corrects at 22 of them, every_change at 29.
COSINE = {"BASE_LR": 0.2, "LR_POLICY": "cosine_decay", "MAX_ITER": N_ITERS, "WARM_UP_ITERS": 8,
          "WARM_UP_FACTOR": 0.1, "WARM_UP_METHOD": "linear"}
BUILD_SOLVER = dict(STEPS, MOMENTUM=MU, WEIGHT_DECAY=WD)
# lr_multipliers and weight_decays of the per-variable cases: biases 2x LR with their own decay, the rest WD.
RULES = {"lr_multipliers": {"bias": 2.0}, "weight_decays": {"bias": BIAS_WD, "": WD}}
BIAS_2X = [1.0, 2.0, 1.0, 2.0]  # the reference's LR factors of [kernel, bias, kernel, bias] for {"bias": 2.0}

per_variable_xla = pytest.mark.skipif(
    KERAS_MAJOR == 3, reason="Keras 3 optimizers have no per-variable XLA update (no jit_compile attribute, no "
                             "_update_step_xla): only the whole step is XLA-compiled (tested below)")
legacy_only = pytest.mark.skipif(KERAS_MAJOR == 3, reason="Keras 3 has no tf.keras.optimizers.legacy")

DIFFS = {}  # comparison -> max abs difference, printed at the end (pytest -s) for the record


@pytest.fixture(scope="module", autouse=True)
def _print_diffs():
    yield
    for name in sorted(DIFFS):
        print(f"{name}: {DIFFS[name]:.3g}")


@contextlib.contextmanager
def _policy(name):
    """Keras' global dtype policy set to `name` for the block (the tests share one process)."""
    old = tf.keras.mixed_precision.global_policy()
    tf.keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        tf.keras.mixed_precision.set_global_policy(old)


@pytest.fixture
def mixed_float16():
    with _policy("mixed_float16"):
        yield


def _loss_scale_class():
    """Keras' LossScaleOptimizer class (Keras 2: tf.keras.mixed_precision's; Keras 3: keras.optimizers')."""
    if KERAS_MAJOR == 3:
        import keras

        return keras.optimizers.LossScaleOptimizer
    return tf.keras.mixed_precision.LossScaleOptimizer


def _max_diff(got, want):
    return max(float(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64)).max()) for g, w in zip(got, want))


def _check(name, got, want, atol):
    """got == want to `atol` (absolute); the difference is recorded under `name`."""
    diff = _max_diff(got, want)
    DIFFS[name] = max(diff, DIFFS.get(name, 0.0))
    assert diff <= atol, f"{name}: max abs difference {diff:.3g} > {atol:g}"
    return diff


def _far(name, got, want, at_least):
    """got differs from a WRONG alternative by more than `at_least` (the comparison above is not vacuous)."""
    diff = _max_diff(got, want)
    DIFFS[name] = diff
    assert diff > at_least, f"{name}: only {diff:.3g} from a wrong alternative; the test cannot tell them apart"


def _data(n_batches=STEPS_PER_EPOCH):
    return make_regression(n=BATCH * n_batches, seed=3)


def _batches(x, y, epochs=EPOCHS):
    n = len(x) // BATCH
    return [(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]) for i in range(n)] * epochs


def _grad64(params, x, y):
    return mlp_grads(params, x.astype(np.float64), y.astype(np.float64))


def _scheduled(solver, nesterov=False, **options):
    return ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=MU, nesterov=nesterov),
                              hvd_sched.from_detectron(solver), **options)


def _xla_update_traces(optimizer):
    """How often Keras 2 traced the per-variable XLA update (`Optimizer._update_step_xla`, a
    `tf.function(jit_compile=True)`): > 0 shows the XLA path ran, so an XLA/non-XLA comparison is not vacuous."""
    return scheduled_of(optimizer)._update_step_xla.experimental_get_tracing_count()


class _Run:
    def __init__(self, model, initial, history, batch_logs):
        self.model, self.initial, self.history, self.batch_logs = model, initial, history, batch_logs
        self.weights = model.get_weights()
        self.optimizer = model.optimizer
        self.iterations = int(model.optimizer.iterations.numpy())
        self.groups = [caffe2_group(v.name) for v in model.trainable_variables]
        self.trajectory = [initial] + [weights for _, _, weights in batch_logs]  # before batch 0, after each batch


class _BatchLog(tf.keras.callbacks.Callback):
    """(batch logs, optimizer iterations, weights) after every batch."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def on_train_batch_end(self, batch, logs=None):
        self.rows.append((dict(logs or {}), int(self.model.optimizer.iterations.numpy()), self.model.get_weights()))


def _fit(optimizer, *, jit_update=False, jit_step=False, callbacks=(), data=None, epochs=EPOCHS, model=None,
         initial_epoch=0):
    """Compile and fit the tests' MLP; `jit_update` forces Keras 2's per-variable XLA update (a GPU's default)."""
    model = model or make_mlp(seed=1)
    initial = [w.copy() for w in model.get_weights()]
    if jit_update:
        optimizer.jit_compile = True
    model.compile(optimizer, "mse", jit_compile=jit_step)
    x, y = data if data is not None else _data()
    log = _BatchLog()
    history = model.fit(x, y, batch_size=BATCH, epochs=epochs, initial_epoch=initial_epoch, shuffle=False,
                        verbose=0, callbacks=[*callbacks, log])
    return _Run(model, initial, history, log.rows)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """Runs shared by several tests (each XLA run compiles every variable's update once)."""
    return {"checkpoints": tmp_path_factory.mktemp("gpu_defaults_checkpoints")}


class _EarlyCheckpoint(EpochCheckpoint):
    """EpochCheckpoint of the first two epochs only: an uninterrupted run also leaves what a run stopped after
    epoch 1 would have left (`latest` -> epoch-0001, iteration 20), for the resume test."""

    def on_epoch_end(self, epoch, logs=None):
        if epoch < 2:
            super().on_epoch_end(epoch, logs)


def _checkpoints(cache, name):
    return _EarlyCheckpoint(str(cache["checkpoints"] / name))


def _cached(cache, key, make):
    if key not in cache:
        cache[key] = make()
    return cache[key]


# -- Keras 2's per-variable XLA update ---------------------------------------------------------------------------

MODES = ["threshold", "every_change", "off"]


RESUMED = (False, "threshold", True)  # the mode case whose first two epochs the resume test restarts from


def _mode_run(cache, nesterov, mode, jit):
    callbacks = [_checkpoints(cache, "xla")] if (nesterov, mode, jit) == RESUMED else []
    return _cached(cache, ("mode", nesterov, mode, jit), lambda: _fit(
        _scheduled(COSINE, nesterov, momentum_correction=mode, **RULES), jit_update=jit, callbacks=callbacks))


def _mode_reference(run, nesterov, mode):
    corrections = {} if mode == "off" else detectron_corrections(N_ITERS, COSINE, every_change=mode == "every_change")
    return train_caffe2_sgd(run.initial, _batches(*_data()), [detectron_lr(it, COSINE) for it in range(N_ITERS)],
                            corrections, MU, _grad64, run.groups, nesterov=nesterov, weight_decay=WD,
                            bias_weight_decay=BIAS_WD)


def test_the_correction_modes_differ_on_the_cosine_schedule():
    """Guard: threshold, every_change and off must give different corrections, or the mode cases test one thing."""
    threshold = detectron_corrections(N_ITERS, COSINE)
    every = detectron_corrections(N_ITERS, COSINE, every_change=True)
    assert threshold and set(threshold) < set(every)


@per_variable_xla
@pytest.mark.parametrize("nesterov, mode", [(False, mode) for mode in MODES] + [(True, "threshold"),
                                                                                (True, "every_change")],
                         ids=[f"momentum-{mode}" for mode in MODES] + ["nesterov-threshold", "nesterov-every_change"])
def test_per_variable_xla_update_matches_reference_and_non_xla(cache, nesterov, mode):
    """SGD (momentum / Nesterov), biases 2x LR, coupled weight decays, every correction mode, the update inside
    `_update_step_xla`: the numpy Caffe2 reference to 1e-5, the same run without XLA to 1e-6."""
    xla = _mode_run(cache, nesterov, mode, jit=True)
    plain = _mode_run(cache, nesterov, mode, jit=False)
    assert _xla_update_traces(xla.optimizer) > 0
    assert _xla_update_traces(plain.optimizer) == 0
    assert xla.iterations == N_ITERS
    np.testing.assert_array_equal(xla.initial[0], plain.initial[0])
    _check(f"xla[{nesterov=},{mode}] vs reference", xla.weights, _mode_reference(xla, nesterov, mode), 1e-5)
    _check(f"xla[{nesterov=},{mode}] vs no xla", xla.weights, plain.weights, 1e-6)
    if mode != "off":
        _far(f"xla[{nesterov=},{mode}] vs reference without corrections", xla.weights,
             _mode_reference(xla, nesterov, "off"), 1e-3)


def _distributed(optimizer):
    """`hvd_sched.keras.DistributedOptimizer(optimizer)` after a one-process `hvd.init()`."""
    import horovod.tensorflow as hvd

    hvd.init()
    return hvd_sched.keras.DistributedOptimizer(optimizer)


@per_variable_xla
def test_per_variable_xla_through_distributed_optimizer(cache):
    """The issue's second failing run: DistributedOptimizer (Horovod's own on Keras 2, rebuilt from the config, so
    jit_compile is set on the optimizer it returns) around the ScheduledOptimizer, one Horovod process."""
    opt = _distributed(_scheduled(COSINE, momentum_correction="threshold", **RULES))
    assert type(opt).__module__.startswith("horovod.") and scheduled_of(opt) is opt
    run = _fit(opt, jit_update=True)
    assert _xla_update_traces(run.optimizer) > 0
    _check("xla distributed vs reference", run.weights, _mode_reference(run, False, "threshold"), 1e-5)
    _check("xla distributed vs no xla", run.weights, _mode_run(cache, False, "threshold", jit=False).weights, 1e-6)


def _build_run(cache, jit, distributed):
    def make():
        model = make_mlp(seed=1)
        opt = build_optimizer(BUILD_SOLVER, model)
        if distributed:
            opt = _distributed(opt)
        return _fit(opt, jit_update=jit, model=model)

    return _cached(cache, ("build", jit, distributed), make)


@per_variable_xla
def test_build_optimizer_with_per_variable_xla(cache):
    """The issue's third failing run: DistributedOptimizer(build_optimizer(solver, model)) with the XLA update:
    Detectron's per-parameter update (kernels WEIGHT_DECAY, biases 2x LR and no decay) to 1e-5, and the same run
    without XLA (and without Horovod) to 1e-6."""
    xla = _build_run(cache, jit=True, distributed=True)
    plain = _build_run(cache, jit=False, distributed=False)
    assert _xla_update_traces(xla.optimizer) > 0
    assert describe_optimizer(xla.optimizer, xla.model) == "weight decay 0.01 on 2 kernels, 0 on 2 biases at 2x LR"
    reference = train_caffe2_sgd(xla.initial, _batches(*_data()), [detectron_lr(it, STEPS) for it in range(N_ITERS)],
                                 detectron_corrections(N_ITERS, STEPS), MU, _grad64, xla.groups, weight_decay=WD)
    _check("xla build_optimizer vs reference", xla.weights, reference, 1e-5)
    _check("xla build_optimizer vs no xla", xla.weights, plain.weights, 1e-6)


def _lr_scale_run(jit, scale=2.0):
    """One epoch, `set_lr_scale(scale)` (an elastic reset's linear scaling), two more epochs."""
    opt = _scheduled(STEPS, lr_multipliers={"bias": 2.0})
    first = _fit(opt, jit_update=jit, epochs=1)
    applied = opt.set_lr_scale(scale)
    model = first.model
    x, y = _data()
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, initial_epoch=1, shuffle=False, verbose=0)
    return first.initial, model.get_weights(), applied, opt


@per_variable_xla
def test_set_lr_scale_mid_training_with_per_variable_xla():
    """set_lr_scale(2) after epoch 1: every later LR doubles and the slots are rescaled by 2 before iteration 10,
    which also has the schedule's 0.1 correction (numpy: lr(it) * 2 from 10 on, V *= 0.1 * 2 at 10)."""
    initial, xla, applied, opt = _lr_scale_run(jit=True)
    _, plain, _, _ = _lr_scale_run(jit=False)
    assert applied == 2.0 and _xla_update_traces(opt) > 0
    lrs = [detectron_lr(it, STEPS) * (np.float32(2.0) if it >= STEPS_PER_EPOCH else np.float32(1.0))
           for it in range(N_ITERS)]
    corrections = dict(detectron_corrections(N_ITERS, STEPS))
    corrections[STEPS_PER_EPOCH] = corrections[STEPS_PER_EPOCH] * 2.0
    reference = train_sgd_with_skips(initial, _batches(*_data()), lrs, corrections, MU,
                                     multipliers=BIAS_2X)[0]
    _check("xla set_lr_scale vs reference", xla, reference, 1e-5)
    _check("xla set_lr_scale vs no xla", xla, plain, 1e-6)
    unscaled = detectron_corrections(N_ITERS, STEPS)  # the LR doubles but the slots are not rescaled
    _far("xla set_lr_scale vs reference without the slot rescale", xla,
         train_sgd_with_skips(initial, _batches(*_data()), lrs, unscaled, MU, multipliers=BIAS_2X)[0],
         1e-3)


@legacy_only
def test_legacy_sgd_has_no_xla_update_and_trains_the_same(cache):
    """Keras' legacy SGD (OptimizerV2) has no per-variable XLA update (no `jit_compile`, no `_update_step_xla`),
    so a GPU does not change how it runs: the scheduled legacy SGD trains to the reference and to the new SGD's
    XLA-update run."""
    legacy = tf.keras.optimizers.legacy.SGD(momentum=MU)
    assert not hasattr(legacy, "_update_step_xla") and not hasattr(legacy, "jit_compile")
    opt = ScheduledOptimizer(legacy, hvd_sched.from_detectron(COSINE), momentum_correction="threshold", **RULES)
    run = _fit(opt)
    _check("legacy vs reference", run.weights, _mode_reference(run, False, "threshold"), 1e-5)
    _check("legacy vs new SGD with xla update", run.weights, _mode_run(cache, False, "threshold", jit=True).weights,
           1e-6)


# -- whole-step XLA ----------------------------------------------------------------------------------------------

# Keras 3 turns a model's jit_compile=True off (a warning, then no XLA) while TensorFlow's op determinism is on
# (`keras.src.trainers.trainer.model_supports_jit`), and tests/keras/conftest.py turns it on for this process: there
# the whole-step XLA runs go to a new process without it. Keras 2 compiles with it on, in this process.
WHOLE_STEP = """
import json, sys, tensorflow as tf
import hvd_sched, hvd_sched.keras, rankutil
from hvd_sched.keras import ScheduledOptimizer
out = {}
for spec in map(json.loads, sys.argv[1:]):
    x, y = rankutil.make_regression(n=160, seed=3)
    model = rankutil.make_mlp(seed=1)
    initial = model.get_weights()
    opt = ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9, nesterov=spec["nesterov"]),
                             hvd_sched.from_detectron(spec["solver"]), **spec["options"])
    if spec["distributed"]:
        import horovod.tensorflow as hvd
        hvd.init()
        opt = hvd_sched.keras.DistributedOptimizer(opt)
    model.compile(opt, "mse", jit_compile=True)
    model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    out[spec["name"]] = {"weights": model.get_weights(), "initial": initial, "jit_compile": model.jit_compile,
                         "iterations": int(model.optimizer.iterations.numpy()),
                         "groups": [v.name for v in model.trainable_variables]}
rankutil.emit(out, rank=0)
"""
WHOLE_STEP_CASES = {"momentum-threshold": (False, "threshold"), "nesterov-every_change": (True, "every_change")}


class _Result:
    """A run's outcome as the subprocess reports it."""

    def __init__(self, got):
        self.weights = [np.array(w) for w in got["weights"]]
        self.initial = [np.array(w) for w in got["initial"]]
        self.jit_compile, self.iterations = got["jit_compile"], got["iterations"]
        self.groups = [caffe2_group(name) for name in got["groups"]]


def _keras3_whole_step(cache, run_single):
    """Every Keras 3 whole-step XLA run, in one new process without op determinism."""
    def make():
        specs = [{"name": name, "solver": COSINE, "nesterov": nesterov, "distributed": False,
                  "options": dict(RULES, momentum_correction=mode)} for name, (nesterov, mode) in
                 WHOLE_STEP_CASES.items()]
        specs.append({"name": "distributed", "solver": STEPS, "nesterov": False, "distributed": True,
                      "options": {"lr_multipliers": {"bias": 2.0}}})
        return {name: _Result(got) for name, got in run_single(WHOLE_STEP, args=map(json.dumps, specs)).items()}

    return _cached(cache, "keras3 whole step", make)


@pytest.mark.parametrize("case, jit_update", [
    ("momentum-threshold", False), ("nesterov-every_change", False),
    pytest.param("momentum-threshold", True, marks=per_variable_xla)],
    ids=["momentum-threshold-step_xla", "nesterov-every_change-step_xla", "momentum-threshold-step_and_update_xla"])
def test_whole_step_xla_one_process_matches_reference(cache, run_single, case, jit_update):
    """model.compile(..., jit_compile=True), one process, a plain ScheduledOptimizer (on Keras 2 also with the
    optimizer's own XLA update inside): the numpy Caffe2 reference to 1e-5."""
    nesterov, mode = WHOLE_STEP_CASES[case]
    if KERAS_MAJOR == 3:
        run = _keras3_whole_step(cache, run_single)[case]
    else:
        run = _fit(_scheduled(COSINE, nesterov, momentum_correction=mode, **RULES), jit_step=True,
                   jit_update=jit_update)
        run.jit_compile = run.model.jit_compile
    assert run.jit_compile is True and run.iterations == N_ITERS
    _check(f"whole-step xla[{nesterov=},{mode},{jit_update=}] vs reference", run.weights,
           _mode_reference(run, nesterov, mode), 1e-5)


def test_whole_step_xla_with_horovod_stops_with_a_clear_error(cache, run_single):
    """Horovod's collectives have no XLA kernels in this build: compiling them into a whole-step XLA graph must
    stop with hvd_sched's ValueError naming the fix, raised where hvd_sched checks (not from TensorFlow's
    internals, not an XLA compilation error), before any weight or the iteration changes.

    Keras 3: hvd_sched's own DistributedOptimizer emits no Horovod op at all in one process (nothing to average:
    `hvd_sched.keras._horovod.average_gradients`), so there the one-process XLA step trains, to the reference;
    the error comes from 2 ranks on (tests/multirank/test_gpu_defaults_ranks.py)."""
    if KERAS_MAJOR == 3:
        run = _keras3_whole_step(cache, run_single)["distributed"]
        assert run.jit_compile is True and run.iterations == N_ITERS
        reference = train_sgd_with_skips(run.initial, _batches(*_data()),
                                         [detectron_lr(it, STEPS) for it in range(N_ITERS)],
                                         detectron_corrections(N_ITERS, STEPS), MU,
                                         multipliers=BIAS_2X)[0]
        _check("keras3 whole-step xla distributed (1 process) vs reference", run.weights, reference, 1e-5)
        return
    opt = _distributed(_scheduled(STEPS, lr_multipliers={"bias": 2.0}))
    model = make_mlp(seed=1)
    initial = [w.copy() for w in model.get_weights()]
    model.compile(opt, "mse", jit_compile=True)
    x, y = _data()
    with pytest.raises(ValueError, match=re.escape("jit_compile=False")) as caught:
        model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    assert not isinstance(caught.value, tf.errors.OpError)
    assert "hvd_sched:" in str(caught.value)
    assert "/hvd_sched/" in str(caught.traceback[-1].path), caught.traceback[-1]  # raised by hvd_sched itself
    assert int(opt.iterations.numpy()) == 0
    for got, want in zip(model.get_weights(), initial):
        np.testing.assert_array_equal(got, want)


# -- mixed precision ---------------------------------------------------------------------------------------------

def _reference_lrs(solver, n_iters=N_ITERS):
    return [detectron_lr(it, solver) for it in range(n_iters)]


def _fp16_reference(initial, solver, *, multipliers=None, skipped=(), corrections=None, data=None, epochs=EPOCHS,
                    skip_advances_iteration=True, policy="mixed_float16", n_iters=None, loss_scale=LOSS_SCALE):
    """The numpy reference fed the gradients TensorFlow computes under `policy` at the reference's weights, and
    the iteration counter at the end."""
    x, y = data if data is not None else _data()
    batches = _batches(x, y, epochs)
    n_iters = n_iters or len(batches)
    corrections = detectron_corrections(n_iters, solver) if corrections is None else corrections
    return train_sgd_with_skips(initial, batches, _reference_lrs(solver, n_iters), corrections, MU, skipped=skipped,
                                skip_advances_iteration=skip_advances_iteration, multipliers=multipliers,
                                grad_fn=_dynamic_scale_grads(policy, loss_scale, skipped))


def _check_steps(name, run, solver, *, corrections=None, skipped=(), data=None, epochs=EPOCHS, multipliers=None,
                 policy="mixed_float16", loss_scale=LOSS_SCALE, grad_transform=None):
    """Every step of `run` from its own weights: the reference's update on the same low-precision gradient
    (`momentum_step_residuals`) to STEP_ATOL; a skipped batch leaves the weights exactly in place."""
    batches = _batches(*(data if data is not None else _data()), epochs)
    corrections = detectron_corrections(N_ITERS, solver) if corrections is None else corrections
    residuals = momentum_step_residuals(run.trajectory, batches, _reference_lrs(solver), corrections, MU,
                                        _dynamic_scale_grads(policy, loss_scale, skipped), skipped=skipped,
                                        skip_advances_iteration=KERAS_MAJOR == 2, multipliers=multipliers,
                                        grad_transform=grad_transform)
    DIFFS[name + " (one step from its own weights)"] = max(residuals)
    for position in skipped:
        assert residuals[position] == 0.0, f"{name}: the skipped batch {position} changed the weights"
    worst = int(np.argmax(residuals))
    assert residuals[worst] <= STEP_ATOL, f"{name}: batch {worst} is {residuals[worst]:.3g} from the reference step"


_GRAD_FNS = {}


def _low_precision_grads(policy, loss_scale):
    """`keras_loss_grad_fn` of an unscheduled MLP built under `policy` (one per policy and scale: one trace)."""
    if (policy, loss_scale) not in _GRAD_FNS:
        with _policy(policy):
            plain = make_mlp(seed=1)
            plain.compile(tf.keras.optimizers.SGD(), "mse")
        _GRAD_FNS[policy, loss_scale] = keras_loss_grad_fn(plain, loss_scale)
    return _GRAD_FNS[policy, loss_scale]


def _dynamic_scale_grads(policy, loss_scale, skipped):
    """The low-precision gradients with Keras' loss scale, halved at every skipped step (for one reference run)."""
    return dynamic_scale_grad_fn(lambda scale: _low_precision_grads(policy, scale), loss_scale, skipped)


def _f64_reference(initial, solver, multipliers=None, corrections=None):
    corrections = detectron_corrections(N_ITERS, solver) if corrections is None else corrections
    return train_sgd_with_skips(initial, _batches(*_data()), _reference_lrs(solver), corrections, MU,
                                multipliers=multipliers)[0]


def _mixed_run(cache):
    """mixed_float16 with the GPU's defaults: model.compile wraps the ScheduledOptimizer in a LossScaleOptimizer,
    Keras 2's update is XLA-compiled, the callbacks are horovod_callbacks() (one Horovod process)."""
    def make():
        import horovod.tensorflow as hvd

        hvd.init()
        with _policy("mixed_float16"):
            opt = _scheduled(STEPS, lr_multipliers={"bias": 2.0})
            return _fit(opt, jit_update=KERAS_MAJOR == 2,
                        callbacks=[*horovod_callbacks(), _checkpoints(cache, "mixed")])

    return _cached(cache, "mixed", make)


def test_mixed_float16_horovod_callbacks_log_the_schedule_and_correct_exactly(cache):
    """mixed_float16 with horovod_callbacks() (which used to fail: the logger did not see through the
    LossScaleOptimizer): the History and batch logs hold `schedule.lr_at`, every step is the reference's step."""
    run = _mixed_run(cache)
    opt = run.optimizer
    assert isinstance(opt, _loss_scale_class()), type(opt)
    scheduled = scheduled_of(opt)
    assert scheduled is not None and scheduled is not opt and scheduled.schedule == hvd_sched.from_detectron(STEPS)
    assert run.iterations == N_ITERS
    schedule = scheduled.schedule
    assert run.history.history["learning_rate"] == [schedule.lr_at((e + 1) * STEPS_PER_EPOCH - 1)
                                                    for e in range(EPOCHS)]
    assert [logs["learning_rate"] for logs, _, _ in run.batch_logs] == [schedule.lr_at(it) for it in range(N_ITERS)]
    _check_steps("mixed_float16", run, STEPS, multipliers=BIAS_2X)
    reference, _ = _fp16_reference(run.initial, STEPS, multipliers=BIAS_2X)
    _check("mixed_float16 vs reference (float16 gradients)", run.weights, reference, TRAJECTORY_ATOL)
    _check("mixed_float16 vs reference (float64)", run.weights, _f64_reference(run.initial, STEPS, BIAS_2X), 5e-3)
    lost, _ = _fp16_reference(run.initial, STEPS, multipliers=BIAS_2X, corrections={})
    _far("mixed_float16 vs reference without corrections", run.weights, lost, 1e-2)


def test_hand_built_loss_scale_optimizer_around_build_optimizer(mixed_float16):
    """LossScaleOptimizer(build_optimizer(...)) built by hand: model.compile keeps it; LearningRateLogger and
    describe_optimizer see through it; Detectron's per-parameter update on float16 gradients."""
    model = make_mlp(seed=1)
    inner = build_optimizer(BUILD_SOLVER, model, momentum_correction="every_change")
    opt = _loss_scale_class()(inner)
    assert describe_optimizer(opt, model) == describe_optimizer(inner, model) == \
        "weight decay 0.01 on 2 kernels, 0 on 2 biases at 2x LR"
    run = _fit(opt, model=model, callbacks=[LearningRateLogger()])
    assert run.optimizer is opt and scheduled_of(opt) is inner
    assert run.history.history["learning_rate"] == [inner.lr_at((e + 1) * STEPS_PER_EPOCH - 1) for e in range(EPOCHS)]
    corrections = detectron_corrections(N_ITERS, STEPS, every_change=True)
    _check_steps("hand-built LossScaleOptimizer(build_optimizer)", run, STEPS, corrections=corrections,
                 grad_transform=lambda params, grads: caffe2_param_grads(params, grads, run.groups, WD, 0.0))
    reference = train_caffe2_sgd(run.initial, _batches(*_data()), _reference_lrs(STEPS), corrections, MU,
                                 _low_precision_grads("mixed_float16", LOSS_SCALE), run.groups, weight_decay=WD)
    _check("hand-built LossScaleOptimizer(build_optimizer) vs reference (float16 gradients)", run.weights, reference,
           TRAJECTORY_ATOL)


SKIPPED = STEPS_PER_EPOCH  # the batch whose gradients overflow: iteration 10, the LR's 0.2 -> 0.02 correction


def _overflow_data(skipped=SKIPPED):
    """30 distinct batches; batch `skipped` has one target of 150, so the float16 backward pass overflows at the
    loss scale 2**15 (d loss / d prediction = 2 * 150 / 48 * 2**15 ~ 2e5 > 65504) while the loss stays finite."""
    x, y = make_regression(n=BATCH * N_ITERS, seed=3)
    y = y.copy()
    y[skipped * BATCH, 0] = 150.0
    return x, y


def test_schedule_callback_through_the_loss_scale_optimizer_with_a_skipped_step(mixed_float16):
    """A plain SGD under mixed_float16 (model.compile wraps it): ScheduleCallback sets the inner LR and rescales the
    inner slots, also when the step of iteration 10 (its 0.1 correction) is skipped for an overflow (see
    `_overflow_data`): the correction made before that step reaches the next applied one, once."""
    schedule = hvd_sched.from_detectron(STEPS)
    run = _fit(tf.keras.optimizers.SGD(0.5, momentum=MU), callbacks=[ScheduleCallback(schedule, verbose=0)],
               data=_overflow_data(), epochs=1)
    assert isinstance(run.optimizer, _loss_scale_class())
    keras2 = KERAS_MAJOR == 2
    assert run.iterations == (N_ITERS if keras2 else N_ITERS - 1)
    assert run.history.history["learning_rate"] == [schedule.lr_at(run.iterations - 1)]
    _check_steps("mixed_float16 ScheduleCallback, skipped step", run, STEPS, skipped=[SKIPPED], data=_overflow_data(),
                 epochs=1)
    skip = dict(data=_overflow_data(), epochs=1, skipped=[SKIPPED], skip_advances_iteration=keras2, n_iters=N_ITERS)
    reference, _ = _fp16_reference(run.initial, STEPS, **skip)
    _check("mixed_float16 ScheduleCallback, skipped step vs reference (float16 gradients)", run.weights, reference,
           TRAJECTORY_ATOL)
    lost = {k: v for k, v in detectron_corrections(N_ITERS, STEPS).items() if k != SKIPPED}
    _far("mixed_float16 ScheduleCallback, skipped step vs reference with the correction lost", run.weights,
         _fp16_reference(run.initial, STEPS, corrections=lost, **skip)[0], 1e-2)


def test_stop_on_non_finite_through_the_loss_scale_optimizer(mixed_float16):
    """A NaN input at batch 3: the LossScaleOptimizer skips the step (the weights stay those of 3 applied steps)
    and StopOnNonFinite stops with the iteration whose loss it is and the LR in force, read through the wrapper:
    3 on both Keras versions (Keras 3's skipped step did not advance the count, so it is read, not derived)."""
    x, y = _data()
    x = x.copy()
    x[3 * BATCH] = np.nan
    opt = _scheduled(STEPS, lr_multipliers={"bias": 2.0})
    model = make_mlp(seed=1)
    initial = [w.copy() for w in model.get_weights()]
    model.compile(opt, "mse")
    with pytest.raises(NonFiniteLossError) as caught:
        model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[StopOnNonFinite()])
    iteration = 3
    message = str(caught.value)
    assert f"at iteration {iteration} on rank 0 (learning rate in force {opt.lr_at(iteration):.6g})" in message
    assert "loss is nan" in message
    assert all(np.isfinite(w).all() for w in model.get_weights())
    reference, _ = _fp16_reference(initial, STEPS, multipliers=BIAS_2X, data=(x[:3 * BATCH], y[:3 * BATCH]), epochs=1)
    _check("mixed_float16 stopped after a NaN batch vs reference", model.get_weights(), reference, TRAJECTORY_ATOL)


# variant -> (solver, skipped batch, optimizer, Keras 2's XLA update). "steps": the 0.1 correction of iteration 10
# is due at the skipped step. "cosine": corrections at 20 and 21, so on Keras 2 (which counts the skipped step 20)
# the step applied at 21 must take their product. "legacy": Keras 2's other LossScaleOptimizer (for OptimizerV2),
# which also counts a skipped step.
SKIP_VARIANTS = {"steps": (STEPS, SKIPPED, "sgd", False), "cosine": (COSINE, 20, "sgd", KERAS_MAJOR == 2),
                 "legacy": (STEPS, SKIPPED, "legacy", False)}


def _skip_run(cache, variant):
    solver, skipped, kind, jit = SKIP_VARIANTS[variant]

    def make():
        with _policy("mixed_float16"):
            sgd = tf.keras.optimizers.legacy.SGD if kind == "legacy" else tf.keras.optimizers.SGD
            opt = ScheduledOptimizer(sgd(momentum=MU), hvd_sched.from_detectron(solver),
                                     momentum_correction="threshold")
            return _fit(opt, jit_update=jit, data=_overflow_data(skipped), epochs=1,
                        callbacks=[LearningRateLogger(), StopOnNonFinite()])

    return _cached(cache, ("skip", variant), make)


@pytest.mark.parametrize("variant", ["steps", "cosine", pytest.param("legacy", marks=legacy_only)])
def test_skipped_step_takes_its_correction_at_the_next_applied_step(cache, variant):
    """The step of a correction's iteration is skipped for non-finite gradients. Keras 2's LossScaleOptimizer still
    advances `iterations` on it (10 -> 11), so the next applied step runs the next iteration and must apply the
    skipped iteration's correction then, once (with its own, if it has one: "cosine"); Keras 3's does not advance
    it, so the next batch runs the skipped iteration itself. The numpy reference skips that update and applies
    every correction due since the last applied step. Keras 2 with its XLA update on "cosine"."""
    solver, skipped, _, jit = SKIP_VARIANTS[variant]
    run = _skip_run(cache, variant)
    keras2 = KERAS_MAJOR == 2
    iterations_after = [it for _, it, _ in run.batch_logs]
    assert iterations_after[skipped - 1] == skipped
    assert iterations_after[skipped] == (skipped + 1 if keras2 else skipped)  # Keras 2 counts the skipped step
    assert run.iterations == (N_ITERS if keras2 else N_ITERS - 1)
    assert all(math.isfinite(logs["loss"]) for logs, _, _ in run.batch_logs)
    scale = run.optimizer.loss_scale if keras2 else run.optimizer.dynamic_scale
    assert float(np.asarray(scale)) == LOSS_SCALE / 2  # exactly one skip
    assert _xla_update_traces(run.optimizer) > 0 if jit else True
    data = _overflow_data(skipped)
    _check_steps(f"skipped step[{variant}]", run, solver, skipped=[skipped], data=data, epochs=1)

    def reference(corrections=None, advances=keras2):
        return _fp16_reference(run.initial, solver, data=data, epochs=1, skipped=[skipped],
                               skip_advances_iteration=advances, n_iters=N_ITERS, corrections=corrections)

    expected, iterations = reference()
    assert iterations == run.iterations
    _check(f"skipped step[{variant}] vs reference (float16 gradients)", run.weights, expected, TRAJECTORY_ATOL)
    due = detectron_corrections(N_ITERS, solver)
    assert skipped in due and (variant != "cosine" or skipped + 1 in due)
    wrong = {"correction lost": {k: v for k, v in due.items() if k != skipped},
             # at the skipped step's iteration and again at the next one
             "correction twice": {**due, skipped + 1: due.get(skipped + 1, 1.0) * due[skipped]}}
    for what, corrections in wrong.items():
        _far(f"skipped step[{variant}] vs reference with the {what}", run.weights, reference(corrections)[0],
             2 * TRAJECTORY_ATOL)
    _far(f"skipped step[{variant}] vs the other Keras major's iteration counting", run.weights,
         reference(advances=not keras2)[0], 2 * TRAJECTORY_ATOL)
    assert run.history.history["learning_rate"] == [scheduled_of(run.optimizer).lr_at(run.iterations - 1)]


def test_mixed_bfloat16_trains_to_the_reference():
    """mixed_bfloat16 (no loss scaling: bfloat16 has float32's range) with SGD: no LossScaleOptimizer, the logger
    follows the schedule, every step is the reference's on bfloat16 gradients (and, loosely, float64)."""
    with _policy("mixed_bfloat16"):
        opt = _scheduled(STEPS, lr_multipliers={"bias": 2.0})
        run = _fit(opt, jit_update=KERAS_MAJOR == 2, callbacks=[LearningRateLogger()])
    assert run.optimizer is opt
    assert run.history.history["learning_rate"] == [opt.lr_at((e + 1) * STEPS_PER_EPOCH - 1) for e in range(EPOCHS)]
    low = dict(policy="mixed_bfloat16", loss_scale=1.0)
    _check_steps("mixed_bfloat16", run, STEPS, multipliers=BIAS_2X, **low)
    reference, _ = _fp16_reference(run.initial, STEPS, multipliers=BIAS_2X, **low)
    _check("mixed_bfloat16 vs reference (bfloat16 gradients)", run.weights, reference, TRAJECTORY_ATOL)
    _check("mixed_bfloat16 vs reference (float64)", run.weights, _f64_reference(run.initial, STEPS, BIAS_2X), 2e-2)


# -- resume in a new process -------------------------------------------------------------------------------------

RESUME = """
import json, sys, numpy as np, tensorflow as tf
import hvd_sched, hvd_sched.keras, rankutil
from hvd_sched.keras import ScheduledOptimizer, restore_latest
tf.config.experimental.enable_op_determinism()
out = {}
for spec in map(json.loads, sys.argv[1:]):
    tf.keras.mixed_precision.set_global_policy(spec["policy"])
    x, y = rankutil.make_regression(n=160, seed=3)
    model = rankutil.make_mlp(seed=1)
    opt = ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9, nesterov=spec["nesterov"]),
                             hvd_sched.from_detectron(spec["solver"]), **spec["options"])
    if spec["jit"]:
        opt.jit_compile = True
    model.compile(opt, "mse")
    meta = restore_latest(spec["dir"], model)
    start = int(model.optimizer.iterations.numpy())
    model.fit(x, y, batch_size=16, epochs=3, initial_epoch=meta["epoch"] + 1, shuffle=False, verbose=0)
    traces = opt._update_step_xla.experimental_get_tracing_count() if spec["jit"] else 0
    out[spec["name"]] = {"weights": model.get_weights(), "meta": meta, "start": start, "traces": traces,
                         "iterations": int(model.optimizer.iterations.numpy()), "class": type(model.optimizer).__name__}
rankutil.emit(out, rank=0)
"""


def _resume_specs(cache):
    specs = [{"name": "mixed", "policy": "mixed_float16", "solver": STEPS, "nesterov": False,
              "options": {"lr_multipliers": {"bias": 2.0}}, "jit": KERAS_MAJOR == 2}]
    if KERAS_MAJOR == 2:
        specs.append({"name": "xla", "policy": "float32", "solver": COSINE, "nesterov": RESUMED[0],
                      "options": dict(RULES, momentum_correction=RESUMED[1]), "jit": RESUMED[2]})
    for spec in specs:
        spec["dir"] = str(cache["checkpoints"] / spec["name"])
    return specs


def test_resume_in_a_new_process_with_the_gpu_defaults(cache, run_single):
    """The uninterrupted runs (mixed_float16 through the LossScaleOptimizer with Keras 2's XLA update, and the
    float32 XLA update) checkpointed their first two epochs with EpochCheckpoint; restore_latest in a new process
    with the same settings and the last epoch there end with the uninterrupted run's weights."""
    uninterrupted = {"mixed": _mixed_run(cache)}
    if KERAS_MAJOR == 2:
        uninterrupted["xla"] = _mode_run(cache, *RESUMED)
    specs = _resume_specs(cache)
    for spec in specs:
        assert latest_checkpoint(spec["dir"])["iteration"] == 2 * STEPS_PER_EPOCH
    resumed = run_single(RESUME, args=[json.dumps(spec) for spec in specs])
    for spec in specs:
        got = resumed[spec["name"]]
        assert got["start"] == 2 * STEPS_PER_EPOCH and got["meta"]["epoch"] == 1
        assert got["iterations"] == N_ITERS
        assert (got["traces"] > 0) == spec["jit"]
        _check(f"resumed {spec['name']} vs uninterrupted", got["weights"], uninterrupted[spec["name"]].weights, 1e-6)
    assert "LossScaleOptimizer" in resumed["mixed"]["class"]
