"""Every Keras 3 internal hvd_sched relies on (Keras 3.15 on the TensorFlow backend), in one place.

The same names as `_keras2` (`hvd_sched.keras._backend` exports one of the two). Keras 3 differs where it
matters here:

- the optimizer's step is `apply(grads, trainable_variables)`; `update_step(gradient, variable, learning_rate)`
  receives the step's LR as an argument (the schedule is evaluated once per step) and, on the TensorFlow
  backend, the backing `tf.Variable` of each Keras variable; the slots are `optimizer.momentums[index]`;
- `train_step` calls `optimizer.apply_gradients` directly, so Horovod 0.28.1's Keras `DistributedOptimizer`,
  whose allreduce sits in hooks Keras 3 never calls, trains the ranks apart without an error (horovod #4290).
  `distributed_optimizer` averages in `apply` instead, with Horovod's TensorFlow collectives, and importing
  this module makes Horovod's Keras wrapper raise (see `_refuse_horovod_keras_wrapper`);
- a `LossScaleOptimizer` that skips a step (non-finite gradients) does not advance `iterations`, and decides
  on the gradients it is given, so the distributed optimizer must be outside it.

tests/keras/test_hooks.py names every hook below and fails, naming it, when a Keras release changes it.
"""

import re

import keras
import numpy as np
import tensorflow as tf
from keras import ops
from tensorflow.python.ops import control_flow_util  # XLA context of the graph being traced (no public API)

from . import _horovod, _keras_api

__all__ = list(_keras_api.NAMES)

KERAS_MAJOR = 3
"""The major version of the Keras that `tf.keras` is on this stack: 2 or 3 (`hvd_sched.keras` picks its
Keras 2 or Keras 3 internals by it, once, at import; the public names are the same on both)."""
LearningRateSchedule = keras.optimizers.schedules.LearningRateSchedule
_OPTIMIZER = keras.optimizers.Optimizer
_SGD = keras.optimizers.SGD
_LOSS_SCALE = keras.optimizers.LossScaleOptimizer
OPTIMIZER_TYPES = (_OPTIMIZER,)
BUILTIN_OPTIMIZERS = (keras.optimizers.SGD, keras.optimizers.Adam, keras.optimizers.AdamW, keras.optimizers.RMSprop,
                      keras.optimizers.Nadam, keras.optimizers.Adagrad)

#: The Keras/TensorFlow internals used here: (owner, attribute). tests/keras/test_hooks.py checks each exists.
HOOKS = (
    (_OPTIMIZER, "_get_variable_index"), (_OPTIMIZER, "_trainable_variables"), (_OPTIMIZER, "_iterations"),
    (_OPTIMIZER, "_learning_rate"),
    (_OPTIMIZER, "update_step"), (_OPTIMIZER, "apply"), (_OPTIMIZER, "assign"), (_OPTIMIZER, "assign_add"),
    (_SGD, "momentums"), (_LOSS_SCALE, "inner_optimizer"), (_LOSS_SCALE, "loss_scale_factor"),
    (keras.Model, "_flatten_layers"), (keras.Model, "steps_per_execution"), (keras.Variable, "value"),
    (keras.Variable, "path"), (control_flow_util, "GraphOrParentsInXlaContext"),
    (_OPTIMIZER, "gradient_accumulation_steps"), (_OPTIMIZER, "_clip_gradients"),
    (_OPTIMIZER, "_backend_apply_gradients"), (_OPTIMIZER, "_variables"),
)


def is_optimizer(obj):
    """True for a Keras optimizer; a LossScaleOptimizer counts too."""
    return isinstance(obj, _OPTIMIZER)


def is_legacy(optimizer):
    """False: Keras 3 has no legacy (OptimizerV2) optimizers."""
    return False


def is_sgd(optimizer):
    return isinstance(optimizer, _SGD)


def momentum_of(optimizer):
    momentum = getattr(optimizer, "momentum", 0.0)
    return float(momentum) if isinstance(momentum, (int, float)) else 1.0


def is_variable(obj):
    return isinstance(obj, (keras.Variable, tf.Variable))


def variable_name(variable):
    """The name the per-variable rules match: the Keras variable's `path`, e.g. "sequential/dense/kernel"."""
    path = getattr(variable, "path", None)
    return path if path is not None else variable.name


def names_regex(variables, model):
    """A regex matching exactly the paths of `variables` (of `model`), with or without the model's own name in
    front: a Sequential model built by adding layers gives "sequential/dense/kernel", the same model loaded by
    `load_model` "dense/kernel"."""
    prefix = model.name + "/"
    paths = [variable_name(v) for v in variables]
    paths = [p[len(prefix):] if p.startswith(prefix) else p for p in paths]
    return "(?:^|/)(?:" + "|".join(re.escape(p) for p in paths) + ")$"


def momentum_slot(optimizer, variable):
    """The momentum slot of `variable`, or None (none yet, or no momentum)."""
    momentums = getattr(optimizer, "momentums", None)
    if not momentums:
        return None
    try:
        return momentums[optimizer._get_variable_index(variable)]
    except KeyError:
        return None


def all_momentum_slots(optimizer):
    """Every momentum slot a built optimizer has (none before it is built)."""
    return list(getattr(unwrap(optimizer), "momentums", None) or [])


def scale_variable(variable, factor):
    """variable *= factor (eagerly, between steps)."""
    variable.assign(ops.multiply(variable, ops.cast(factor, variable.dtype)))


def build_slots(optimizer, variables, name=None):
    """Build the optimizer (its slots) for `variables` now, unless it is built (Keras 3's `build` runs once)."""
    if not optimizer.built:
        with tf.init_scope():
            optimizer.build(list(variables))


def optimizer_variables(optimizer):
    return list(optimizer.variables)


def backing_variables(variables):
    """The `tf.Variable` behind each Keras variable (what Horovod's TensorFlow collectives take)."""
    return [v.value if isinstance(v, keras.Variable) else v for v in variables]


def unwrap(optimizer):
    """The optimizer a LossScaleOptimizer wraps (mixed precision), else `optimizer` itself."""
    while isinstance(optimizer, _LOSS_SCALE):
        optimizer = optimizer.inner_optimizer
    return optimizer


def counts_skipped_steps(optimizer):
    """False: Keras 3's LossScaleOptimizer does not advance `iterations` on a skipped step."""
    return False


def micro_batches(optimizer):
    """Micro-batches per update: the optimizer's `gradient_accumulation_steps` (Keras 3's accumulation), else 1."""
    return int(getattr(unwrap(optimizer), "gradient_accumulation_steps", None) or 1)


def sums_micro_batches(optimizer):
    """True where hvd_sched's distributed optimizer turns Keras' average of the micro-batches into their sum
    (`average_aggregated_gradients=False`, Horovod's default)."""
    options = getattr(optimizer, "_hvd_sched_allreduce_options", None) or {}
    return options.get("postscale", 1.0) != 1.0


def micro_batch_count(optimizer):
    """The micro-batches run so far: `_iterations` (Keras 3's `iterations` is it // gradient_accumulation_steps)."""
    return int(get_value(unwrap(optimizer)._iterations))


def update_index(optimizer):
    """The update (Detectron's iteration) the step being traced belongs to, as a graph tensor: Keras 3's own
    `iterations`, which counts updates (`_iterations // gradient_accumulation_steps`)."""
    return optimizer.iterations


def is_loss_scaled(optimizer):
    """True for a LossScaleOptimizer, or an hvd_sched optimizer one wraps (seen when it took its
    `loss_scale_factor`)."""
    return isinstance(optimizer, _LOSS_SCALE) or bool(getattr(unwrap(optimizer), "_hvd_sched_in_loss_scale", False))


def skips_iterations(optimizer):
    """True for a LossScaleOptimizer: the steps it skips do not count, so batch index and iteration part."""
    return isinstance(optimizer, _LOSS_SCALE)


def learning_rate_variable(optimizer):
    """The variable holding a float learning rate, or None when the LR is a schedule."""
    lr = getattr(unwrap(optimizer), "_learning_rate", None)
    return lr if isinstance(lr, keras.Variable) else None


def in_xla_compilation():
    """True while tracing inside `tf.function(jit_compile=True)` (TensorFlow enters an XLA control-flow context)."""
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def steps_per_execution(model):
    return int(getattr(model, "steps_per_execution", 1) or 1)


def get_value(x):
    return ops.convert_to_numpy(x)


def register(cls, package="hvd_sched"):
    return keras.saving.register_keras_serializable(package=package)(cls)


def layers_of(model):
    """The model and every layer inside it."""
    return list(model._flatten_layers(include_self=True))


def learning_rate_of(optimizer):
    """The optimizer's own learning rate as it holds it (a variable, schedule or callable), or None."""
    return getattr(optimizer, "_learning_rate", None)


def install_schedule(optimizer, schedule_lr):
    """Make `schedule_lr` the learning rate of an optimizer built without it (its __init__ takes no learning_rate;
    Keras 3's base class needs one, so the class passed its own: Keras' setter untracks that variable)."""
    _OPTIMIZER.learning_rate.fset(optimizer, schedule_lr)


def legacy_twin(base):
    """None: Keras 3 has no legacy optimizers (nor `convert_to_legacy_optimizer`)."""
    return None


def register_name(name, cls):
    """Keras finds `cls` under `name` (Keras' global custom objects)."""
    keras.saving.get_custom_objects()[name] = cls


def is_horovod_keras_wrapped(optimizer):
    """True for the class `horovod.tensorflow.keras.DistributedOptimizer` builds (it does not average here)."""
    optimizer = unwrap(optimizer)
    return type(optimizer).__module__.startswith("horovod.") or hasattr(optimizer, "_allreduce_grads")


def is_distributed(optimizer):
    """True for an optimizer that averages gradients over Horovod ranks: hvd_sched's, outermost (also around a
    LossScaleOptimizer), or a plain one Keras put inside a LossScaleOptimizer."""
    return isinstance(optimizer, _DistributedMixin) or isinstance(unwrap(optimizer), _DistributedMixin)


_HOROVOD_KERAS = ("hvd_sched: horovod.tensorflow.keras.DistributedOptimizer does not average gradients on Keras 3 "
                  "(Keras 3's train_step never calls the hooks it overrides, horovod #4290), so the ranks would "
                  "train apart without an error; use hvd_sched.keras.DistributedOptimizer(optimizer) instead")
_LOSS_SCALE_OUTSIDE = (
    "hvd_sched: a LossScaleOptimizer wraps hvd_sched.keras.DistributedOptimizer, so each rank would decide on its "
    "own gradients whether to skip a step, and a rank that skips the allreduce hangs the job; put the loss scaling "
    "inside: DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt)), or set the mixed_float16 policy "
    "before calling DistributedOptimizer (it then does so itself)")


def distribution_problem(optimizer):
    """Why this (compiled) optimizer cannot train several Keras 3 ranks correctly, or None."""
    if is_horovod_keras_wrapped(optimizer):
        return _HOROVOD_KERAS
    if isinstance(optimizer, _LOSS_SCALE) and not isinstance(optimizer, _DistributedMixin) \
            and isinstance(unwrap(optimizer), _DistributedMixin):
        return _LOSS_SCALE_OUTSIDE
    return None


class _DistributedMixin:
    """The gradients averaged over the ranks before every update, with Horovod's TensorFlow collectives.

    Without accumulation `apply` averages them first. With `gradient_accumulation_steps` k, each micro-batch's
    gradients are only added to Keras' accumulators, and the average of the k micro-batches is reduced once per
    update, where Keras hands it to `_clip_gradients` inside its update branch: no collective on the other
    micro-batches (Horovod's `backward_passes_per_step`), and clipping sees the reduced gradients, as without
    accumulation.
    """

    _hvd_sched_allreduce_options = {}
    _hvd_sched_ready = False
    _hvd_sched_inside_loss_scale = False
    _hvd_sched_step_variables = None

    def __setattr__(self, name, value):
        # Keras' LossScaleOptimizer sets its inner optimizer's loss_scale_factor to None when it wraps it: the one
        # sign, seen from inside, that this optimizer's apply now runs only on the steps the wrapper keeps.
        if name == "loss_scale_factor" and self._hvd_sched_ready:
            object.__setattr__(self, "_hvd_sched_inside_loss_scale", True)
        super().__setattr__(name, value)

    def apply(self, grads, trainable_variables=None):
        if self._hvd_sched_inside_loss_scale:
            raise ValueError(_LOSS_SCALE_OUTSIDE)
        if (_horovod.size() > 1 or _horovod.is_elastic()) and in_xla_compilation() \
                and not _horovod.xla_ops_enabled():
            raise ValueError(_horovod.XLA_WITH_HOROVOD.format(
                auto="; Keras 3's default jit_compile='auto' turns it on wherever a GPU is visible"))
        if not getattr(self, "gradient_accumulation_steps", None):
            variables = self._trainable_variables if trainable_variables is None else trainable_variables
            grads = _horovod.average_gradients(grads, list(variables), **self._hvd_sched_allreduce_options)
        return super().apply(grads, trainable_variables)

    def _backend_apply_gradients(self, grads, trainable_variables):
        # The variables of this step's gradients, for `groups` given as lists of variables (Python objects, the
        # same in every trace; no tensor kept). object.__setattr__: Keras' tracker would otherwise add them to the
        # optimizer's own variables (and to what model.save writes for it).
        object.__setattr__(self, "_hvd_sched_step_variables", list(trainable_variables))
        return super()._backend_apply_gradients(grads, trainable_variables)

    def _clip_gradients(self, grads):
        if getattr(self, "gradient_accumulation_steps", None):
            grads = _horovod.average_gradients(grads, self._hvd_sched_step_variables,
                                               **self._hvd_sched_allreduce_options)
        return super()._clip_gradients(grads)


_DISTRIBUTED_CLASSES = {}


def _distributed_class(base):
    if base not in _DISTRIBUTED_CLASSES:
        # Horovod's convention: the class keeps its base's name and module, so a saved model loads without it.
        _DISTRIBUTED_CLASSES[base] = type(base.__name__, (_DistributedMixin, base),
                                          {"__module__": base.__module__, "__doc__": base.__doc__})
    return _DISTRIBUTED_CLASSES[base]


def distributed_optimizer(optimizer, *, backward_passes_per_step=1, average_aggregated_gradients=False,
                          name=None, scale_local_gradients=True, **reduce_options):
    """A new optimizer like `optimizer` whose gradients are reduced over the Horovod ranks before every update.

    `backward_passes_per_step` k > 1 becomes Keras 3's `gradient_accumulation_steps` (which averages the k
    micro-batches); `average_aggregated_gradients=False` (Horovod's default) multiplies the reduced average by
    k, Horovod's sum. `reduce_options`: `_horovod.average_gradients`'s keywords (op, compression, ...).
    """
    if is_horovod_keras_wrapped(optimizer):
        raise ValueError(_HOROVOD_KERAS)
    if scale_local_gradients is not True:
        raise ValueError(f"scale_local_gradients={scale_local_gradients!r}: hvd_sched's Keras 3 "
                         "DistributedOptimizer has no worker-local variables (Horovod's register_local_var) to "
                         "scale; leave scale_local_gradients at its default")
    if not isinstance(optimizer, _LOSS_SCALE) and keras.mixed_precision.global_policy().name == "mixed_float16":
        optimizer = _LOSS_SCALE(optimizer)  # what model.compile would do, but inside the averaging
    k = int(backward_passes_per_step)
    cls = _distributed_class(type(optimizer))
    if isinstance(optimizer, _LOSS_SCALE):
        if k > 1:
            raise ValueError(f"backward_passes_per_step={k} with a LossScaleOptimizer (mixed_float16): a "
                             "non-finite micro-batch would drop out of the average; accumulate under the "
                             "mixed_bfloat16 or float32 policy, or use backward_passes_per_step=1")
        config = optimizer.get_config()
        distributed = cls(optimizer.inner_optimizer, initial_scale=config["initial_scale"],
                          dynamic_growth_steps=config["dynamic_growth_steps"])
    else:
        config = optimizer.get_config()
        if k > 1:
            config["gradient_accumulation_steps"] = k
        distributed = cls.from_config(config)
    postscale = float(k) if k > 1 and not average_aggregated_gradients else 1.0
    distributed._hvd_sched_allreduce_options = dict(reduce_options, postscale=postscale,
                                                    name=name or "hvd_sched_grads")
    distributed._hvd_sched_ready = True
    return distributed


def _refuse_horovod_keras_wrapper():
    """Make `horovod.tensorflow.keras.DistributedOptimizer` raise on Keras 3 instead of training ranks apart.

    The one change hvd_sched makes to Horovod at run time, on Keras 3 only: Horovod's Keras layer builds its
    optimizer with `horovod._keras.create_distributed_optimizer`, looked up at each call, so wrapping that function
    also stops `from horovod.tensorflow.keras import DistributedOptimizer` done before hvd_sched was imported.
    """
    try:
        import horovod._keras as horovod_keras
    except ImportError:
        return
    original = horovod_keras.create_distributed_optimizer
    if getattr(original, "_hvd_sched_refuses", False):
        return

    def create_distributed_optimizer(*args, **kwargs):
        keras_module = kwargs["keras"] if "keras" in kwargs else args[0]
        if str(getattr(keras_module, "__version__", "")).startswith("3"):
            raise ValueError(_HOROVOD_KERAS)
        return original(*args, **kwargs)

    create_distributed_optimizer._hvd_sched_refuses = True
    horovod_keras.create_distributed_optimizer = create_distributed_optimizer


_refuse_horovod_keras_wrapper()


# The per-version half of ScheduledOptimizer (see `_keras2` for the Keras 2 mixins).


class _Keras3Mixin:
    """Keras 3 optimizers: the multiplier scales the `learning_rate` argument, the factor is the step's variable."""

    def __setattr__(self, name, value):
        # As in _DistributedMixin: a LossScaleOptimizer taking this optimizer sets its loss_scale_factor to None.
        if name == "loss_scale_factor" and getattr(self, "_hvd_sched", None) is not None:
            object.__setattr__(self, "_hvd_sched_in_loss_scale", True)
        super().__setattr__(name, value)

    @property
    def learning_rate(self):
        # Read from outside the step (a callback, the user): the schedule's LR of the next step, read-only.
        if self._hvd_sched_user_read():
            return self._hvd_sched_current_lr()
        return _OPTIMIZER.learning_rate.fget(self)

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        self._hvd_sched_refuse_new_lr(learning_rate, "optimizer.learning_rate = value")
        _OPTIMIZER.learning_rate.fset(self, learning_rate)

    @property
    def lr(self):
        """Keras 2's alias of `learning_rate` (Keras 3 has none; an assignment would otherwise add an attribute
        that nothing reads)."""
        return self.learning_rate

    @lr.setter
    def lr(self, learning_rate):
        self._hvd_sched_refuse_new_lr(learning_rate, "optimizer.lr = value")
        self.learning_rate = learning_rate

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        variables = list(self._trainable_variables if trainable_variables is None else trainable_variables)
        problem = distribution_problem(self)
        if problem:
            raise ValueError(problem)
        updating = self._hvd_sched_updating
        self._hvd_sched_updating = True  # Keras' own LR reads in the step (also eager, run_eagerly=True)
        try:
            self._hvd_sched_before_step(variables, [v for g, v in zip(grads, variables) if g is not None])
            return super().apply(grads, trainable_variables)
        finally:
            self._hvd_sched_updating = updating

    def set_weights(self, weights):
        """Keras' `set_weights`, also from a plain optimizer of the same class: its weights are [iterations,
        learning_rate, slots...], where a scheduled one has no learning_rate variable (the schedule is the LR), so
        that one weight is left out. (The other way round, `plain.set_weights(scheduled.get_weights())`, Keras
        refuses; insert the LR: `[w[0], lr, *w[1:]]`.)"""
        weights = list(weights)
        mine = list(self._variables)
        if len(weights) == len(mine) + 1 and len(weights) > 1 and np.ndim(weights[1]) == 0 \
                and all(np.shape(w) == tuple(v.shape) for w, v in zip([weights[0], *weights[2:]], mine)):
            weights = [weights[0], *weights[2:]]
        return super().set_weights(weights)

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        multiplier, decay = self._hvd_sched_rules_for(variable_name(self._trainable_variables[index]))
        gradient = self._hvd_sched_decayed(gradient, variable, decay)
        if multiplier != 1.0:
            learning_rate = ops.multiply(learning_rate, ops.cast(multiplier, learning_rate.dtype))
        step_momentum = self._hvd_sched_step_momentum()
        if step_momentum is not None:
            return self._sgd_update_with_correction(gradient, variable, learning_rate, self.momentums[index],
                                                    step_momentum)
        return super().update_step(gradient, variable, learning_rate)

    def _sgd_update_with_correction(self, gradient, variable, learning_rate, m, step_momentum):
        """Keras 3's `SGD.update_step` with the slot's coefficient momentum x factor (Detectron's V *=
        new_lr/old_lr first), read from the step's variable; the momentum itself on steps without a correction."""
        learning_rate = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        momentum = ops.cast(self.momentum, variable.dtype)
        coefficient = ops.cast(step_momentum, variable.dtype)
        self.assign(m, ops.subtract(ops.multiply(m, coefficient), ops.multiply(gradient, learning_rate)))
        if self.nesterov:
            self.assign_add(variable, ops.subtract(ops.multiply(m, momentum), ops.multiply(gradient, learning_rate)))
        else:
            self.assign_add(variable, m)


def scheduled_mixin(base):
    """(the mixin for the Keras optimizer class `base`, False: no legacy naming on Keras 3)."""
    if issubclass(base, _LOSS_SCALE) or not issubclass(base, _OPTIMIZER):
        raise TypeError(f"ScheduledOptimizer wraps a Keras optimizer, got class {base.__name__}")
    return _Keras3Mixin, False


def folds_factor(optimizer):
    """True where the factor multiplies the slot inside the update (SGD); else a tf.cond rescales the slots."""
    return isinstance(optimizer, _SGD)
