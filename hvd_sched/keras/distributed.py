"""`DistributedOptimizer` and the distributed callbacks: one API over Keras 2 and Keras 3, Horovod doing the work.

- Keras 2 (`tf.keras` 2.15, tf-keras): `DistributedOptimizer` is Horovod's own
  `horovod.tensorflow.keras.DistributedOptimizer` (it allreduces in `_compute_gradients`, which Keras 2's
  `train_step` calls), and the callbacks are Horovod's `BroadcastGlobalVariablesCallback` (its broadcast run at
  train begin, the slots made first, where the model is built) and `MetricAverageCallback`.
- Keras 3: Horovod 0.28.1's Keras layer trains the ranks apart without an error (Keras 3's `train_step` never calls
  the hooks it overrides: horovod #4290), so `DistributedOptimizer` is a subclass of the optimizer's class whose
  `apply` first averages the gradients with `horovod.tensorflow.grouped_allreduce` (one call per dtype; sparse
  gradients are allgathered by Horovod); the callbacks broadcast the model's and the optimizer's variables from
  the root rank with `horovod.tensorflow.broadcast_variables` at train begin, and average the epoch metrics
  with one `horovod.tensorflow.allreduce`. Nothing is reimplemented: every collective is Horovod's.

Wrap the scheduled optimizer, not the other way round:
`DistributedOptimizer(ScheduledOptimizer(SGD(momentum=0.9), schedule))`.
"""

from .. import _validation
from .. import _compat
from . import _backend, _horovod
from ._scheduled import accumulation_problem
from ._tracking import epoch_problem, resume_offset
from .optimizer import scheduled_of

__all__ = ["DistributedOptimizer", "distributed_callbacks", "DistributedCheck", "BroadcastVariables",
           "AverageMetrics"]

_NOT_AVERAGED = ("hvd_sched: the model's optimizer {name} does not average gradients over the {size} Horovod ranks, "
                 "so they would train apart; compile with hvd_sched.keras.DistributedOptimizer(optimizer)")


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=None,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=None,
                         backward_passes_per_step=None, average_aggregated_gradients=None, num_groups=0,
                         groups=None, process_set=None, scale_local_gradients=True):
    """`optimizer`, its gradients reduced (averaged) over the Horovod ranks before every update.

    Horovod's `horovod.tensorflow.keras.DistributedOptimizer` arguments (names, order, meanings and defaults),
    on Keras 2 and Keras 3, except where said. Wrap the scheduled optimizer:
    `DistributedOptimizer(ScheduledOptimizer(...))`; the other order is a ValueError.

    Examples:
        ```python
        import hvd_sched.keras, horovod.tensorflow as hvd
        hvd.init()
        schedule = hvd_sched.from_detectron({"BASE_LR": 0.1, "ITER_SIZE": 2, "MAX_ITER": 1000})
        opt = hvd_sched.keras.DistributedOptimizer(
            hvd_sched.keras.ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule))
        model.compile(opt, "sparse_categorical_crossentropy")   # 2 micro-batches per update
        model.fit(x, y, batch_size=32, steps_per_epoch=56,   # an epoch ends on an update: 56 = 2 x 28
                  callbacks=hvd_sched.keras.horovod_callbacks())
        ```

    On Keras 2 this is Horovod's own wrapper, given every argument. On Keras 3 (where Horovod's Keras layer does
    not average: horovod #4290) it returns an instance of a subclass of `type(optimizer)` (rebuilt from
    `optimizer.get_config()`, as Horovod does) that reduces with `horovod.tensorflow.grouped_allreduce` (one
    call per dtype and group; `op` Average or Sum, `gradient_predivide_factor`, `groups`, `process_set` and
    `compression` are honoured, and sparse gradients are allgathered by Horovod); a
    `LossScaleOptimizer` (mixed precision) is wrapped as a whole, so the finite-gradient check sees the averaged
    gradients and every rank skips or applies the same steps; under the `mixed_float16` policy a plain optimizer
    is put inside a `LossScaleOptimizer` here, which `model.compile` then keeps, for the same reason.

    Gradient accumulation (large batches on few ranks): with `backward_passes_per_step` k each update uses k
    micro-batches per rank, reduced over the ranks once per update (no collective on the other micro-batches).
    An iteration is one update everywhere in hvd_sched: the schedule, its momentum corrections, the logged LR,
    checkpoints and resume count updates (`iteration_count`), whatever the framework's counter counts.
    Keras 2: Horovod's accumulation. Keras 3: the optimizer's own `gradient_accumulation_steps` (set to k here;
    an optimizer that already has it accumulates that many micro-batches, averaged).

    Args:
        optimizer: a Keras optimizer (e.g. a `ScheduledOptimizer`), or a Keras 3 `LossScaleOptimizer`.
        name: the name scope of the reduction ops (Horovod: "Distributed<Class>").
        device_dense: Horovod's device for dense tensors.
        device_sparse: Horovod's device for sparse tensors.
        compression: `horovod.tensorflow.Compression.fp16` to send float16 gradients; None sends them as they are.
        sparse_as_dense: reduce sparse gradients (embeddings) as dense tensors instead of allgathering them
            (Horovod needs it with backward_passes_per_step > 1).
        gradient_predivide_factor: with `op` Average, the gradients are scaled by 1/f before the sum and by
            f/size after it.
        op: `hvd.Average` (default), `hvd.Sum`, or `hvd.Adasum`: then each gradient is reduced on its own with
            `hvd.allreduce(op=hvd.Adasum)`, on both Keras, under an MPI launch (Horovod built with MPI; not
            under `horovodrun --gloo`).
        backward_passes_per_step: micro-batches per update (int >= 1). None: the scheduled optimizer's
            ITER_SIZE (`schedule.iter_size`, with `average_aggregated_gradients=True`: Caffe's averaging), or
            Keras 3's `gradient_accumulation_steps` of `optimizer`, else 1. Given, it keeps Horovod's default
            `average_aggregated_gradients=False` (a sum).
        average_aggregated_gradients: divide the k accumulated micro-batches by k (Caffe's `iter_size`,
            Keras 3's accumulation) instead of summing them. None: True where the accumulation comes from
            ITER_SIZE or from Keras 3's `gradient_accumulation_steps` (both average), else Horovod's False.
        num_groups: Horovod's deprecated form of `groups=int`.
        groups: an int > 0 splits the gradients into that many allreduce groups; a list of lists of variables
            puts each list in one group.
        process_set: reduce over this Horovod process set (default: every rank).
        scale_local_gradients: Horovod's, for worker-local variables (Keras 2); Keras 3: only True.

    Returns:
        The distributed optimizer (a new instance; `optimizer` itself is not changed).

    Raises:
        TypeError: `optimizer` is not a Keras optimizer.
        ValueError: it is already distributed (or scheduled from the outside: wrap in the other order); an
            argument is invalid or cannot be honoured here (named), e.g. `backward_passes_per_step` together with
            Keras 3's `gradient_accumulation_steps`, a k other than the schedule's ITER_SIZE, accumulation with
            a LossScaleOptimizer, `op=hvd.Adasum` without MPI or under `--gloo`, `groups=0` (with Horovod's
            message), or `scale_local_gradients=False` on Keras 3.
    """
    _compat.require_horovod("hvd_sched.keras.DistributedOptimizer")
    _horovod.check_launcher(require_init=False)
    if not _backend.is_optimizer(optimizer):
        raise TypeError(f"DistributedOptimizer wraps a Keras optimizer such as tf.keras.optimizers.SGD("
                        f"momentum=0.9), got {type(optimizer).__name__}: {optimizer!r}")
    if _backend.is_distributed(optimizer):
        raise ValueError(f"this optimizer ({type(optimizer).__name__}) already averages gradients over the ranks; "
                         "wrap the plain optimizer once")
    import horovod.tensorflow as hvd

    k, average = _accumulation(optimizer, backward_passes_per_step, average_aggregated_gradients)
    if num_groups and groups is not None:
        raise ValueError(f"give num_groups ({num_groups!r}) or groups, not both (num_groups is Horovod's "
                         "deprecated form of groups=int)")
    num_groups = _validation.integer("num_groups", num_groups, label="num_groups")
    if groups is None and num_groups:
        groups = num_groups
    if isinstance(groups, bool) or (groups is not None and not isinstance(groups, (int, list))):
        raise ValueError(f"groups must be an int >= 0 or a list of lists of variables, got {groups!r}")
    if isinstance(groups, int):
        if groups == 0:  # Horovod's own check and message (num_groups=0 is the default and means none)
            raise ValueError("groups should be a non-negative integer or a list of list of tf.Variable.")
        groups = _validation.integer("groups", groups, low=1, label="groups")
    problem = _horovod.adasum_problem(op, process_set, groups)
    if problem:
        raise ValueError(problem)
    if gradient_predivide_factor != 1.0 and (op is not None and op != hvd.Average):
        raise ValueError(f"gradient_predivide_factor={gradient_predivide_factor!r} splits an average; it needs "
                         f"op=hvd.Average, got op={op!r}")
    options = {"compression": compression, "sparse_as_dense": bool(sparse_as_dense),
               "gradient_predivide_factor": float(gradient_predivide_factor), "op": op, "groups": groups,
               "process_set": process_set, "device_dense": device_dense, "device_sparse": device_sparse,
               "name": name, "scale_local_gradients": scale_local_gradients}
    if _backend.KERAS_MAJOR == 2:
        options = {key: value for key, value in options.items() if value is not None}
        options.update(backward_passes_per_step=k, average_aggregated_gradients=average)
    else:
        options.update(backward_passes_per_step=k if _backend.micro_batches(optimizer) == 1 else 1,
                       average_aggregated_gradients=average)
    distributed = _backend.distributed_optimizer(optimizer, **options)
    problem = accumulation_problem(distributed, _iter_size(optimizer))
    if problem:
        raise ValueError(problem)
    return distributed


def _iter_size(optimizer):
    """The ITER_SIZE of the schedule `optimizer` follows, else 1 (an optimizer without a schedule)."""
    scheduled = scheduled_of(optimizer)
    return scheduled.schedule.iter_size if scheduled is not None else 1


def _accumulation(optimizer, backward_passes_per_step, average_aggregated_gradients):
    """(micro-batches per update, whether they are averaged) from the arguments, the schedule's ITER_SIZE and
    Keras 3's `gradient_accumulation_steps`; a ValueError naming the argument where they disagree."""
    iter_size = _iter_size(optimizer)
    own = _backend.micro_batches(optimizer)  # Keras 3's gradient_accumulation_steps (Keras 2: 1)
    if backward_passes_per_step is not None:
        k = _validation.integer("backward_passes_per_step", backward_passes_per_step, low=1,
                                label="backward_passes_per_step")
        if iter_size > 1 and k != iter_size:
            raise ValueError(f"backward_passes_per_step={k} differs from the schedule's ITER_SIZE {iter_size} "
                             "(micro-batches per iteration); leave backward_passes_per_step out (it then follows "
                             "ITER_SIZE) or change ITER_SIZE")
        if own > 1 and not k == own == iter_size:  # Keras 3's, unless ScheduledOptimizer set it from ITER_SIZE
            raise ValueError(f"backward_passes_per_step={k} and the optimizer's gradient_accumulation_steps={own} "
                             "would both accumulate; give the accumulation once (build the optimizer without "
                             "gradient_accumulation_steps, or leave backward_passes_per_step out)")
    else:
        k = own if own > 1 else iter_size
    averaged_by_default = iter_size > 1 or own > 1
    if average_aggregated_gradients is None:
        average = averaged_by_default
    elif not isinstance(average_aggregated_gradients, bool):
        raise TypeError(f"average_aggregated_gradients must be a bool, got {average_aggregated_gradients!r}")
    else:
        average = average_aggregated_gradients
        if averaged_by_default and not average:
            source = (f"the schedule's ITER_SIZE {iter_size}" if iter_size > 1 else
                      f"Keras 3's gradient_accumulation_steps={own}")
            raise ValueError(f"average_aggregated_gradients=False would sum the micro-batches, but {source} "
                             "averages them; leave average_aggregated_gradients out (or True)")
    return k, average


class DistributedCheck(_backend.keras.callbacks.Callback):
    """Before the first step, stop a job whose ranks would train apart or hang.

    The train step must not be XLA-compiled where it holds Horovod's collectives (they have no XLA kernels here):
    on Keras 2 wherever Horovod's wrapper is compiled (it puts its allreduce in the graph even on one rank), on
    Keras 3 on more than one rank. On more than one rank the compiled optimizer must also average gradients
    (hvd_sched.keras.DistributedOptimizer); on Keras 3 it must not be Horovod's own Keras wrapper (which does not
    average there), and a LossScaleOptimizer must be inside the distributed optimizer, not around it. The same
    checks run again while the step is traced (for jobs that do not use this callback); here they come first,
    without Keras' traceback of the step. At the first epoch begin: a model that `restore_latest` restored from
    inside an epoch must first fit the rest of that epoch (`resume_plan`), or the job stops, naming the fix.
    """

    def on_train_begin(self, logs=None):
        _horovod.check_launcher()
        self._first_epoch = True
        optimizer = self.model.optimizer
        size = _horovod.size()
        with_collectives = (_backend.is_horovod_keras_wrapped(optimizer) if _backend.KERAS_MAJOR == 2
                            else _backend.is_distributed(optimizer) and (size > 1 or _horovod.is_elastic()))
        if getattr(self.model, "jit_compile", False) and with_collectives and not _horovod.xla_ops_enabled():
            raise ValueError(_horovod.XLA_WITH_HOROVOD.format(
                auto="" if _backend.KERAS_MAJOR == 2
                else "; Keras 3's default jit_compile='auto' turns it on wherever a GPU is visible"))
        problem = accumulation_problem(optimizer, _iter_size(optimizer)) or \
            epoch_problem(self.model, (self.params or {}).get("steps"))
        if problem:
            raise ValueError(problem)
        if size == 1:
            return
        problem = _backend.distribution_problem(optimizer)
        if problem:
            raise ValueError(problem)
        if not _backend.is_distributed(optimizer):
            raise ValueError(_NOT_AVERAGED.format(name=type(optimizer).__name__, size=size))


    def on_epoch_begin(self, epoch, logs=None):
        # A model restored from inside an epoch must first fit the rest of that epoch (restore_latest).
        if getattr(self, "_first_epoch", False):
            self._first_epoch = False
            problem, _ = resume_offset(self.model, epoch, (self.params or {}).get("steps"))
            if problem:
                raise ValueError(problem)


class BroadcastVariables(_backend.keras.callbacks.Callback):
    """At train begin, every variable of the model and its optimizer from `root_rank` to all ranks (Keras 3).

    Keras 3 builds the optimizer's variables before `on_train_begin` (in `fit`'s symbolic build), so the first
    step already starts from identical weights and slots. Once per callback (the first `fit`). Horovod's
    `BroadcastGlobalVariablesCallback(root_rank, local_variables=...)` arguments, with Horovod's meaning.

    Args:
        root_rank: the rank whose values every rank takes (int >= 0).
        local_variables: a variable or a collection of variables each rank keeps as it is (worker-local state,
            excluded from the broadcast).
    """

    def __init__(self, root_rank=0, local_variables=None):
        super().__init__()
        if isinstance(root_rank, bool) or not isinstance(root_rank, int) or root_rank < 0:
            raise ValueError(f"root_rank must be an int >= 0, got {root_rank!r}")
        if local_variables is None:
            local_variables = []
        elif _backend.is_variable(local_variables):
            local_variables = [local_variables]
        else:
            local_variables = list(local_variables)
        for variable in local_variables:
            if not _backend.is_variable(variable):
                raise TypeError(f"local_variables must be variables (e.g. [model.layers[-1].bias]), got "
                                f"{type(variable).__name__}: {variable!r}")
        _compat.require_horovod("hvd_sched.keras.BroadcastVariables")
        self.root_rank = root_rank
        self.local_variables = local_variables
        self.done = False

    def on_train_begin(self, logs=None):
        import horovod.tensorflow as hvd

        if self.done or not hvd.is_initialized() or hvd.size() == 1:
            return
        local = {id(v) for v in _backend.backing_variables(self.local_variables)}
        variables = list(self.model.variables) + _backend.optimizer_variables(self.model.optimizer)
        hvd.broadcast_variables([v for v in _backend.backing_variables(variables) if id(v) not in local],
                                root_rank=self.root_rank)
        self.done = True


class AverageMetrics(_backend.keras.callbacks.Callback):
    """At each epoch end, every numeric entry of the logs averaged over the ranks (Keras 3; one allreduce).

    Put it before anything that reads the logs (History, checkpoints, TensorBoard): `horovod_callbacks` does.
    """

    def __init__(self):
        super().__init__()
        _compat.require_horovod("hvd_sched.keras.AverageMetrics")

    def on_epoch_end(self, epoch, logs=None):
        import horovod.tensorflow as hvd
        import numpy as np
        import tensorflow as tf

        if logs is None or not hvd.is_initialized() or hvd.size() == 1:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.isreal(v))
        if not keys:
            return
        values = tf.constant([float(logs[k]) for k in keys], tf.float64)
        averaged = hvd.allreduce(values, op=hvd.Average, name="hvd_sched_metrics").numpy()
        for key, value in zip(keys, averaged):
            logs[key] = float(value)


def distributed_callbacks(root_rank=0, average_metrics=True, local_variables=None):
    """[the checks, the initial broadcast, (the metric averaging)], for this Keras (see the module docstring);
    `local_variables` are left out of the broadcast (Horovod's argument)."""
    callbacks = [DistributedCheck()]
    if not _compat.HOROVOD:
        return callbacks  # one process without Horovod: nothing to broadcast or average (DistributedCheck stops a
        # launcher's job of several processes, naming the install)
    if _backend.KERAS_MAJOR == 3:
        callbacks.append(BroadcastVariables(root_rank, local_variables=local_variables))
        if average_metrics:
            callbacks.append(AverageMetrics())
    else:
        import horovod.tensorflow.keras as hvd

        callbacks.append(_keras2_broadcast(root_rank, local_variables))
        if average_metrics:
            callbacks.append(hvd.callbacks.MetricAverageCallback())
    return callbacks


def _keras2_broadcast(root_rank, local_variables):
    """Horovod's `BroadcastGlobalVariablesCallback` (Keras 2), broadcasting at train begin where it can.

    Horovod's callback broadcasts at the end of the first batch, once the optimizer has made its slots: the first
    step then runs on each rank's own initial weights (their averaged gradient is not the one of rank 0's weights),
    and the broadcast's ~0.25 s lands in Keras' batch timing, which then warns that `on_train_batch_end` is slow.
    Where the model is built, this one makes the slots first (as the first step would, `_backend.build_slots`)
    and runs Horovod's own broadcast in `on_train_begin`, so the first step starts from the root's weights and
    slots, as Detectron's broadcast from device 0 does; a model not built yet keeps Horovod's first-batch broadcast.
    """
    global _BroadcastAtTrainBegin
    if _BroadcastAtTrainBegin is None:
        import horovod.tensorflow.keras as hvd

        class BroadcastGlobalVariablesCallback(hvd.callbacks.BroadcastGlobalVariablesCallback):
            __doc__ = hvd.callbacks.BroadcastGlobalVariablesCallback.__doc__

            def on_train_begin(self, logs=None):
                if self.broadcast_done or not self.model.built or self.model.optimizer is None:
                    return
                _backend.build_slots(self.model.optimizer, self.model.trainable_variables)
                self.on_batch_end(0)  # Horovod's broadcast itself: the model's variables and the optimizer's

        _BroadcastAtTrainBegin = BroadcastGlobalVariablesCallback
    return _BroadcastAtTrainBegin(root_rank, local_variables=local_variables)


_BroadcastAtTrainBegin = None
