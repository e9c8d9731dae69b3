"""Keras glue for hvd_sched (imports TensorFlow; `import hvd_sched` alone does not).

- `ScheduledOptimizer(optimizer, schedule, ...)`: LR from `optimizer.iterations` in-graph, momentum slots
  rescaled in-graph when the LR jumps, per-variable LR multipliers. Wrap it with `hvd.DistributedOptimizer`.
- `ScheduleCallback(schedule, ...)`: the same schedule and correction for a plain optimizer.
- `LearningRateLogger`: `learning_rate` in Keras logs for a ScheduledOptimizer.
- `horovod_callbacks(...)`: broadcast, metric averaging and the LR callback, in order.
- `ScheduleLR(schedule)`: the schedule as a Keras LearningRateSchedule (no correction).
- `build_optimizer(solver, model, ...)`: Detectron's whole solver (momentum, Nesterov, per-parameter weight decay
  and bias LR) for a built model, as a ScheduledOptimizer; `describe_optimizer` says which rules it applies.
- `EpochCheckpoint` / `restore_latest`: atomic per-epoch checkpoints on rank 0, restored on every rank.
- `ElasticLRScaler`: elastic Horovod reset callback; the LR follows the world size, slots rescaled.
- `StopOnNonFinite`, `RankConsistencyCheck`: a NaN loss or disagreeing ranks stop the job with a clear message.

Example:
    >>> import hvd_sched, hvd_sched.keras  # first: on the tf2.20 row it resolves keras to tf_keras
    >>> import tensorflow as tf, horovod.tensorflow.keras as hvd
    >>> from hvd_sched.keras import ScheduledOptimizer, horovod_callbacks
    >>> hvd.init()
    >>> schedule = hvd_sched.from_detectron("examples/configs/digits_warmup_steps.yaml")
    >>> opt = hvd.DistributedOptimizer(ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule))
    >>> model.compile(opt, "sparse_categorical_crossentropy", metrics=["accuracy"])
    >>> model.fit(x, y, epochs=8, callbacks=horovod_callbacks())
"""

from hvd_sched import _compat  # noqa: F401  (first: stack check; keras -> tf_keras on TF >= 2.16; before Horovod)

from ._backend import KERAS_MAJOR
from .build import build_optimizer, describe_optimizer, parameter_groups
from .callbacks import LearningRateLogger, ScheduleCallback, horovod_callbacks
from .checkpoint import EpochCheckpoint, latest_checkpoint, restore_latest
from .distributed import AverageMetrics, BroadcastVariables, DistributedCheck, DistributedOptimizer
from .elastic import ElasticLRScaler, elastic_state
from .guards import NonFiniteLossError, RankConsistencyCheck, RankMismatchError, StopOnNonFinite
from .lr_schedule import ScheduleLR
from .optimizer import ScheduledOptimizer, custom_objects, is_scheduled, load_model, scheduled_class, scheduled_of

__all__ = ["ScheduledOptimizer", "DistributedOptimizer", "ScheduleCallback", "LearningRateLogger",
           "horovod_callbacks", "ScheduleLR", "is_scheduled", "scheduled_of", "scheduled_class", "custom_objects",
           "load_model", "EpochCheckpoint", "latest_checkpoint", "restore_latest", "StopOnNonFinite",
           "RankConsistencyCheck", "NonFiniteLossError", "RankMismatchError", "DistributedCheck",
           "BroadcastVariables", "AverageMetrics", "ElasticLRScaler", "elastic_state", "build_optimizer", "describe_optimizer",
           "parameter_groups", "KERAS_MAJOR"]
