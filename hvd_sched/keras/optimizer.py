"""`ScheduledOptimizer`: Detectron's solver inside a Keras optimizer, composable with `hvd.DistributedOptimizer`.

Like `hvd.DistributedOptimizer`, `ScheduledOptimizer(opt, schedule)` returns an instance of a subclass of
`type(opt)` rebuilt from `opt.get_config()`. The subclass

- sets the learning rate to `ScheduleLR(schedule)`: the LR at `optimizer.iterations`, computed in-graph from
  the schedule's segments with the same float operations as `schedule.lr_at` (no table, no Python per batch);
- before the update of a step whose LR jumped (Detectron's `_SetNewLr` rule, or every change, or never),
  multiplies every momentum slot by new_lr/old_lr inside the same compiled step. Keras' SGD slot is
  m = mu*m - lr*g, the negative of Detectron's V = mu*V + lr*g, so the same factor applies (also for Nesterov,
  whose update reads the same slot). For SGD the factor (the correction rule applied in-graph to the LRs of
  this and the previous iteration, 1.0 on steps without a correction) multiplies the slot inside the update
  expression itself: no `tf.cond` and no extra pass over the slots, which kept the per-step cost near that of a plain LR schedule (see bench/). Legacy
  optimizers rescale behind a `tf.cond` that is false on steps without a correction;
- applies `lr_multipliers` (variable-name regex -> factor): matching variables use lr * factor, as the seed's
  lr_x = lr * LR_FACTOR (Detectron's own convention gives biases 2x the LR);
- applies `weight_decays` (variable-name regex -> decay): coupled L2, `grad += decay * w` before the update, as
  Caffe2's `WeightedSum([grad, ONE, param, WD], grad)` ahead of `MomentumSGDUpdate` (`hvd_sched.keras.
  build_optimizer` derives both rule sets from a model's layers, Detectron's way);
- serializes every option in `get_config()`, so `hvd.DistributedOptimizer`'s `from_config` rebuild,
  `model.save` and `tf.keras.models.load_model` keep the schedule.

Wrap in this order: `hvd.DistributedOptimizer(ScheduledOptimizer(SGD(...), schedule))`; Horovod then
allreduces the gradients and this class's update runs on the averaged gradients.
"""

import re

import numpy as np
import tensorflow as tf

from . import _slots
from ._tables import as_schedule, correction_table, graph_factor
from .lr_schedule import ScheduleLR

__all__ = ["ScheduledOptimizer", "is_scheduled", "scheduled_class", "custom_objects", "load_model"]

_OPTIONS = ("schedule", "momentum_correction", "correction_threshold", "lr_multipliers", "weight_decays",
            "log_corrections")
_RULE_VALUES = {"lr_multipliers": "factor", "weight_decays": "decay"}


def _validate_rules(argument, rules):
    """`rules` (dict of variable-name regex -> number >= 0, in order) as ((pattern, compiled, float), ...)."""
    if rules is None:
        return ()
    if not isinstance(rules, dict):
        raise TypeError(f"{argument} must be a dict of variable-name regex -> {_RULE_VALUES[argument]}, got "
                        f"{type(rules).__name__}: {rules!r}")
    pairs = []
    for pattern, value in rules.items():
        if not isinstance(pattern, str):
            raise TypeError(f"{argument} keys must be regex strings, got {pattern!r}")
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{argument} key {pattern!r} is not a valid regex: {exc}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) \
                or value < 0:
            raise ValueError(f"{argument}[{pattern!r}] must be a finite number >= 0, got {value!r}")
        pairs.append((pattern, compiled, float(value)))
    return tuple(pairs)


def _first_match(rules, name, default):
    for _, compiled, value in rules:
        if compiled.search(name):
            return value
    return default


class _Options:
    """The wrapper's settings, kept out of TensorFlow's attribute tracking (which wraps dicts and lists)."""

    def __init__(self, optimizer, schedule_lr, momentum_correction, correction_threshold, lr_multipliers,
                 log_corrections):
        self.schedule_lr = schedule_lr
        self.schedule = schedule_lr.schedule
        self.momentum_correction = momentum_correction
        if correction_threshold is not None and (isinstance(correction_threshold, bool) or
                                                 not isinstance(correction_threshold, (int, float)) or
                                                 not correction_threshold >= 1):
            raise ValueError(f"correction_threshold must be a number >= 1 (Detectron's SCALE_MOMENTUM_THRESHOLD), "
                             f"got {correction_threshold!r}")
        self.correction_threshold = correction_threshold
        self.multipliers = _validate_rules("lr_multipliers", lr_multipliers)
        self.decays = ()  # set by set_weight_decays
        self.log_corrections = bool(log_corrections)
        self.mode = _slots.resolve_correction_mode(optimizer, self.schedule, momentum_correction)
        threshold = (self.schedule.scale_momentum_threshold if correction_threshold is None
                     else float(correction_threshold))
        self.threshold = threshold
        # The corrections as a lookup table (None: too many, the rule runs in-graph instead).
        self.table = correction_table(self.schedule, self.mode, threshold)
        self.checked_multipliers = False

    @property
    def has_corrections(self):
        """True when the rule fires at least once (a table with entries, or too many for a table)."""
        return self.table is None or self.table[0].size > 0

    def config(self):
        return {
            "schedule": self.schedule.get_config(),
            "momentum_correction": self.momentum_correction,
            "correction_threshold": self.correction_threshold,
            "lr_multipliers": {p: f for p, _, f in self.multipliers} or None,
            "weight_decays": {p: d for p, _, d in self.decays} or None,
            "log_corrections": self.log_corrections,
        }

    def set_weight_decays(self, weight_decays):
        self.decays = _validate_rules("weight_decays", weight_decays)

    def multiplier(self, variable):
        return _first_match(self.multipliers, variable.name, 1.0)

    def weight_decay(self, variable):
        return _first_match(self.decays, variable.name, 0.0)

    def check_multipliers(self, variables):
        """Every pattern must match a trainable variable; a typo would silently train at the base LR (or, for
        weight_decays, without the decay)."""
        if self.checked_multipliers:
            return
        check_rules(self, [v.name for v in variables])
        self.checked_multipliers = True


def check_rules(options, names):
    """A ValueError naming the first `lr_multipliers` / `weight_decays` pattern that matches none of `names`."""
    for argument, rules in (("lr_multipliers", options.multipliers), ("weight_decays", options.decays)):
        for pattern, compiled, _ in rules:
            if not any(compiled.search(name) for name in names):
                raise ValueError(f"{argument} pattern {pattern!r} matches no trainable variable; the variable "
                                 f"names are {names}. Fix the regex (it is searched with re.search) or remove it.")


class _ScheduledBase:
    """Shared by the subclasses of the TF 2.11+ and the legacy (OptimizerV2) optimizers."""

    _hvd_sched_factor = None  # this step's slot factor while an SGD step is traced (see apply_gradients)

    def __init__(self, schedule, momentum_correction=None, correction_threshold=None, lr_multipliers=None,
                 weight_decays=None, log_corrections=True, **kwargs):
        kwargs.pop("learning_rate", None)
        kwargs.pop("lr", None)
        decays = _validate_rules("weight_decays", weight_decays)
        if decays and kwargs.get("weight_decay"):
            raise ValueError(_BOTH_DECAYS.format(cls=type(self).__name__, wd=kwargs["weight_decay"]))
        schedule_lr = ScheduleLR(as_schedule(schedule))
        with tf.init_scope():
            schedule_lr.scale = tf.Variable(1.0, trainable=False, dtype=tf.float32, name="hvd_sched_lr_scale")
        super().__init__(learning_rate=schedule_lr, **kwargs)
        self._hvd_sched_lr_scale_var = schedule_lr.scale  # tracked: checkpoints keep the world-size scale
        self._hvd_sched = _Options(self, schedule_lr, momentum_correction, correction_threshold, lr_multipliers,
                                   log_corrections)
        self._hvd_sched.set_weight_decays(weight_decays)

    @property
    def schedule(self):
        """The hvd_sched `Schedule` this optimizer follows."""
        return self._hvd_sched.schedule

    @property
    def momentum_correction_mode(self):
        """The correction mode in force: "threshold", "every_change" or "off"."""
        return self._hvd_sched.mode

    @property
    def lr_multipliers(self):
        """The `lr_multipliers` rules (variable-name regex -> LR factor, first match wins), a new dict."""
        return {pattern: factor for pattern, _, factor in self._hvd_sched.multipliers}

    @property
    def weight_decays(self):
        """The `weight_decays` rules (variable-name regex -> coupled L2 decay, first match wins), a new dict."""
        return {pattern: decay for pattern, _, decay in self._hvd_sched.decays}

    def lr_multiplier_for(self, variable):
        """The LR factor the rules give `variable` (a variable or its name): the first match, else 1.0."""
        return _first_match(self._hvd_sched.multipliers, _name(variable), 1.0)

    def weight_decay_for(self, variable):
        """The coupled weight decay the rules give `variable` (a variable or its name): the first match, else 0."""
        return _first_match(self._hvd_sched.decays, _name(variable), 0.0)

    def check_rules(self, variables):
        """Raise a ValueError now if an `lr_multipliers` or `weight_decays` pattern matches none of `variables`
        (the first step checks the same against the variables it trains)."""
        check_rules(self._hvd_sched, [_name(v) for v in variables])

    @property
    def lr_scale(self):
        """The factor on the schedule's LR (1.0 unless `set_lr_scale` changed it, e.g. on an elastic reset)."""
        return float(self._hvd_sched_lr_scale_var.numpy())

    def lr_at(self, iteration):
        """The LR this optimizer uses at `iteration`: `schedule.lr_at(iteration) * lr_scale`, in float32."""
        return float(np.float32(self.schedule.lr_at(iteration)) * np.float32(self.lr_scale))

    def set_lr_scale(self, scale):
        """Scale the whole schedule by `scale` from the next step on, rescaling the momentum slots to match.

        The linear scaling rule after a world-size change (elastic Horovod): the LR of every later iteration is
        `schedule.lr_at(it) * scale`, and, as the LR jumps by new_scale/old_scale, the momentum slots are
        multiplied by that factor (where they carry the LR and the correction is not off), exactly as at a
        scheduled LR jump. Call it between steps (eagerly), e.g. from an elastic reset callback.

        Args:
            scale: a positive finite number.

        Returns:
            The float32 factor applied to the slots (1.0 if none were rescaled).
        """
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not np.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale must be a positive finite number, got {scale!r}")
        old = np.float32(self.lr_scale)
        new = np.float32(scale)
        factor = np.float32(new / old)
        applied = np.float32(1.0)
        if factor != 1 and self._hvd_sched.mode != "off":
            for slot in _slots.all_momentum_slots(self):
                slot.assign(slot * tf.cast(factor, slot.dtype))
            applied = factor
        self._hvd_sched_lr_scale_var.assign(new)
        return float(applied)

    def get_config(self):
        config = super().get_config()
        config.pop("learning_rate", None)  # derived from the schedule
        config.update(self._hvd_sched.config())
        return config

    def _hvd_sched_step_factor(self):
        """This step's slot factor from the rule on this and the previous iteration's LR (1.0 on most steps)."""
        options = self._hvd_sched
        with tf.name_scope("hvd_sched_momentum_correction"):
            return graph_factor(options.schedule, self.iterations, options.mode, options.threshold, options.table)

    def _hvd_sched_rescale(self, variables):
        """Multiply the momentum slots by this step's factor, behind a tf.cond that is false on most steps."""
        slots = _slots.momentum_slots(self, variables)
        if not slots:
            return
        factor = self._hvd_sched_step_factor()

        def rescale():
            for slot in slots:
                slot.assign(slot * tf.cast(factor, slot.dtype))
            return tf.constant(True)

        tf.cond(tf.not_equal(factor, 1.0), rescale, lambda: tf.constant(False))

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        variables = [v for _, v in grads_and_vars]
        if self._hvd_sched.multipliers or self._hvd_sched.decays:
            self._hvd_sched.check_multipliers([v for g, v in grads_and_vars if g is not None])
        if variables and self._hvd_sched.has_corrections:
            _slots.build_slots(self, variables, kwargs.get("name"))
            if self._hvd_sched_folds_factor():
                # SGD: the factor multiplies the slot inside the update itself (no tf.cond, no extra pass).
                self._hvd_sched_factor = self._hvd_sched_step_factor()
            else:
                self._hvd_sched_rescale(variables)
        try:
            return super().apply_gradients(grads_and_vars, *args, **kwargs)
        finally:
            self._hvd_sched_factor = None

    def _hvd_sched_folds_factor(self):
        return False

    def _hvd_sched_decayed(self, gradient, variable):
        """`gradient + decay * variable` (Caffe2's WeightedSum), or `gradient` itself where the decay is 0.

        A sparse gradient becomes dense: L2 decays every row of the variable, not only the rows in the batch.
        """
        decay = self._hvd_sched.weight_decay(variable) if self._hvd_sched.decays else 0.0
        if decay == 0.0:
            return gradient
        if isinstance(gradient, tf.IndexedSlices):
            gradient = tf.convert_to_tensor(gradient)
        return gradient + tf.cast(decay, variable.dtype) * variable


def _name(variable):
    return variable if isinstance(variable, str) else variable.name


_BOTH_DECAYS = ("weight_decays= (coupled L2: grad += decay * w before the update, Detectron/Caffe2) and the "
                "optimizer's own weight_decay={wd!r} ({cls}: decoupled, w -= lr * wd * w after it) would both decay "
                "the weights; build the optimizer without weight_decay= (e.g. tf.keras.optimizers.SGD(momentum=0.9))")


class _ScheduledNew(_ScheduledBase):
    """For `tf.keras.optimizers.*` (TF 2.11+): the LR multiplier acts through the `learning_rate` property."""

    _hvd_sched_lr_scale = None

    @property
    def learning_rate(self):
        lr = super().learning_rate
        scale = self._hvd_sched_lr_scale
        return lr if scale is None else lr * tf.cast(scale, lr.dtype)

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        if getattr(self, "_hvd_sched", None) is not None:
            raise TypeError("the learning rate of a ScheduledOptimizer comes from its schedule and cannot be set; "
                            "build a new schedule (or use hvd_sched.keras.ScheduleCallback with a plain optimizer)")
        tf.keras.optimizers.Optimizer.learning_rate.fset(self, learning_rate)

    def _hvd_sched_folds_factor(self):
        return isinstance(self, tf.keras.optimizers.SGD)

    def update_step(self, gradient, variable):
        # The decay enters the gradient first, so the LR multiplier below scales it too: Caffe2's
        # WeightDecayBuilder rewrites the gradient before the optimizer, whose LR carries any multiplier.
        gradient = self._hvd_sched_decayed(gradient, variable)
        factor = self._hvd_sched.multiplier(variable) if self._hvd_sched.multipliers else 1.0
        self._hvd_sched_lr_scale = None if factor == 1.0 else factor  # read by `learning_rate` while traced
        try:
            if self._hvd_sched_factor is not None:
                return self._sgd_update_with_correction(gradient, variable, self._hvd_sched_factor)
            return super().update_step(gradient, variable)
        finally:
            self._hvd_sched_lr_scale = None

    def _sgd_update_with_correction(self, gradient, variable, factor):
        """Keras' SGD.update_step with the slot read as m * factor (Detectron's V *= new_lr/old_lr first).

        The same arithmetic as scaling the slot and then running SGD.update_step (Grappler may fuse it
        differently: results agree to float32 rounding, ~1e-7 on the tests' model); on steps without a
        correction the factor is 1.0 and m * 1.0 == m.
        """
        lr = tf.cast(self.learning_rate, variable.dtype)
        momentum = tf.cast(self.momentum, variable.dtype)
        m = self.momentums[self._index_dict[self._var_key(variable)]]
        scaled = m * tf.cast(factor, variable.dtype)
        if isinstance(gradient, tf.IndexedSlices):
            add_value = tf.IndexedSlices(-gradient.values * lr, gradient.indices)
            m.assign(scaled * momentum)
            m.scatter_add(add_value)
            if self.nesterov:
                variable.scatter_add(add_value)
                variable.assign_add(m * momentum)
            else:
                variable.assign_add(m)
        else:
            m.assign(-gradient * lr + scaled * momentum)
            if self.nesterov:
                variable.assign_add(-gradient * lr + m * momentum)
            else:
                variable.assign_add(m)


class _ScheduledLegacy(_ScheduledBase):
    """For `tf.keras.optimizers.legacy.*`: the LR multiplier scales the per-variable `lr_t` coefficients."""

    def _scaled_state(self, var, apply_state):
        factor = self._hvd_sched.multiplier(var) if self._hvd_sched.multipliers else 1.0
        if factor == 1.0:
            return apply_state
        key = (var.device, var.dtype.base_dtype)
        coefficients = dict((apply_state or {}).get(key) or self._fallback_apply_state(*key))
        for name in ("lr_t", "lr"):
            if name in coefficients:
                coefficients[name] = coefficients[name] * tf.cast(factor, coefficients[name].dtype)
        return {key: coefficients}

    def _resource_apply_dense(self, grad, var, apply_state=None):
        grad = self._hvd_sched_decayed(grad, var)
        return super()._resource_apply_dense(grad, var, apply_state=self._scaled_state(var, apply_state))

    def _resource_apply_sparse(self, grad, var, indices, apply_state=None):
        if self._hvd_sched.decays and self._hvd_sched.weight_decay(var) != 0.0:
            # L2 decays every row: apply the densified, decayed gradient.
            dense = tf.math.unsorted_segment_sum(grad, indices, tf.shape(var, out_type=indices.dtype)[0])
            return super()._resource_apply_dense(self._hvd_sched_decayed(dense, var), var,
                                                 apply_state=self._scaled_state(var, apply_state))
        return super()._resource_apply_sparse(grad, var, indices, apply_state=self._scaled_state(var, apply_state))


_CLASSES = {}


def scheduled_class(base):
    """The scheduled subclass of a Keras optimizer class (one per class, registered for `load_model`)."""
    if base in _CLASSES:
        return _CLASSES[base]
    if issubclass(base, _ScheduledBase):
        return base
    legacy = issubclass(base, tf.keras.optimizers.legacy.Optimizer)
    if not legacy and not issubclass(base, tf.keras.optimizers.Optimizer):
        raise TypeError(f"ScheduledOptimizer wraps a tf.keras optimizer, got class {base.__name__}")
    # Keras' own legacy classes share their plain names with the TF 2.11+ ones (SGD, Adam): "ScheduledLegacySGD"
    # keeps the two apart in the registry (`keras.` on TF 2.15, `tf_keras.` where tf.keras is the tf-keras package).
    keras_own = base.__module__.startswith(("keras.", "tf_keras."))
    name = "Scheduled" + ("Legacy" if legacy and keras_own else "") + base.__name__
    cls = type(name, (_ScheduledLegacy if legacy else _ScheduledNew, base), {
        "__module__": __name__,
        "__doc__": f"{base.__name__} following an hvd_sched schedule; see hvd_sched.keras.ScheduledOptimizer.",
    })
    _CLASSES[base] = cls
    globals()[name] = cls  # Keras can also find it by module + class name
    # Registered as "hvd_sched>ScheduledSGD", not under the plain name: Horovod's subclass keeps the plain name,
    # and a global registration of it would shadow the custom_objects `hvd.load_model` passes, silently loading
    # a model without its DistributedOptimizer. `hvd_sched.keras.load_model` picks the right one.
    tf.keras.utils.register_keras_serializable(package="hvd_sched")(cls)
    return cls


def ScheduledOptimizer(optimizer, schedule, *, momentum_correction=None, correction_threshold=None,
                       lr_multipliers=None, weight_decays=None, log_corrections=True):
    """Wrap a Keras optimizer so it follows `schedule` in-graph, with Detectron's momentum correction.

    The LR at step `it` is `schedule.lr_at(it)`; on the iterations of `schedule.momentum_corrections` the
    momentum slots are multiplied by new_lr/old_lr before that step's update (Goyal et al. 2017, sec. 2.1;
    Detectron `SOLVER.SCALE_MOMENTUM`). The optimizer's own learning_rate is replaced by the schedule.

    Example:
        >>> import horovod.tensorflow.keras as hvd, hvd_sched, hvd_sched.keras
        >>> hvd.init()
        >>> schedule = hvd_sched.from_detectron("configs/steps.yaml", world_size=hvd.size())
        >>> opt = hvd.DistributedOptimizer(
        ...     hvd_sched.keras.ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule,
        ...                                        lr_multipliers={"bias": 2.0}))
        >>> model.compile(opt, "sparse_categorical_crossentropy")
        >>> model.fit(x, y, callbacks=hvd_sched.keras.horovod_callbacks())

    Args:
        optimizer: a `tf.keras.optimizers.*` or `tf.keras.optimizers.legacy.*` instance (not yet Horovod-wrapped).
        schedule: an `hvd_sched.Schedule` (or its `get_config()` dict).
        momentum_correction: None (follow the schedule's SCALE_MOMENTUM / SCALE_MOMENTUM_MODE for SGD with
            momentum; a no-op for optimizers whose slots hold no LR, such as Adam), "threshold",
            "every_change", "off", or a bool.
        correction_threshold: overrides the schedule's SCALE_MOMENTUM_THRESHOLD (>= 1).
        lr_multipliers: dict of variable-name regex -> factor; a variable uses lr * factor of the first pattern
            that `re.search`es its name (e.g. {"bias": 2.0}); every pattern must match some variable.
        weight_decays: dict of variable-name regex -> decay >= 0, read like `lr_multipliers` (first match wins,
            unmatched variables get 0, every pattern must match some variable): coupled L2, the update of
            SGD with momentum mu is V = mu*V + lr*factor*(g + decay*w); w -= V (Detectron's
            `WeightedSum([grad, ONE, param, WD])` before `MomentumSGDUpdate`; the LR multiplier scales the
            decay term too, as Caffe2's WeightDecayBuilder, which rewrites the gradient before the optimizer
            and its LR). E.g. {"bias": 0.0, "": 1e-4}. Not the optimizer's own `weight_decay=` (decoupled,
            Loshchilov & Hutter; combining both is an error). `build_optimizer(solver, model)` writes both rule
            sets from a model's layers.
        log_corrections: `LearningRateLogger` (in `horovod_callbacks`) prints one line on rank 0 at each
            correction (iteration, old LR, new LR, factor); the compiled step itself prints nothing.

    Returns:
        A new optimizer of class `Scheduled<Name>`, a subclass of `type(optimizer)`.

    Raises:
        TypeError: `optimizer` is not a Keras optimizer, or `schedule` is not a schedule.
        ValueError: the optimizer is already Horovod-wrapped or scheduled, or an option is invalid.
    """
    if isinstance(optimizer, _ScheduledBase):
        raise ValueError("this optimizer is already a ScheduledOptimizer; wrap the plain optimizer once")
    if not isinstance(optimizer, (tf.keras.optimizers.Optimizer, tf.keras.optimizers.legacy.Optimizer)):
        raise TypeError(f"ScheduledOptimizer wraps a tf.keras optimizer such as tf.keras.optimizers.SGD("
                        f"momentum=0.9), got {type(optimizer).__name__}: {optimizer!r}")
    if _slots.is_horovod_wrapped(optimizer):
        raise ValueError("wrap in the other order: hvd.DistributedOptimizer(ScheduledOptimizer(opt, schedule)); "
                         "Horovod's optimizer class cannot be subclassed again")
    schedule = as_schedule(schedule)
    _slots.resolve_correction_mode(optimizer, schedule, momentum_correction)  # errors name the user's class
    config = optimizer.get_config()
    if weight_decays and config.get("weight_decay"):
        raise ValueError(_BOTH_DECAYS.format(cls=type(optimizer).__name__, wd=config["weight_decay"]))
    config.update(schedule=schedule, momentum_correction=momentum_correction,
                  correction_threshold=correction_threshold, lr_multipliers=lr_multipliers,
                  weight_decays=weight_decays, log_corrections=log_corrections)
    return scheduled_class(type(optimizer)).from_config(config)


def is_scheduled(optimizer):
    """True when `optimizer` (possibly Horovod-wrapped) is a ScheduledOptimizer."""
    return isinstance(optimizer, _ScheduledBase)


def custom_objects():
    """Every scheduled class by its plain name, for `tf.keras.models.load_model(..., custom_objects=...)`."""
    return {cls.__name__: cls for cls in _CLASSES.values()}


def load_model(path, **kwargs):
    """Load a model saved with `model.save` whose optimizer is a ScheduledOptimizer, Horovod-wrapped or not.

    A model compiled with `hvd.DistributedOptimizer(ScheduledOptimizer(...))` records Horovod's module for its
    optimizer class, so plain `tf.keras.models.load_model` cannot find the class; this passes the scheduled
    classes. The optimizer comes back unwrapped, with its iteration count, schedule and momentum slots. (Horovod's
    own `hvd.load_model` fails on TF 2.15's `.keras` format: `Could not interpret optimizer identifier`.) To go on
    training on several ranks, rebuild the model with `hvd.DistributedOptimizer(ScheduledOptimizer(...))` and
    restore a `tf.train.Checkpoint` (`EpochCheckpoint` / `restore_latest`) instead.

    Args:
        path: the `.keras` file or SavedModel directory.
        **kwargs: passed to `tf.keras.models.load_model` (`custom_objects` for the model's own layers is merged).

    Returns:
        The compiled model.
    """
    objects = dict(kwargs.pop("custom_objects", None) or {})
    objects.update(custom_objects())
    return tf.keras.models.load_model(path, custom_objects=objects, **kwargs)


for _base in (tf.keras.optimizers.SGD, tf.keras.optimizers.Adam, tf.keras.optimizers.AdamW,
              tf.keras.optimizers.RMSprop, tf.keras.optimizers.Nadam, tf.keras.optimizers.Adagrad,
              tf.keras.optimizers.legacy.SGD, tf.keras.optimizers.legacy.Adam, tf.keras.optimizers.legacy.RMSprop):
    scheduled_class(_base)
del _base
