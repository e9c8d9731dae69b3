"""`DistributedOptimizer` and the distributed callbacks: one API over Keras 2 and Keras 3, Horovod doing the work.

- Keras 2 (`tf.keras` 2.15, tf-keras): `DistributedOptimizer` is Horovod's own
  `horovod.tensorflow.keras.DistributedOptimizer` (it allreduces in `_compute_gradients`, which Keras 2's
  `train_step` calls), and the callbacks are Horovod's `BroadcastGlobalVariablesCallback` and
  `MetricAverageCallback`.
- Keras 3: Horovod 0.28.1's Keras layer trains the ranks apart without an error (Keras 3's `train_step` never calls
  the hooks it overrides: horovod #4290), so `DistributedOptimizer` is a subclass of the optimizer's class whose
  `apply` first averages the gradients with `horovod.tensorflow.grouped_allreduce` (one call per dtype; sparse
  gradients are allgathered by Horovod); the callbacks broadcast the model's and the optimizer's variables from
  the root rank with `horovod.tensorflow.broadcast_variables` at train begin, and average the epoch metrics
  with one `horovod.tensorflow.allreduce`. Nothing is reimplemented: every collective is Horovod's.

Wrap the scheduled optimizer, not the other way round:
`DistributedOptimizer(ScheduledOptimizer(SGD(momentum=0.9), schedule))`.
"""

from . import _backend, _horovod

__all__ = ["DistributedOptimizer", "distributed_callbacks", "DistributedCheck", "BroadcastVariables",
           "AverageMetrics"]

_NOT_AVERAGED = ("hvd_sched: the model's optimizer {name} does not average gradients over the {size} Horovod ranks, "
                 "so they would train apart; compile with hvd_sched.keras.DistributedOptimizer(optimizer)")


def DistributedOptimizer(optimizer, *, compression=None, sparse_as_dense=False):
    """`optimizer`, averaging its gradients over the Horovod ranks before every update.

    Example:
        >>> import hvd_sched.keras, horovod.tensorflow as hvd
        >>> hvd.init()
        >>> opt = hvd_sched.keras.DistributedOptimizer(
        ...     hvd_sched.keras.ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule))
        >>> model.compile(opt, "sparse_categorical_crossentropy")
        >>> model.fit(x, y, callbacks=hvd_sched.keras.horovod_callbacks())

    On Keras 2 this is `horovod.tensorflow.keras.DistributedOptimizer(optimizer, ...)`. On Keras 3 it returns an
    instance of a subclass of `type(optimizer)` (rebuilt from `optimizer.get_config()`, as Horovod does) whose
    `apply` averages the gradients first; a `LossScaleOptimizer` (mixed precision) is wrapped as a whole, so the
    finite-gradient check sees the averaged gradients and every rank skips or applies the same steps. Under the
    `mixed_float16` policy a plain optimizer is put inside a `LossScaleOptimizer` here, which `model.compile`
    then keeps, for the same reason.

    Args:
        optimizer: a Keras optimizer (e.g. a `ScheduledOptimizer`), or a Keras 3 `LossScaleOptimizer`.
        compression: `horovod.tensorflow.Compression.fp16` to send float16 gradients; None sends them as they are.
        sparse_as_dense: allreduce sparse gradients (embeddings) as dense tensors instead of allgathering them.

    Returns:
        The distributed optimizer (a new instance; `optimizer` itself is not changed).

    Raises:
        TypeError: `optimizer` is not a Keras optimizer.
        ValueError: it is already distributed.
    """
    if not _backend.is_optimizer(optimizer):
        raise TypeError(f"DistributedOptimizer wraps a Keras optimizer such as tf.keras.optimizers.SGD("
                        f"momentum=0.9), got {type(optimizer).__name__}: {optimizer!r}")
    if _backend.is_distributed(optimizer):
        raise ValueError(f"this optimizer ({type(optimizer).__name__}) already averages gradients over the ranks; "
                         "wrap the plain optimizer once")
    kwargs = {"sparse_as_dense": bool(sparse_as_dense)}
    if compression is not None:
        kwargs["compression"] = compression
    return _backend.distributed_optimizer(optimizer, **kwargs)


class DistributedCheck(_backend.keras.callbacks.Callback):
    """Before the first step, stop a job whose ranks would train apart or hang.

    The train step must not be XLA-compiled where it holds Horovod's collectives (they have no XLA kernels here):
    on Keras 2 wherever Horovod's wrapper is compiled (it puts its allreduce in the graph even on one rank), on
    Keras 3 on more than one rank. On more than one rank the compiled optimizer must also average gradients
    (hvd_sched.keras.DistributedOptimizer); on Keras 3 it must not be Horovod's own Keras wrapper (which does not
    average there), and a LossScaleOptimizer must be inside the distributed optimizer, not around it. The same
    checks run again while the step is traced (for jobs that do not use this callback); here they come first,
    without Keras' traceback of the step.
    """

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        size = _horovod.size()
        with_collectives = (_backend.is_horovod_keras_wrapped(optimizer) if _backend.KERAS_MAJOR == 2
                            else _backend.is_distributed(optimizer) and (size > 1 or _horovod.is_elastic()))
        if getattr(self.model, "jit_compile", False) and with_collectives and not _horovod.xla_ops_enabled():
            raise ValueError(_horovod.XLA_WITH_HOROVOD.format(
                auto="" if _backend.KERAS_MAJOR == 2
                else "; Keras 3's default jit_compile='auto' turns it on wherever a GPU is visible"))
        if size == 1:
            return
        problem = _backend.distribution_problem(optimizer)
        if problem:
            raise ValueError(problem)
        if not _backend.is_distributed(optimizer):
            raise ValueError(_NOT_AVERAGED.format(name=type(optimizer).__name__, size=size))


class BroadcastVariables(_backend.keras.callbacks.Callback):
    """At train begin, every variable of the model and its optimizer from `root_rank` to all ranks (Keras 3).

    Keras 3 builds the optimizer's variables before `on_train_begin` (in `fit`'s symbolic build), so the first
    step already starts from identical weights and slots. Once per callback (the first `fit`).

    Args:
        root_rank: the rank whose values every rank takes.
    """

    def __init__(self, root_rank=0):
        super().__init__()
        self.root_rank = root_rank
        self.done = False

    def on_train_begin(self, logs=None):
        import horovod.tensorflow as hvd

        if self.done or not hvd.is_initialized() or hvd.size() == 1:
            return
        variables = list(self.model.variables) + _backend.optimizer_variables(self.model.optimizer)
        hvd.broadcast_variables(_backend.backing_variables(variables), root_rank=self.root_rank)
        self.done = True


class AverageMetrics(_backend.keras.callbacks.Callback):
    """At each epoch end, every numeric entry of the logs averaged over the ranks (Keras 3; one allreduce).

    Put it before anything that reads the logs (History, checkpoints, TensorBoard): `horovod_callbacks` does.
    """

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


def distributed_callbacks(root_rank=0, average_metrics=True):
    """[the checks, the initial broadcast, (the metric averaging)], for this Keras (see the module docstring)."""
    callbacks = [DistributedCheck()]
    if _backend.KERAS_MAJOR == 3:
        callbacks.append(BroadcastVariables(root_rank))
        if average_metrics:
            callbacks.append(AverageMetrics())
    else:
        import horovod.tensorflow.keras as hvd

        callbacks.append(hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank))
        if average_metrics:
            callbacks.append(hvd.callbacks.MetricAverageCallback())
    return callbacks
