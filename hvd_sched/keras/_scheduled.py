"""The Keras-version-independent half of `ScheduledOptimizer`: options, per-variable rules and the step's state.

Each scheduled class is (a per-version mixin from `_backend.scheduled_mixin`, `ScheduledBase`, the Keras optimizer
class). The mixin overrides the Keras method that starts a step and the per-variable update and calls back into
`ScheduledBase._hvd_sched_*` for everything else.

What a step needs travels through variables, never through a tensor kept on a Python attribute: the LR is Keras'
own (the schedule evaluated once per step, `ScheduleLR`), and this step's momentum-correction factor is assigned
once per step, as momentum x factor, to the variable `Options.step_momentum` (the momentum itself on steps without a
correction, so those steps are Keras' own SGD bit for bit), which every variable's update reads in place of the
momentum coefficient, also inside the per-variable XLA function Keras 2 traces on a GPU (`_update_step_xla`).
"""

import inspect

import numpy as np
import tensorflow as tf

from .. import _validation
from . import _backend, _horovod, _slots
from ._tables import as_schedule, correction_table, graph_factor, graph_factor_since
from ._tracking import iteration_count
from .lr_schedule import ScheduleLR

__all__ = ["ScheduledBase", "ScheduledLearningRate", "check_rules", "BOTH_DECAYS", "accumulation_problem",
           "lr_conflict", "NO_LEARNING_RATE"]

BOTH_DECAYS = ("weight_decays= (coupled L2: grad += decay * w before the update, Detectron/Caffe2) and the "
               "optimizer's own weight_decay={wd!r} ({cls}: decoupled, w -= lr * wd * w after it) would both decay "
               "the weights; build the optimizer without weight_decay= (e.g. tf.keras.optimizers.SGD(momentum=0.9))")

_LOSS_SCALE_ACCUMULATION = (
    "hvd_sched: gradient accumulation ({k} micro-batches per update) with a LossScaleOptimizer (mixed_float16) "
    "cannot be made exact: the dynamic loss scale checks and changes per micro-batch, so a non-finite micro-batch "
    "drops out of the average (Keras 3) or the micro-batches of one update mix two loss scales (Keras 2); train "
    "with accumulation under the mixed_bfloat16 or float32 policy (no loss scaling), or under mixed_float16 with "
    "ITER_SIZE / backward_passes_per_step / gradient_accumulation_steps 1")


#: Why an optimizer class without a learning rate cannot be scheduled, and what it needs.
NO_LEARNING_RATE = (
    "ScheduledOptimizer cannot schedule {cls}: it has no learning rate (its __init__ takes no learning_rate and "
    "builds none), so its update reads none and a schedule would change nothing. A class it can wrap has a "
    "learning rate its update reads: take a learning_rate argument and pass it to the Keras base class, or set "
    "one in __init__ (Keras 2: self._learning_rate = self._build_learning_rate(0.01); Keras 2 legacy: "
    "self._set_hyper('learning_rate', 0.01); Keras 3: super().__init__(learning_rate=0.01, ...)), and read "
    "self.learning_rate (legacy: self._decayed_lr(dtype); Keras 3: the learning_rate argument of update_step)")

# What a caller should do instead of writing the LR of a ScheduledOptimizer, by the class name of the Keras or
# Horovod callback that writes it (a subclass takes its nearest ancestor's entry).
_WARMUP_FIX = ("put the warmup in the SOLVER config instead (WARM_UP_ITERS or WARM_UP_EPOCHS, WARM_UP_METHOD: linear, "
               "WARM_UP_FACTOR: horovod for Horovod's start at lr / size), which the ScheduledOptimizer follows in "
               "the compiled step")
_STEPS_FIX = ("put the LR changes in the SOLVER config instead (LR_POLICY: steps_with_decay with STEPS or "
              "STEPS_EPOCHS and GAMMA, or another LR_POLICY), which the ScheduledOptimizer follows in the compiled "
              "step")
_PLATEAU_FIX = ("a ScheduledOptimizer does not reduce its LR on a plateau: its LR is a function of the iteration "
                "alone, which is what keeps resume, elastic resets and the ranks exact, and a plateau factor would "
                "be state outside the schedule (Detectron has none); put the reductions in the SOLVER config (STEPS "
                "or STEPS_EPOCHS and GAMMA), or stop with EarlyStopping and go on with a new schedule, or keep "
                "ReduceLROnPlateau with a plain optimizer")
_LR_WRITER_FIXES = {
    "LearningRateWarmupCallback": _WARMUP_FIX,
    "LearningRateScheduleCallback": _STEPS_FIX,
    "LearningRateScheduler": _STEPS_FIX,
    "ReduceLROnPlateau": _PLATEAU_FIX,
}
_DEFAULT_FIX = ("change the schedule instead (the SOLVER config, a new hvd_sched.Schedule); where the LR must be set "
                "between batches, compile a plain optimizer (float learning_rate) and pass "
                "hvd_sched.keras.ScheduleCallback(schedule)")


def _lr_writer():
    """The Keras (or Horovod) callback on the call stack, i.e. the one writing the LR, or None."""
    callback = _backend.keras.callbacks.Callback
    frame = inspect.currentframe()
    try:
        while frame is not None:
            owner = frame.f_locals.get("self")
            if isinstance(owner, callback):
                return owner
            frame = frame.f_back
    finally:
        del frame
    return None


def _shown(value):
    try:
        return repr(float(np.asarray(value)))
    except (TypeError, ValueError):
        return repr(value)


def lr_write_error(optimizer_class, value, how):
    """The TypeError for a write of `value` to the LR of a ScheduledOptimizer, naming the writer and the fix."""
    writer = _lr_writer()
    fix = _DEFAULT_FIX
    who = "this call"
    if writer is not None:
        who = f"{type(writer).__module__}.{type(writer).__name__}"
        fix = next((_LR_WRITER_FIXES[k.__name__] for k in type(writer).__mro__ if k.__name__ in _LR_WRITER_FIXES),
                   _DEFAULT_FIX)
    return TypeError(
        f"hvd_sched: {who} tried to set the learning rate of {optimizer_class} to {_shown(value)} ({how}), but the "
        "learning rate of a ScheduledOptimizer comes from its schedule (schedule.lr_at(iteration), in the compiled "
        "step): the write would be ignored or would replace the schedule without a word. "
        f"{fix[0].upper()}{fix[1:]}. Reading the LR (optimizer.learning_rate, optimizer.lr, get_value) gives the "
        "schedule's LR of the next step.")


def lr_conflict(optimizer):
    """Why `optimizer`'s own learning rate conflicts with a schedule that would replace it, or None."""
    lr = _backend.learning_rate_of(optimizer)
    if isinstance(lr, _backend.LearningRateSchedule):
        kind = f"a {type(lr).__name__} schedule"
    elif callable(lr) and not _backend.is_variable(lr):
        kind = f"a callable ({getattr(lr, '__name__', type(lr).__name__)})"
    else:
        return None
    return (f"the learning_rate of {type(optimizer).__name__} is {kind}, and ScheduledOptimizer replaces the "
            "optimizer's learning rate with its hvd_sched schedule: two schedules would compete for one LR. Build "
            f"the optimizer with a float learning_rate (its value is not used), e.g. {type(optimizer).__name__}("
            "momentum=0.9), and put the whole LR schedule in the hvd_sched schedule (SOLVER config)")


def _in_float32(name):
    """The float comparison `name` ("__eq__", ...) with a number first rounded to float32, as TensorFlow converts
    it to compare with a float32 variable; anything else is compared as a float compares it."""
    compare = getattr(float, name)

    def method(self, other):
        if isinstance(other, (int, float, np.integer, np.floating)) and not isinstance(other, bool):
            other = float(np.float32(other))
        return compare(self, other)

    method.__name__ = name
    return method


class ScheduledLearningRate(float):
    """What reading the LR of a ScheduledOptimizer (outside the compiled step) gives: its next step's LR, a float.

    `float(...)`, `backend.get_value(...)` and `.numpy()` read it, so Keras' and Horovod's LR callbacks read the
    scheduled value; `assign` (what `backend.set_value(optimizer.lr, x)` calls) raises a TypeError that names the
    caller and the fix, since a ScheduledOptimizer's LR has one owner, its schedule. It compares with a number as
    the float32 variable it stands in for does (Keras 2 and 3), in float32: `optimizer.learning_rate == 0.002` is true
    for an LR of float32(0.002) (0.0020000000949949026), as it is for `SGD(learning_rate=0.002)`.
    """

    dtype = tf.float32  # read by Keras' backend.set_value before it assigns

    # Keras' own optimizer tests assert `optimizer.learning_rate == 0.002`. The hash stays the float's: like
    # numpy 2's float32 scalars, a value equal to a float in float32 may hash apart from it.
    __eq__, __ne__, __lt__, __le__, __gt__, __ge__ = map(
        _in_float32, ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"))
    __hash__ = float.__hash__

    def __new__(cls, value, owner=""):
        self = super().__new__(cls, value)
        self._owner = owner
        return self

    def __reduce__(self):  # copies and pickles are plain floats
        return (float, (float(self),))

    def numpy(self):
        return np.float32(self)

    def assign(self, value, *args, **kwargs):
        how = ("backend.set_value(optimizer.lr, value)" if _called_from("set_value")
               else "optimizer.learning_rate.assign(value)")
        raise lr_write_error(self._owner, value, how)

    def assign_add(self, value, *args, **kwargs):
        raise lr_write_error(self._owner, f"itself + {_shown(value)}", "optimizer.learning_rate.assign_add(value)")

    def assign_sub(self, value, *args, **kwargs):
        raise lr_write_error(self._owner, f"itself - {_shown(value)}", "optimizer.learning_rate.assign_sub(value)")


def _called_from(function_name):
    frame = inspect.currentframe()
    try:
        while frame is not None:
            if frame.f_code.co_name == function_name:
                return True
            frame = frame.f_back
    finally:
        del frame
    return False


def _init_takes_learning_rate(cls):
    """Whether the first `__init__` after ScheduledBase in `cls`'s MRO (the wrapped class's) names learning_rate."""
    mro = cls.__mro__
    for klass in mro[mro.index(ScheduledBase) + 1:]:
        init = vars(klass).get("__init__")
        if init is not None:
            try:
                return "learning_rate" in inspect.signature(init).parameters
            except (TypeError, ValueError):  # a builtin's __init__ without a signature
                return True
    return False


def accumulation_problem(optimizer, iter_size=1):
    """Why `optimizer` (as compiled: distributed, loss-scaled or not) would not make one update of `iter_size`
    averaged micro-batches, or None.

    Args:
        optimizer: the optimizer; its accumulation is Horovod's `backward_passes_per_step` (Keras 2) or Keras 3's
            `gradient_accumulation_steps`.
        iter_size: the schedule's ITER_SIZE (1: the schedule asks for no particular accumulation).
    """
    k = _backend.micro_batches(optimizer)
    if iter_size > 1 and k != iter_size:
        fix = ("wrap it with hvd_sched.keras.DistributedOptimizer(optimizer), which accumulates ITER_SIZE "
               "micro-batches (Horovod's backward_passes_per_step=ITER_SIZE, average_aggregated_gradients=True)"
               if _backend.KERAS_MAJOR == 2 else
               "build the optimizer with gradient_accumulation_steps=ITER_SIZE or without it (ScheduledOptimizer "
               "and hvd_sched.keras.DistributedOptimizer then set it)")
        return (f"hvd_sched: the schedule's ITER_SIZE is {iter_size} micro-batches per iteration, but the optimizer "
                f"accumulates {k}; {fix}")
    if iter_size > 1 and _backend.sums_micro_batches(optimizer):
        return (f"hvd_sched: the schedule's ITER_SIZE {iter_size} averages its micro-batches (Caffe's iter_size), "
                "but the optimizer sums them (Horovod's average_aggregated_gradients=False); pass "
                "average_aggregated_gradients=True, or leave backward_passes_per_step to "
                "hvd_sched.keras.DistributedOptimizer")
    if k > 1 and _backend.is_loss_scaled(optimizer):
        return _LOSS_SCALE_ACCUMULATION.format(k=k)
    if k > 1 and _horovod.is_elastic():
        return (f"hvd_sched: gradient accumulation ({k} micro-batches per update) under elastic Horovod is not "
                "supported: a reset between the micro-batches of an update would restore the weights but not the "
                "partial sums (Horovod's accumulation helper keeps them outside any state), and is not tested; "
                "run elastic jobs with ITER_SIZE / backward_passes_per_step 1, or a fixed world size with "
                "accumulation")
    return None


class Options:
    """The wrapper's settings and step state, kept out of TensorFlow's attribute tracking (which wraps dicts and
    lists and would checkpoint the step variables)."""

    def __init__(self, optimizer, schedule_lr, momentum_correction, correction_threshold, lr_multipliers,
                 weight_decays, log_corrections):
        self.schedule_lr = schedule_lr
        self.schedule = schedule_lr.schedule
        self.momentum_correction = momentum_correction
        if correction_threshold is not None and (isinstance(correction_threshold, bool) or
                                                 not isinstance(correction_threshold, (int, float)) or
                                                 not correction_threshold >= 1):
            raise ValueError(f"correction_threshold must be a number >= 1 (Detectron's SCALE_MOMENTUM_THRESHOLD), "
                             f"got {correction_threshold!r}")
        self.correction_threshold = correction_threshold
        self.multipliers = _validation.name_rules("lr_multipliers", lr_multipliers, "factor")
        self.decays = _validation.name_rules("weight_decays", weight_decays, "decay")
        self.log_corrections = bool(log_corrections)
        self.mode = _slots.resolve_correction_mode(optimizer, self.schedule, momentum_correction)
        self.threshold = (self.schedule.scale_momentum_threshold if correction_threshold is None
                          else float(correction_threshold))
        # The corrections as a lookup table (None: too many, the rule runs in-graph instead).
        self.table = correction_table(self.schedule, self.mode, self.threshold)
        self.rules_checked = False
        self._rules = {}  # variable name -> (LR multiplier, weight decay)
        with tf.init_scope():
            self.step_momentum = tf.Variable(0.0, trainable=False, dtype=tf.float32, name="hvd_sched_step_momentum")

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

    def rules_for(self, name):
        """(LR multiplier, weight decay) of the variable called `name`: the first matching pattern of each."""
        if name not in self._rules:
            self._rules[name] = (_first_match(self.multipliers, name, 1.0), _first_match(self.decays, name, 0.0))
        return self._rules[name]


def _first_match(rules, name, default):
    for _, compiled, value in rules:
        if compiled.search(name):
            return value
    return default


def check_rules(options, names):
    """A ValueError naming the first `lr_multipliers` / `weight_decays` pattern that matches none of `names`."""
    for argument, rules in (("lr_multipliers", options.multipliers), ("weight_decays", options.decays)):
        for pattern, compiled, _ in rules:
            if not any(compiled.search(name) for name in names):
                raise ValueError(f"{argument} pattern {pattern!r} matches no trainable variable; the variable "
                                 f"names are {names}. Fix the regex (it is searched with re.search) or remove it.")


def _name(variable):
    return variable if isinstance(variable, str) else _backend.variable_name(variable)


class ScheduledBase:
    """Shared by every scheduled class (Keras 2 TF 2.11+, Keras 2 legacy, Keras 3)."""

    def __init__(self, schedule, momentum_correction=None, correction_threshold=None, lr_multipliers=None,
                 weight_decays=None, log_corrections=True, **kwargs):
        kwargs.pop("learning_rate", None)
        kwargs.pop("lr", None)
        schedule = as_schedule(schedule)
        iter_size = schedule.iter_size
        if _backend.KERAS_MAJOR == 3 and iter_size > 1:
            # Keras 3 accumulates in the optimizer itself: ITER_SIZE micro-batches per update.
            given = kwargs.get("gradient_accumulation_steps")
            if given and given != iter_size:
                raise ValueError(f"gradient_accumulation_steps={given!r} differs from the schedule's ITER_SIZE "
                                 f"{iter_size} (micro-batches per iteration); build the optimizer without "
                                 "gradient_accumulation_steps, or with the same value")
            kwargs["gradient_accumulation_steps"] = iter_size
        if _validation.name_rules("weight_decays", weight_decays, "decay") and kwargs.get("weight_decay"):
            raise ValueError(BOTH_DECAYS.format(cls=type(self).__name__, wd=kwargs["weight_decay"]))
        schedule_lr = ScheduleLR(schedule)
        with tf.init_scope():
            schedule_lr.scale = tf.Variable(1.0, trainable=False, dtype=tf.float32, name="hvd_sched_lr_scale")
            last_step = tf.Variable(-1, trainable=False, dtype=tf.int64, name="hvd_sched_last_step")
        if _init_takes_learning_rate(type(self)):
            super().__init__(learning_rate=schedule_lr, **kwargs)
        else:
            # A class whose __init__ takes no learning_rate (its own fixed LR, or none): built as it is, and its
            # LR replaced by the schedule below.
            super().__init__(**kwargs)
        own = _backend.learning_rate_of(self)
        if own is None:
            raise TypeError(NO_LEARNING_RATE.format(cls=type(self).__name__))
        if own is not schedule_lr:
            _backend.install_schedule(self, schedule_lr)
        # Tracked: tf.train.Checkpoint keeps the world-size scale and the last applied step.
        self._hvd_sched_lr_scale_var = schedule_lr.scale
        self._hvd_sched_last_step = last_step
        self._hvd_sched = Options(self, schedule_lr, momentum_correction, correction_threshold, lr_multipliers,
                                  weight_decays, log_corrections)
        # Keras 3's gradient_accumulation_steps is known now; Horovod's Keras 2 wrapper sets its accumulation
        # after this __init__, so the first step reads it again (`_hvd_sched_before_step`).
        schedule_lr.micro_batches = _backend.micro_batches(self)

    @property
    def schedule(self):
        """The hvd_sched `Schedule` this optimizer follows."""
        return self._hvd_sched.schedule

    @property
    def momentum_correction_mode(self):
        """The correction mode in force: "threshold", "every_change" or "off"."""
        return self._hvd_sched.mode

    @property
    def correction_threshold_in_force(self):
        """The threshold the correction rule uses (the schedule's unless `correction_threshold` overrides it)."""
        return self._hvd_sched.threshold

    @property
    def logs_corrections(self):
        """True when `LearningRateLogger` should announce this optimizer's corrections (`log_corrections`)."""
        return self._hvd_sched.log_corrections and self._hvd_sched.has_corrections

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
        return self._hvd_sched.rules_for(_name(variable))[0]

    def weight_decay_for(self, variable):
        """The coupled weight decay the rules give `variable` (a variable or its name): the first match, else 0."""
        return self._hvd_sched.rules_for(_name(variable))[1]

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
            for slot in _backend.all_momentum_slots(self):
                _backend.scale_variable(slot, factor)
            applied = factor
        self._hvd_sched_lr_scale_var.assign(new)
        return float(applied)

    def follow_schedule_from(self, last_lr, iteration):
        """Go on with this optimizer's own schedule from `iteration`, where the previous update used `last_lr`.

        For a checkpoint trained with another schedule or at another world size (fine-tuning with a new schedule):
        the LR scale goes back to 1 (the LR of iteration `it` is `schedule.lr_at(it)`), and the momentum slots,
        which carry `last_lr` (V := mu*V + lr*grad), are rescaled as Detectron's rule does when the LR goes from
        `last_lr` to `schedule.lr_at(iteration)` (`SCALE_MOMENTUM`, its threshold and mode: no rescale below the
        threshold, none where the slots do not carry the LR). The next step's own correction, between the
        schedule's LRs of `iteration - 1` and `iteration`, is taken out of that factor, so the two together make
        Detectron's one. Call it eagerly, before the first step (`restore_latest(..., lr_rule="schedule")` does).

        Args:
            last_lr: the LR of the update before `iteration` (a checkpoint's "last_lr"), or None (no update yet).
            iteration: the next update's index (the restored iteration counter).

        Returns:
            The float32 factor applied to the slots (1.0 if none were rescaled).
        """
        from .. import momentum

        self._hvd_sched_lr_scale_var.assign(1.0)
        mode, threshold = self._hvd_sched.mode, self._hvd_sched.threshold
        if last_lr is None or iteration <= 0 or mode == "off":
            return 1.0
        new = np.float32(self.schedule.lr_at(iteration))
        wanted = momentum.correction_factor(np.float32(last_lr), new, mode, threshold)
        wanted = np.float32(1.0) if wanted is None else np.float32(wanted)
        # What the next step applies by itself (the schedule's own change from iteration - 1 to iteration).
        own = momentum.correction_factor(np.float32(self.schedule.lr_at(iteration - 1)), new, mode, threshold)
        own = np.float32(1.0) if own is None or own == 0 else np.float32(own)
        factor = np.float32(wanted / own)
        if factor != 1:
            for slot in _backend.all_momentum_slots(self):
                _backend.scale_variable(slot, factor)
        return float(factor)

    def copy_schedule_state(self, other):
        """Take `other`'s schedule state that lives outside Keras' optimizer variables: the LR scale (elastic)
        and the last applied step (mixed precision), e.g. into its distributed copy."""
        self._hvd_sched_lr_scale_var.assign(other._hvd_sched_lr_scale_var)
        self._hvd_sched_last_step.assign(other._hvd_sched_last_step)

    def get_config(self):
        config = super().get_config()
        config.pop("learning_rate", None)  # derived from the schedule
        config.update(self._hvd_sched.config())
        return config

    # -- the one owner of the LR: reads give the schedule's, writes are refused ---------------------------------

    _hvd_sched_updating = False  # True while Keras runs this optimizer's step (its own reads get Keras' value)

    def _hvd_sched_user_read(self):
        """True for a read of the LR from outside the step: eager, after __init__, not inside apply_gradients."""
        return (getattr(self, "_hvd_sched", None) is not None and not self._hvd_sched_updating
                and tf.executing_eagerly())

    def _hvd_sched_current_lr(self):
        """The LR of the next step, `lr_at(iteration_count)` (elastic scale included), as a ScheduledLearningRate."""
        return ScheduledLearningRate(self.lr_at(iteration_count(self)), type(self).__name__)

    def _hvd_sched_refuse_new_lr(self, value=None, how="optimizer.learning_rate = value"):
        """Raise the TypeError for a write of the LR (after __init__; Keras sets it while constructing)."""
        if getattr(self, "_hvd_sched", None) is not None:
            raise lr_write_error(type(self).__name__, value, how)

    # -- the step: called by the per-version mixins ------------------------------------------------------------

    def _hvd_sched_rules_for(self, name):
        return self._hvd_sched.rules_for(name)

    def _hvd_sched_before_step(self, variables, trained, name=None):
        """Checks, slot creation and this step's correction, before Keras updates any variable.

        Args:
            variables: every variable of the step; trained: those with a gradient; name: Keras' name scope.
        """
        options = self._hvd_sched
        if _backend.KERAS_MAJOR == 2 and _backend.is_horovod_keras_wrapped(self) \
                and _backend.in_xla_compilation() and not _horovod.xla_ops_enabled():
            raise ValueError(_horovod.XLA_WITH_HOROVOD.format(auto=""))
        problem = accumulation_problem(self, options.schedule.iter_size)
        if problem:
            raise ValueError(problem)
        # The LR of an update, not of a micro-batch: Keras 3 and Horovod's Keras 2 accumulation both count
        # micro-batches in the step they pass to the schedule (a Python int, the same in every trace).
        options.schedule_lr.micro_batches = _backend.micro_batches(self)
        if (options.multipliers or options.decays) and not options.rules_checked:
            check_rules(options, [_name(v) for v in trained])  # a typo would silently train at the base rules
            options.rules_checked = True
        if not variables or not options.has_corrections:
            return
        _backend.build_slots(self, variables, name)
        factor = self._hvd_sched_compute_factor()
        if _backend.folds_factor(self):
            # SGD: m * (momentum * factor) inside the update itself (no tf.cond, no extra pass, no extra product).
            options.step_momentum.assign(tf.cast(self.momentum, tf.float32) * factor)
        else:
            slots = [s for s in (_backend.momentum_slot(self, v) for v in variables) if s is not None]

            def rescale():
                for slot in slots:
                    slot.assign(slot * tf.cast(factor, slot.dtype))
                return tf.constant(True)

            if slots:
                tf.cond(tf.not_equal(factor, 1.0), rescale, lambda: tf.constant(False))

    def _hvd_sched_compute_factor(self):
        """This step's slot factor from the rule on this and the previous iteration's LR (1.0 on most steps)."""
        options = self._hvd_sched
        with tf.name_scope("hvd_sched_momentum_correction"):
            step = _backend.update_index(self)  # the update, also under gradient accumulation
            if _backend.counts_skipped_steps(self):
                # Mixed precision on Keras 2: skipped steps still advance `iterations`; take their corrections now.
                factor = graph_factor_since(options.schedule, self._hvd_sched_last_step, step, options.mode,
                                            options.threshold, options.table)
                self._hvd_sched_last_step.assign(tf.cast(step, tf.int64))
                return factor
            return graph_factor(options.schedule, step, options.mode, options.threshold, options.table)

    def _hvd_sched_step_momentum(self):
        """The variable holding this step's momentum x correction factor where the SGD update reads it (SGD with
        corrections), else None."""
        options = self._hvd_sched
        if options.has_corrections and _backend.folds_factor(self):
            return options.step_momentum
        return None

    def _hvd_sched_decayed(self, gradient, variable, decay):
        """`gradient + decay * variable` (Caffe2's WeightedSum), or `gradient` itself where the decay is 0.

        A sparse gradient becomes dense: L2 decays every row of the variable, not only the rows in the batch.
        """
        if decay == 0.0:
            return gradient
        if isinstance(gradient, tf.IndexedSlices):
            gradient = tf.convert_to_tensor(gradient)
        return gradient + tf.cast(decay, variable.dtype) * variable
