"""`build_optimizer(solver, model)`: Detectron's whole solver for a built Keras model, from one config.

One source of truth (detectron2's `solver/build.py`): the LR schedule, MOMENTUM, NESTEROV, WEIGHT_DECAY and
WEIGHT_DECAY_GN all come from the config once, and the per-parameter rules of Detectron's
`add_single_gpu_param_update_ops` (`detectron/modeling/optimizer.py`) are decided from the model's layers:

====================================  ===========================  ===================  ==========
parameter                             Caffe2 tag / list            weight decay         LR
====================================  ===========================  ===================  ==========
`bias` of Dense, Conv*, ... layers    `model.biases`               0 (bias_weight_decay)  x 2 (bias_lr_factor)
GroupNorm/BatchNorm/LayerNorm `beta`  `model.biases` (BIAS tag)    0 (bias_weight_decay)  x 2 (bias_lr_factor)
GroupNorm/BatchNorm/LayerNorm `gamma` `model.gn_params`            WEIGHT_DECAY_GN        x 1
everything else (kernels, ...)        -                            WEIGHT_DECAY           x 1
====================================  ===========================  ===================  ==========

Why a norm layer's shift counts as a bias: Caffe2's `brew.spatial_gn` (`caffe2/python/helpers/normalization.py`)
creates the shift `<name>_b` with `tags=ParameterTags.BIAS`, and `ModelHelper.AddParameter`
(`caffe2/python/model_helper.py`) appends every BIAS-tagged parameter to `model.biases`. Detectron's `ConvGN`
(`detectron/modeling/detector.py`, lines 482-483) then also appends both the shift and the scale to
`model.gn_params`, but `add_single_gpu_param_update_ops` tests `param in model.biases` first
(`detectron/modeling/optimizer.py`, line 113, before `model.gn_params` at line 119), so the shift gets the
gradient x 2 and no decay, and only the scale `<name>_s` gets WEIGHT_DECAY_GN. `spatial_bn`, `layer_norm` and
`AffineChannel` tag their shifts BIAS in the same way.

The rules are plain data on the optimizer (`lr_multipliers` and `weight_decays`: exact-variable-name regexes,
first match wins), kept by `get_config`, so `hvd.DistributedOptimizer`'s rebuild, `model.save` +
`hvd_sched.keras.load_model` and `tf.train.Checkpoint` keep them.
"""

from .. import Schedule, _validation, from_detectron
from . import _backend, _horovod
from .optimizer import ScheduledOptimizer, scheduled_of

__all__ = ["build_optimizer", "describe_optimizer", "parameter_groups"]

_keras = _backend.keras
_NORM_LAYERS = (_keras.layers.GroupNormalization, _keras.layers.BatchNormalization, _keras.layers.LayerNormalization)
_GROUP_NOUNS = {"kernel": "kernels", "bias": "biases", "norm_scale": "norm scales"}


def _check_model(model):
    if not isinstance(model, _keras.Model):
        raise TypeError(f"Argument `model` must be a tf.keras.Model. Received: model={model!r} "
                        f"({type(model).__name__})")
    if not model.built:
        raise ValueError(f"Argument `model` must be built, so its variables exist: start it with tf.keras.Input"
                         f"(shape) or call model.build(input_shape). Received: an unbuilt model {model.name!r}")
    if not model.trainable_variables:
        raise ValueError(f"Argument `model` has no trainable variables, so there is nothing to optimize. "
                         f"Received: model {model.name!r} with {len(model.variables)} non-trainable variables")


def parameter_groups(model):
    """Detectron's parameter group of each trainable variable of a built model.

    Args:
        model: a built `tf.keras.Model`.

    Returns:
        A dict `{"kernel": [...], "bias": [...], "norm_scale": [...], "norm_shift": [...]}` of variables in
        `model.trainable_variables` order. "bias" holds the `bias` of every layer (Dense, Conv*, ...);
        "norm_shift" the `beta` and "norm_scale" the `gamma` of GroupNormalization, BatchNormalization and
        LayerNormalization (and their subclasses); "kernel" every other trainable variable.

    Raises:
        TypeError: `model` is not a Keras model.
        ValueError: the model is not built or has no trainable variables.
    """
    _check_model(model)
    tagged = {}
    for layer in _backend.layers_of(model):
        if not isinstance(layer, _keras.layers.Layer):
            continue
        if isinstance(layer, _NORM_LAYERS):
            for attribute, group in (("gamma", "norm_scale"), ("beta", "norm_shift")):
                variable = getattr(layer, attribute, None)
                if _backend.is_variable(variable):
                    tagged[id(variable)] = group
        else:
            bias = getattr(layer, "bias", None)
            if _backend.is_variable(bias):
                tagged.setdefault(id(bias), "bias")
    groups = {"kernel": [], "bias": [], "norm_scale": [], "norm_shift": []}
    for variable in model.trainable_variables:
        groups[tagged.get(id(variable), "kernel")].append(variable)
    return groups


def _solver_schedule(solver, world_size, steps_per_epoch, dialect):
    if isinstance(solver, Schedule):
        for argument, value in (("world_size", world_size), ("steps_per_epoch", steps_per_epoch),
                                ("dialect", dialect)):
            if value is not None:
                raise ValueError(f"Argument `{argument}` converts a SOLVER config; `solver` is already a "
                                 f"Schedule (in iterations, LR scaled). Received: {argument}={value!r}")
        return solver
    return from_detectron(solver, world_size=world_size, steps_per_epoch=steps_per_epoch,
                          dialect="detectron" if dialect is None else dialect)


def _dialect_rules(schedule, model, groups, bias_lr_factor, bias_weight_decay, norm_weight_decay):
    """`[(variables, decay, lr factor)]` in first-match order, by the schedule's dialect (docs/explanation/dialects.md):

    - detectron: biases and norm shifts (Caffe2 BIAS tags) no decay, x 2; norm scales WEIGHT_DECAY_GN;
    - large_scale_vrd: the same bias rule (its optimizer is Detectron's pre-GN one); norm scales WEIGHT_DECAY
      (it has no norm rule: WEIGHT_DECAY_BN is never read);
    - video_nonlocal: no bias rule (biases WEIGHT_DECAY at 1x); every BatchNormalization parameter (its
      `'_bn' in name` rule) WEIGHT_DECAY_BN; other norm parameters WEIGHT_DECAY.

    The explicit arguments, when not None, replace the bias group's decay / factor and the norm decay.
    """
    dialect, decay = schedule.dialect, float(schedule.weight_decay)
    if dialect == "video_nonlocal":
        batch_norm = {id(v) for layer in _backend.layers_of(model)
                      if isinstance(layer, _keras.layers.BatchNormalization) for v in layer.trainable_weights}
        norm = groups["norm_shift"] + groups["norm_scale"]
        bn_decay = schedule.weight_decay_bn if norm_weight_decay is None else norm_weight_decay
        return [(groups["bias"], decay if bias_weight_decay is None else bias_weight_decay,
                 1.0 if bias_lr_factor is None else bias_lr_factor),
                ([v for v in norm if id(v) in batch_norm], bn_decay, 1.0),
                ([v for v in norm if id(v) not in batch_norm], decay, 1.0)]
    scale_decay = schedule.weight_decay_gn if dialect == "detectron" else decay
    return [(groups["bias"] + groups["norm_shift"], 0.0 if bias_weight_decay is None else bias_weight_decay,
             2.0 if bias_lr_factor is None else bias_lr_factor),
            (groups["norm_scale"], scale_decay if norm_weight_decay is None else norm_weight_decay, 1.0)]


def build_optimizer(solver, model, *, world_size=None, steps_per_epoch=None, dialect=None, bias_lr_factor=None,
                    bias_weight_decay=None, norm_weight_decay=None, momentum_correction=None,
                    correction_threshold=None, log_corrections=True):
    """Detectron's solver for `model`: a `ScheduledOptimizer` over `SGD(MOMENTUM, nesterov=NESTEROV)` with the
    per-parameter weight decay and LR rules of Detectron's `add_single_gpu_param_update_ops`.

    Per parameter w with gradient g (already averaged over the ranks by Horovod) and LR lr of the step:
    `g' = g + decay * w` (Caffe2's `WeightedSum`, coupled L2), then MomentumSGD with LR `lr * factor`:
    `V = mu*V + lr*factor*g'; w -= V` (Nesterov: `w -= (1+mu)*V - mu*V_old`), with `decay, factor` from the
    group of w (see `parameter_groups`):

    - biases (and the shift of every norm layer, a BIAS in Caffe2): `bias_weight_decay` (default 0),
      `bias_lr_factor` (default 2);
    - the scale of GroupNormalization / BatchNormalization / LayerNormalization: `norm_weight_decay`, else
      WEIGHT_DECAY_GN (0 by default, as Goyal et al. do for BN);
    - every other trainable variable: WEIGHT_DECAY, x 1.

    For the other dialects the defaults follow their repositories (docs/explanation/dialects.md): Large-Scale-VRD
    has the same bias rule and decays everything else, norm scales included, with WEIGHT_DECAY; video-nonlocal-net has no
    bias rule (biases WEIGHT_DECAY, x 1) and gives BatchNormalization parameters WEIGHT_DECAY_BN, the rest
    WEIGHT_DECAY. NESTEROV comes from the config (video-nonlocal-net; Large-Scale-VRD's update is
    never Nesterov, whatever its NESTEROV says).

    Examples:
        ```python
        import hvd_sched.keras, horovod.tensorflow.keras as hvd   # hvd_sched.keras first
        hvd.init()
        opt = hvd_sched.keras.build_optimizer("examples/configs/e2e_faster_rcnn_R-50-FPN_1x.yaml", model,
                                              world_size=hvd.size())
        print(hvd_sched.keras.describe_optimizer(opt, model))
        # weight decay 0.0001 on 2 kernels, 0 on 2 biases at 2x LR
        model.compile(hvd_sched.keras.DistributedOptimizer(opt), "sparse_categorical_crossentropy")
        model.fit(x, y, callbacks=hvd_sched.keras.horovod_callbacks())
        ```

    Args:
        solver: anything `hvd_sched.from_detectron` takes (a SOLVER mapping, a mapping with a SOLVER section, a
            YAML path), or an `hvd_sched.Schedule`.
        model: a built `tf.keras.Model` (the optimizer's rules name its variables).
        world_size: passed to `from_detectron` (REFERENCE_WORLD_SIZE scaling); None with a Schedule.
        steps_per_epoch: passed to `from_detectron` (the `*_EPOCHS` keys); None with a Schedule.
        dialect: passed to `from_detectron(..., dialect=...)` (None: 'detectron'); a Schedule carries its own.
        bias_lr_factor: the LR factor of biases (None: the dialect's; Detectron: gradient x 2.0).
        bias_weight_decay: the weight decay of biases (None: the dialect's; Detectron: 0; detectron2's
            WEIGHT_DECAY_BIAS).
        norm_weight_decay: the weight decay of norm-layer scales; None reads the config (see above).
        momentum_correction: passed to `ScheduledOptimizer` (None: the config's SCALE_MOMENTUM).
        correction_threshold: passed to `ScheduledOptimizer`.
        log_corrections: passed to `ScheduledOptimizer`.

    Returns:
        A `ScheduledSGD` over `SGD(momentum=MOMENTUM, nesterov=NESTEROV)`, not yet distributed: wrap it in
        `hvd_sched.keras.DistributedOptimizer` for several ranks.

    Raises:
        TypeError: `model` is not a Keras model, or a config value has the wrong type.
        ValueError: an unbuilt model or one without trainable variables, an option out of range, a bad config.
    """
    _horovod.check_launcher(require_init=False)
    # None (the dialect's default) is allowed but not advertised: a number is what a user means to pass.
    number = _validation.argument_number
    bias_lr_factor = number("bias_lr_factor", bias_lr_factor, allow_none=True, say_none=False)
    bias_weight_decay = number("bias_weight_decay", bias_weight_decay, allow_none=True, say_none=False)
    norm_weight_decay = number("norm_weight_decay", norm_weight_decay, allow_none=True)
    groups = parameter_groups(model)
    schedule = _solver_schedule(solver, world_size, steps_per_epoch, dialect)

    rules = _dialect_rules(schedule, model, groups, bias_lr_factor, bias_weight_decay, norm_weight_decay)
    weight_decays, lr_multipliers = {}, {}
    for variables, decay, factor in rules:
        if variables:
            weight_decays[_backend.names_regex(variables, model)] = decay
            if factor != 1.0:
                lr_multipliers[_backend.names_regex(variables, model)] = factor
    if groups["kernel"]:
        weight_decays[""] = float(schedule.weight_decay)

    sgd = _keras.optimizers.SGD(momentum=schedule.momentum, nesterov=schedule.nesterov)
    opt = ScheduledOptimizer(sgd, schedule, momentum_correction=momentum_correction,
                                        correction_threshold=correction_threshold,
                                        lr_multipliers=lr_multipliers or None, weight_decays=weight_decays,
                                        log_corrections=log_corrections)
    _check_resolution(opt, model, rules, float(schedule.weight_decay), groups["kernel"])
    return opt


def _check_resolution(opt, model, rules, kernel_decay, kernels):
    """The name rules give each variable its group's values (variables sharing a name could defeat them)."""
    opt.check_rules(model.trainable_variables)
    wanted = {id(v): (kernel_decay, 1.0) for v in kernels}
    for variables, decay, factor in rules:
        wanted.update({id(v): (decay, factor) for v in variables})
    wrong = [_backend.variable_name(v) for v in model.trainable_variables
             if (opt.weight_decay_for(v), opt.lr_multiplier_for(v)) != wanted[id(v)]]
    if wrong:
        raise ValueError(f"Argument `model` has variables whose names do not identify them: {sorted(set(wrong))} "
                         f"are shared by parameters of different groups; give the layers unique names")


def describe_optimizer(optimizer, model):
    """One line saying which weight decay and LR factor each of Detectron's parameter groups of `model` gets.

    Examples:
        For a ResNet-50 with GroupNormalization, from `build_optimizer`:

        ```python
        opt = hvd_sched.keras.build_optimizer("examples/configs/e2e_faster_rcnn_R-50-FPN_1x.yaml", model)
        print(hvd_sched.keras.describe_optimizer(opt, model))
        # a ResNet-50 with GroupNorm prints:
        # weight decay 0.0001 on 53 kernels, 0 on 106 biases at 2x LR (53 norm shifts), 0 on 53 norm scales
        ```

    Args:
        optimizer: a ScheduledOptimizer (Horovod-wrapped or not), e.g. from `build_optimizer`.
        model: the built model it trains.

    Returns:
        The summary string.

    Raises:
        TypeError: `optimizer` is not a ScheduledOptimizer.
    """
    if scheduled_of(optimizer) is None:
        raise TypeError(f"Argument `optimizer` must be a ScheduledOptimizer. Received: {type(optimizer).__name__}")
    optimizer = scheduled_of(optimizer)
    groups = parameter_groups(model)
    shifts = {id(v) for v in groups["norm_shift"]}
    parts = []
    for group, variables in (("kernel", groups["kernel"]), ("bias", groups["bias"] + groups["norm_shift"]),
                             ("norm_scale", groups["norm_scale"])):
        counts = {}
        for v in variables:
            key = (optimizer.weight_decay_for(v), optimizer.lr_multiplier_for(v))
            total, n_shifts = counts.get(key, (0, 0))
            counts[key] = (total + 1, n_shifts + (id(v) in shifts))
        for (decay, factor), (total, n_shifts) in counts.items():
            text = f"{decay:g} on {total} {_GROUP_NOUNS[group]}"
            if factor != 1.0:
                text += f" at {factor:g}x LR"
            if n_shifts:
                text += f" ({n_shifts} norm shifts)"
            parts.append(text)
    return "weight decay " + ", ".join(parts)
