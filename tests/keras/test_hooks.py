"""Every Keras/TensorFlow internal hvd_sched relies on, named: when a Keras release changes one, a test here fails
and says which (the public modules reach them only through hvd_sched/keras/_keras2.py or _keras3.py).

TensorFlow 2.20 -> 2.21 (the tf-keras and Keras 3 rows moved on 2026-12-04): every hook below holds on both.
tf-keras 2.21.0 differs from 2.20.1 in 12 files (engine/data_adapter.py skips None entries, functional and input
layers, softmax, multi-head attention, protobufs), none under optimizers/, callbacks, mixed_precision or the
train step; Keras 3 stays 3.15.1. TensorFlow 2.21 no longer depends on tensorboard (Keras' TensorBoard callback
then fails at the first batch: examples/train_keras.py checks for it).
"""

import ast
import inspect
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from hvd_sched.keras import _backend
from stackutil import KERAS_MAJOR

KERAS_DIR = pathlib.Path(_backend.__file__).parent
LOSS_SCALE = (tf.keras.mixed_precision.LossScaleOptimizer if KERAS_MAJOR == 2
              else _backend.keras.optimizers.LossScaleOptimizer)


def _top_level_names(path):
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


@pytest.mark.parametrize("module", ["_keras2.py", "_keras3.py"])
def test_both_keras_modules_define_every_name_of_the_api(module):
    from hvd_sched.keras import _keras_api

    missing = set(_keras_api.NAMES) - _top_level_names(KERAS_DIR / module)
    assert not missing, f"{module} lacks {sorted(missing)}"


def test_the_backend_is_this_rows_keras():
    assert _backend.KERAS_MAJOR == KERAS_MAJOR
    assert tf.keras.__version__.startswith(f"{KERAS_MAJOR}.") if hasattr(tf.keras, "__version__") else True


@pytest.mark.parametrize("owner, attribute", _backend.HOOKS,
                         ids=[f"{getattr(o, '__name__', o)}.{a}" for o, a in _backend.HOOKS])
def test_hook_exists(owner, attribute):
    if isinstance(owner, type) and attribute not in dir(owner):
        # Instance attributes (set in __init__ or build) are looked up on a built instance.
        instance = _built_instance(owner, attribute)
        assert instance is not None and hasattr(instance, attribute), \
            f"Keras changed: {owner.__module__}.{owner.__name__}.{attribute} is gone (hvd_sched relies on it)"
    else:
        assert hasattr(owner, attribute), f"Keras/TensorFlow changed: {owner}.{attribute} is gone"


def _built_instance(owner, attribute):
    variable = tf.Variable(np.ones((2, 2), np.float32))
    if attribute == "_is_wrapped_by_loss_scale_optimizer":  # set on the inner optimizer by Keras 2's wrapper
        inner = tf.keras.optimizers.SGD(0.1)
        LOSS_SCALE(inner)
        return inner
    if issubclass(owner, tf.keras.Model):
        model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
        model.compile("sgd", "mse", steps_per_execution=2)
        return model
    if LOSS_SCALE in owner.__mro__ or owner is LOSS_SCALE:
        return LOSS_SCALE(_backend.keras.optimizers.SGD(0.1))
    if "legacy" in owner.__module__:
        optimizer = tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9)
        optimizer._create_all_weights([variable])
        return optimizer
    optimizer = _backend.keras.optimizers.SGD(0.1, momentum=0.9)
    if KERAS_MAJOR == 3:
        variable = _backend.keras.Variable(np.ones((2, 2), np.float32))
    optimizer.build([variable])
    if KERAS_MAJOR == 2:
        optimizer._compute_current_learning_rate()  # creates _current_learning_rate (a schedule's LR per step)
        optimizer.learning_rate = tf.keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
        optimizer._compute_current_learning_rate()
    return optimizer


def test_xla_context_is_seen_while_tracing_a_jit_compiled_function():
    seen = {}

    @tf.function(jit_compile=True)
    def compiled(x):
        seen["xla"] = _backend.in_xla_compilation()
        return x + 1

    @tf.function
    def plain(x):
        seen["plain"] = _backend.in_xla_compilation()
        return x + 1

    compiled(tf.constant(1.0))
    plain(tf.constant(1.0))
    assert seen == {"xla": True, "plain": False}, \
        "control_flow_util.GraphOrParentsInXlaContext no longer tells an XLA-compiled trace"


def test_update_step_signature():
    parameters = list(inspect.signature(_backend.keras.optimizers.SGD.update_step).parameters)
    expected = ["self", "gradient", "variable"] + (["learning_rate"] if KERAS_MAJOR == 3 else [])
    assert parameters == expected, f"Keras changed SGD.update_step's signature: {parameters}"


def test_momentum_slot_of_a_variable():
    optimizer = _backend.keras.optimizers.SGD(0.1, momentum=0.9)
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(3)])
    _backend.build_slots(optimizer, model.trainable_variables)
    slots = [_backend.momentum_slot(optimizer, v) for v in model.trainable_variables]
    assert [tuple(s.shape) for s in slots] == [(2, 3), (3,)]
    assert [id(s) for s in slots] == [id(s) for s in _backend.all_momentum_slots(optimizer)]


def test_loss_scale_optimizer_skip_and_its_iterations():
    """Keras 2 counts a skipped step in the inner `iterations` (its do-not-apply branch), and marks the inner
    optimizer `_is_wrapped_by_loss_scale_optimizer`; Keras 3 does neither, and sets the inner
    `loss_scale_factor` to None when it wraps it. hvd_sched's correction bookkeeping follows each."""
    inner = _backend.keras.optimizers.SGD(0.1, momentum=0.9)
    wrapper = LOSS_SCALE(inner)
    assert _backend.unwrap(wrapper) is inner
    variable = tf.Variable([1.0]) if KERAS_MAJOR == 2 else _backend.keras.Variable([1.0])
    wrapper.apply_gradients([(tf.constant([np.inf]), variable)])  # skipped: non-finite
    assert float(np.asarray(variable.numpy())[0]) == 1.0
    assert int(inner.iterations.numpy()) == (1 if KERAS_MAJOR == 2 else 0)
    assert _backend.counts_skipped_steps(inner) is (KERAS_MAJOR == 2)
    assert _backend.skips_iterations(wrapper) is (KERAS_MAJOR == 3)
    if KERAS_MAJOR == 3:
        assert inner.loss_scale_factor is None


def test_the_accumulation_counters():
    """What `micro_batches` / `micro_batch_count` read: Horovod's Keras 2 accumulation helper (`_agg_helper`, with
    `backward_passes_per_step` and `average_aggregated_gradients`), Keras 3's `gradient_accumulation_steps` and
    `_iterations` (its `iterations` is `_iterations // gradient_accumulation_steps`), and the schedule's step Keras 3
    passes (`_iterations`: micro-batches)."""
    if KERAS_MAJOR == 2:
        import horovod.tensorflow.keras as hvd

        hvd.init()
        opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), backward_passes_per_step=3,
                                       average_aggregated_gradients=True)
        assert opt._agg_helper.backward_passes_per_step == 3 and opt._agg_helper.average_aggregated_gradients
        assert _backend.micro_batches(opt) == 3 and not _backend.sums_micro_batches(opt)
        return
    keras = _backend.keras
    seen = []

    class Recording(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            seen.append(int(np.asarray(step)))  # eager: the value now, not the variable
            return 0.1

    opt = keras.optimizers.SGD(Recording(), gradient_accumulation_steps=2)
    variable = keras.Variable(np.zeros(2, np.float32))
    for _ in range(4):
        opt.apply([tf.ones(2)], [variable])
    assert _backend.micro_batches(opt) == 2
    assert _backend.micro_batch_count(opt) == 4 and int(opt.iterations.numpy()) == 2
    assert seen == [1, 3]  # Keras calls the schedule with the micro-batch count, on the updates only
