"""Every Keras 2 internal hvd_sched relies on (tf.keras 2.15, tf-keras 2.20 and 2.21), in one place.

Keras 2 here means the TF 2.11+ optimizers (`tf.keras.optimizers.*`: `update_step(gradient, variable)`, slots in
`optimizer.momentums`, per-variable XLA in `_update_step_xla`) and the legacy OptimizerV2 ones
(`tf.keras.optimizers.legacy.*`: `_resource_apply_dense`, `get_slot`). `hvd_sched.keras._backend` exports this
module's names on a Keras 2 stack, `_keras3` has the same names for Keras 3; the public modules use only those.
tests/keras/test_hooks.py names every hook below and fails, naming it, when a Keras release changes it.
"""

import re

import tensorflow as tf
from tensorflow.python.ops import control_flow_util  # XLA context of the graph being traced (no public API)

from . import _keras_api

__all__ = list(_keras_api.NAMES)

KERAS_MAJOR = 2
"""The major version of the Keras that `tf.keras` is on this stack: 2 or 3 (`hvd_sched.keras` picks its
Keras 2 or Keras 3 internals by it, once, at import; the public names are the same on both)."""
keras = tf.keras
LearningRateSchedule = tf.keras.optimizers.schedules.LearningRateSchedule
_NEW = tf.keras.optimizers.Optimizer
_LEGACY = tf.keras.optimizers.legacy.Optimizer
_NEW_SGD = tf.keras.optimizers.SGD
_LEGACY_SGD = tf.keras.optimizers.legacy.SGD
_LOSS_SCALE = tf.keras.mixed_precision.LossScaleOptimizer
OPTIMIZER_TYPES = (_NEW, _LEGACY)
#: Keras' optimizers whose scheduled classes exist from import on (so `load_model` finds them by name).
BUILTIN_OPTIMIZERS = (tf.keras.optimizers.SGD, tf.keras.optimizers.Adam, tf.keras.optimizers.AdamW,
                      tf.keras.optimizers.RMSprop, tf.keras.optimizers.Nadam, tf.keras.optimizers.Adagrad,
                      tf.keras.optimizers.legacy.SGD, tf.keras.optimizers.legacy.Adam,
                      tf.keras.optimizers.legacy.RMSprop)

#: The Keras/TensorFlow internals used here: (owner, attribute). tests/keras/test_hooks.py checks each exists.
HOOKS = (
    (_NEW, "_index_dict"), (_NEW, "_var_key"), (_NEW, "_update_step_xla"), (_NEW, "update_step"),
    (_NEW, "_current_learning_rate"), (_NEW_SGD, "momentums"),
    (_LEGACY, "_create_all_weights"), (_LEGACY, "_fallback_apply_state"), (_LEGACY, "_resource_apply_dense"),
    (_LEGACY, "_resource_apply_sparse"), (_LEGACY, "_slots"), (_LEGACY, "_name"),
    (_NEW, "_is_wrapped_by_loss_scale_optimizer"), (_NEW, "_learning_rate"), (_NEW, "_build_learning_rate"),
    (_LEGACY, "_hyper"), (_LEGACY, "_set_hyper"),
    (_LOSS_SCALE, "inner_optimizer"), (tf.keras.Model, "_steps_per_execution"),
    (control_flow_util, "GraphOrParentsInXlaContext"),
)


def is_optimizer(obj):
    """True for a Keras optimizer (TF 2.11+ or legacy); a LossScaleOptimizer counts too."""
    return isinstance(obj, OPTIMIZER_TYPES)


def is_legacy(optimizer):
    """True for `tf.keras.optimizers.legacy.*` (OptimizerV2), False for the TF 2.11+ optimizers."""
    return isinstance(optimizer, _LEGACY)


def is_sgd(optimizer):
    return isinstance(optimizer, (_NEW_SGD, _LEGACY_SGD))


def momentum_of(optimizer):
    """The momentum coefficient as a float (legacy SGD: 1.0 or 0.0, whether it built momentum slots)."""
    if is_legacy(optimizer):
        return 1.0 if getattr(optimizer, "_momentum", False) else 0.0  # OptimizerV2 decides at construction
    momentum = getattr(optimizer, "momentum", 0.0)
    return float(momentum) if isinstance(momentum, (int, float)) else 1.0


def is_variable(obj):
    return isinstance(obj, tf.Variable)


def variable_name(variable):
    """The name the per-variable rules match: `variable.name`, e.g. "dense/kernel:0"."""
    return variable.name


def names_regex(variables, model):
    """A regex matching exactly the names of `variables` (of `model`): "^(?:dense/kernel:0|...)$"."""
    return "^(?:" + "|".join(re.escape(variable_name(v)) for v in variables) + ")$"


def momentum_slot(optimizer, variable):
    """The momentum slot of `variable`, or None (none yet, or no momentum)."""
    if is_legacy(optimizer):
        try:
            return optimizer.get_slot(variable, "momentum")
        except KeyError:
            return None
    momentums = getattr(optimizer, "momentums", None)
    index = getattr(optimizer, "_index_dict", None)
    if not momentums or index is None or optimizer._var_key(variable) not in index:
        return None
    return momentums[index[optimizer._var_key(variable)]]


def all_momentum_slots(optimizer):
    """Every momentum slot a built optimizer has (none before its first step)."""
    optimizer = unwrap(optimizer)
    if is_legacy(optimizer):
        return [slots["momentum"] for slots in optimizer._slots.values() if "momentum" in slots]
    return list(getattr(optimizer, "momentums", None) or [])


def build_slots(optimizer, variables, name=None):
    """Create the optimizer's slots for `variables` now (idempotent), as its first apply_gradients would.

    The name scope matches the one Keras opens there, so slot names do not depend on who built them first.
    """
    optimizer = unwrap(optimizer)
    scope = name or (optimizer._name if is_legacy(optimizer) else optimizer.name) or "optimizer"
    with tf.name_scope(scope):
        with tf.init_scope():
            if is_legacy(optimizer):
                optimizer._create_all_weights(variables)
            else:
                optimizer.build(variables)


def scale_variable(variable, factor):
    """variable *= factor (eagerly, between steps)."""
    variable.assign(variable * tf.cast(factor, variable.dtype))


def optimizer_variables(optimizer):
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def backing_variables(variables):
    """The `tf.Variable`s behind Keras variables (Keras 2 variables are tf.Variables)."""
    return list(variables)


def layers_of(model):
    """The model and every layer inside it."""
    return [model, *model.submodules]


def unwrap(optimizer):
    """The optimizer a LossScaleOptimizer wraps (mixed precision), else `optimizer` itself."""
    while isinstance(optimizer, _LOSS_SCALE):
        optimizer = optimizer.inner_optimizer
    return optimizer


def counts_skipped_steps(optimizer):
    """True when a LossScaleOptimizer wraps `optimizer` (Keras 2 marks the inner optimizer): a step it skips for
    non-finite gradients still advances `iterations`, so a correction due then must wait for the next applied
    step (`_tables.graph_factor_since`)."""
    return bool(getattr(optimizer, "_is_wrapped_by_loss_scale_optimizer", False))


def micro_batches(optimizer):
    """Micro-batches per update: Horovod's `backward_passes_per_step` where its Keras wrapper accumulates
    (`_agg_helper`, set by `hvd.DistributedOptimizer(..., backward_passes_per_step=k)` for k > 1), else 1."""
    helper = getattr(unwrap(optimizer), "_agg_helper", None)
    return int(helper.backward_passes_per_step) if helper is not None else 1


def sums_micro_batches(optimizer):
    """True where Horovod's accumulation sums the micro-batches (`average_aggregated_gradients=False`)."""
    helper = getattr(unwrap(optimizer), "_agg_helper", None)
    return helper is not None and not helper.average_aggregated_gradients


def micro_batch_count(optimizer):
    """The micro-batches run so far: Keras 2's `iterations`, which Horovod's accumulation advances on every
    micro-batch (on the ones it only accumulates too)."""
    return int(get_value(unwrap(optimizer).iterations))


def update_index(optimizer):
    """The update (Detectron's iteration) the step being traced applies, as a graph tensor: `iterations // k`.

    Horovod's accumulation applies on the k-th micro-batch of each update, when `iterations` is k*u + k-1; with
    k = 1 this is `iterations` itself (the same graph as before accumulation existed).
    """
    k = micro_batches(optimizer)
    return optimizer.iterations if k == 1 else optimizer.iterations // k


def is_loss_scaled(optimizer):
    """True for a LossScaleOptimizer, or an optimizer one wraps (Keras 2 marks the inner one)."""
    return isinstance(optimizer, _LOSS_SCALE) or counts_skipped_steps(unwrap(optimizer))


def skips_iterations(optimizer):
    """False: a Keras 2 LossScaleOptimizer that skips a step still counts it (`iterations.assign_add(1)` in
    its do-not-apply branch), so the iteration of a batch is always epoch start + batch index."""
    return False


def learning_rate_variable(optimizer):
    """The variable holding a float learning rate, or None when the LR is a schedule."""
    lr = unwrap(optimizer).learning_rate
    return lr if isinstance(lr, tf.Variable) else None


def in_xla_compilation():
    """True while tracing inside `tf.function(jit_compile=True)` (TensorFlow enters an XLA control-flow context)."""
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def steps_per_execution(model):
    value = getattr(model, "_steps_per_execution", None)
    return 1 if value is None else int(tf.keras.backend.get_value(value))


def get_value(x):
    return tf.keras.backend.get_value(x)


def register(cls, package="hvd_sched"):
    return tf.keras.utils.register_keras_serializable(package=package)(cls)


def learning_rate_of(optimizer):
    """The optimizer's own learning rate as it holds it (a variable, float, schedule or callable), or None."""
    if is_legacy(optimizer):
        return getattr(optimizer, "_hyper", {}).get("learning_rate")
    return getattr(optimizer, "_learning_rate", None)


def install_schedule(optimizer, schedule_lr):
    """Make `schedule_lr` the learning rate of an optimizer built without it (its __init__ takes no learning_rate)."""
    if is_legacy(optimizer):
        _LEGACY._set_hyper(optimizer, "learning_rate", schedule_lr)
    else:
        optimizer._learning_rate = optimizer._build_learning_rate(schedule_lr)


def legacy_twin(base):
    """Keras' legacy optimizer class of the same name as Keras' own TF 2.11+ class `base` (Adam ->
    optimizers.legacy.Adam), or None: what `tf.keras.optimizers.convert_to_legacy_optimizer` builds, looked up by
    the lower-cased class name."""
    if issubclass(base, _LEGACY) or not base.__module__.startswith(("keras.", "tf_keras.")):
        return None
    twin = getattr(tf.keras.optimizers.legacy, base.__name__, None)
    return twin if isinstance(twin, type) and issubclass(twin, _LEGACY) else None


def register_name(name, cls):
    """Keras finds `cls` under `name` (Keras' global custom objects)."""
    tf.keras.utils.get_custom_objects()[name] = cls


def is_horovod_keras_wrapped(optimizer):
    """True for the dynamic class `horovod.tensorflow.keras.DistributedOptimizer` returns."""
    optimizer = unwrap(optimizer)
    return type(optimizer).__module__.startswith("horovod.") or hasattr(optimizer, "_allreduce_grads")


def is_distributed(optimizer):
    """True for an optimizer that averages gradients over Horovod ranks (on Keras 2: Horovod's own wrapper)."""
    return is_horovod_keras_wrapped(optimizer)


def distributed_optimizer(optimizer, **kwargs):
    """Horovod's own `DistributedOptimizer` (it allreduces in `_compute_gradients`, which Keras 2 calls).

    With `op=hvd.Adasum` the same optimizer is built by the function behind it (`horovod._keras.
    create_distributed_optimizer`, with Horovod's defaults): Horovod's Keras front refuses Adasum ("op currently
    only supports Average and Sum"), but the optimizer it builds reduces each gradient with
    `horovod.tensorflow.allreduce(op=op)`, which runs Adasum (hvd_sched checked MPI, the rank count and groups).
    """
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd

    if kwargs.get("op") is not None and kwargs["op"] == hvd_tf.Adasum:
        import horovod._keras as horovod_keras

        options = {"name": None, "device_dense": "", "device_sparse": "", "compression": hvd.Compression.none,
                   "sparse_as_dense": False, "gradient_predivide_factor": 1.0, "backward_passes_per_step": 1,
                   "average_aggregated_gradients": False, "groups": None,
                   "process_set": hvd_tf.global_process_set, "scale_local_gradients": True}
        options.update(kwargs)
        return _not_in_saved_models(
            horovod_keras.create_distributed_optimizer(keras=hvd.keras, optimizer=optimizer, **options))
    return _not_in_saved_models(hvd.DistributedOptimizer(optimizer, **kwargs))


class _NotSaved:
    """A callable around Horovod's gradient allreduce (a `tf.function`) that a SavedModel does not save.

    Horovod's Keras 2 wrapper keeps its allreduce as the optimizer's attribute `_allreduce_grads`, a `tf.function`;
    `model.save(dir, save_format="tf")` and `tf.saved_model.save` save every `tf.function` an object holds, with
    the graphs traced in training, so the SavedModel holds `HorovodAllreduce` ops and does not load where Horovod
    is absent ("Op type not registered 'HorovodAllreduce'", even with compile=False: horovod #4028). Held in this
    plain object the function is called as before and saved nowhere: the serving graph has no collective.
    """

    __slots__ = ("function",)

    def __init__(self, function):
        self.function = function

    def __call__(self, *args, **kwargs):
        return self.function(*args, **kwargs)


def _not_in_saved_models(optimizer):
    """`optimizer` (Horovod's wrapper) with its allreduce function out of every SavedModel (see `_NotSaved`)."""
    function = getattr(optimizer, "_allreduce_grads", None)
    if function is not None and not isinstance(function, _NotSaved):
        # Deleted first: an AutoTrackable optimizer (tf-keras') recorded the tf.function as a dependency when
        # Horovod set it, and a new value of the attribute alone leaves that record, which SavedModels follow.
        delattr(optimizer, "_allreduce_grads")
        optimizer._allreduce_grads = _NotSaved(function)
    return optimizer


def distribution_problem(optimizer):
    """None: on Keras 2, Horovod's wrapper averages in `compute_gradients`, which a LossScaleOptimizer calls before
    its finite check, so every rank takes the same skip decision; and no other wrapper exists to confuse."""
    return None


# The per-version half of ScheduledOptimizer. `hvd_sched.keras._scheduled` builds each scheduled class as
# (mixin, _ScheduledBase, the Keras class); the mixins call the base's `_hvd_sched_*` methods for everything that
# does not depend on Keras' internals.


class _StepStart:
    """Both Keras 2 families start a step in `apply_gradients(grads_and_vars, name=None, ...)`."""

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        updating = self._hvd_sched_updating
        self._hvd_sched_updating = True  # Keras' own LR reads in the step (also eager, run_eagerly=True)
        try:
            self._hvd_sched_before_step([v for _, v in grads_and_vars],
                                        [v for g, v in grads_and_vars if g is not None], kwargs.get("name"))
            return super().apply_gradients(grads_and_vars, *args, **kwargs)
        finally:
            self._hvd_sched_updating = updating


class _NewMixin(_StepStart):
    """TF 2.11+ optimizers: the LR multiplier acts through the `learning_rate` property, the factor through the
    step's variable (both read inside `update_step`, which Keras may trace inside `_update_step_xla`)."""

    _hvd_sched_lr_factor = None  # a Python float while one variable's update_step is traced

    @property
    def learning_rate(self):
        # Read from outside the step (a callback, the user): the schedule's LR of the next step, read-only. Keras'
        # own `lr` reads this property too.
        if self._hvd_sched_user_read():
            return self._hvd_sched_current_lr()
        lr = super().learning_rate
        factor = self._hvd_sched_lr_factor
        return lr if factor is None else lr * tf.cast(factor, lr.dtype)

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        self._hvd_sched_refuse_new_lr(learning_rate, "optimizer.learning_rate = value, or optimizer.lr = value")
        _NEW.learning_rate.fset(self, learning_rate)

    def update_step(self, gradient, variable):
        index = self._index_dict[self._var_key(variable)]
        multiplier, decay = self._hvd_sched_rules_for(variable.name)
        # The decay enters the gradient first, so the LR multiplier below scales it too: Caffe2's
        # WeightDecayBuilder rewrites the gradient before the optimizer, whose LR carries any multiplier.
        gradient = self._hvd_sched_decayed(gradient, variable, decay)
        self._hvd_sched_lr_factor = None if multiplier == 1.0 else multiplier
        try:
            step_momentum = self._hvd_sched_step_momentum()
            if step_momentum is not None:
                return self._sgd_update_with_correction(gradient, variable, self.momentums[index], step_momentum)
            return super().update_step(gradient, variable)
        finally:
            self._hvd_sched_lr_factor = None

    def _sgd_update_with_correction(self, gradient, variable, m, step_momentum):
        """Keras 2's `SGD.update_step` with the slot's coefficient momentum x factor (Detectron's V *=
        new_lr/old_lr before the update), read from the step's variable.

        The same arithmetic as scaling the slot and then running SGD.update_step, up to float32 rounding (~1e-7 on
        the tests' model); on steps without a correction the coefficient is the momentum itself, bit for bit.
        """
        lr = tf.cast(self.learning_rate, variable.dtype)
        momentum = tf.cast(self.momentum, variable.dtype)
        coefficient = tf.cast(step_momentum, variable.dtype)
        if isinstance(gradient, tf.IndexedSlices):
            add_value = tf.IndexedSlices(-gradient.values * lr, gradient.indices)
            m.assign(m * coefficient)
            m.scatter_add(add_value)
            if self.nesterov:
                variable.scatter_add(add_value)
                variable.assign_add(m * momentum)
            else:
                variable.assign_add(m)
        else:
            m.assign(-gradient * lr + m * coefficient)
            if self.nesterov:
                variable.assign_add(-gradient * lr + m * momentum)
            else:
                variable.assign_add(m)


class _LegacyMixin(_StepStart):
    """`tf.keras.optimizers.legacy.*`: the LR multiplier scales the per-variable `lr_t` coefficients; the slots are
    rescaled behind a `tf.cond` that is false on steps without a correction.

    OptimizerV2 keeps the LR among its hyperparameters (`_hyper`), reached through `__getattribute__` /
    `__setattr__` for `lr` and `learning_rate`: an assignment would replace the schedule (and `opt.lr` would be the
    schedule object itself); here reads give the schedule's LR and writes are refused."""

    def _hvd_sched_lr(self):
        if self._hvd_sched_user_read():
            return self._hvd_sched_current_lr()
        return self._get_hyper("learning_rate")

    def _hvd_sched_set_lr(self, value):
        self._hvd_sched_refuse_new_lr(value, "optimizer.learning_rate = value, or optimizer.lr = value")
        _LEGACY._set_hyper(self, "learning_rate", value)

    learning_rate = property(_hvd_sched_lr, _hvd_sched_set_lr)
    lr = property(_hvd_sched_lr, _hvd_sched_set_lr)

    def __setattr__(self, name, value):
        if name in ("lr", "learning_rate"):  # OptimizerV2.__setattr__ would go to _set_hyper directly
            self._hvd_sched_refuse_new_lr(value, f"optimizer.{name} = value")
        super().__setattr__(name, value)

    def _set_hyper(self, name, value):
        if name == "learning_rate":
            self._hvd_sched_refuse_new_lr(value, "optimizer._set_hyper('learning_rate', value)")
        super()._set_hyper(name, value)

    def _scaled_state(self, var, apply_state):
        factor = self._hvd_sched_rules_for(var.name)[0]
        if factor == 1.0:
            return apply_state
        key = (var.device, var.dtype.base_dtype)
        coefficients = dict((apply_state or {}).get(key) or self._fallback_apply_state(*key))
        for name in ("lr_t", "lr"):
            if name in coefficients:
                coefficients[name] = coefficients[name] * tf.cast(factor, coefficients[name].dtype)
        return {key: coefficients}

    def _resource_apply_dense(self, grad, var, apply_state=None):
        grad = self._hvd_sched_decayed(grad, var, self._hvd_sched_rules_for(var.name)[1])
        return super()._resource_apply_dense(grad, var, apply_state=self._scaled_state(var, apply_state))

    def _resource_apply_sparse(self, grad, var, indices, apply_state=None):
        decay = self._hvd_sched_rules_for(var.name)[1]
        if decay != 0.0:
            # L2 decays every row: apply the densified, decayed gradient.
            dense = tf.math.unsorted_segment_sum(grad, indices, tf.shape(var, out_type=indices.dtype)[0])
            return super()._resource_apply_dense(self._hvd_sched_decayed(dense, var, decay), var,
                                                 apply_state=self._scaled_state(var, apply_state))
        return super()._resource_apply_sparse(grad, var, indices, apply_state=self._scaled_state(var, apply_state))


def scheduled_mixin(base):
    """(the mixin for the Keras optimizer class `base`, whether it is Keras' own legacy class)."""
    if issubclass(base, _LEGACY):
        # Keras' own legacy classes share their plain names with the TF 2.11+ ones (SGD, Adam); the caller names
        # them "ScheduledLegacy<Name>" (`keras.` on TF 2.15, `tf_keras.` where tf.keras is the tf-keras package).
        return _LegacyMixin, base.__module__.startswith(("keras.", "tf_keras."))
    if issubclass(base, _NEW):
        return _NewMixin, False
    raise TypeError(f"ScheduledOptimizer wraps a tf.keras optimizer, got class {base.__name__}")


def folds_factor(optimizer):
    """True where the factor multiplies the slot inside the update (SGD); else a tf.cond rescales the slots."""
    return isinstance(optimizer, _NEW_SGD)
