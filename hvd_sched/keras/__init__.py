"""Keras glue for hvd_sched (imports TensorFlow and Horovod; `import hvd_sched` alone does not).

Where Horovod is not installed, it runs in one process (the solver, the callbacks, the checkpoints, `load_model`);
the names that need Horovod (`DistributedOptimizer`, `BroadcastVariables`, `AverageMetrics`, `ElasticLRScaler`,
`elastic_state`, a launcher's job of several processes) raise `HorovodMissingError`, naming the install. A Horovod
that is installed but does not load (built for another TensorFlow) stops the import, as before.

The same names on Keras 2 (TensorFlow 2.15's `tf.keras`, tf-keras) and Keras 3 (`KERAS_MAJOR` says which):

- `ScheduledOptimizer(optimizer, schedule, ...)`: LR from `optimizer.iterations` in the training graph, momentum
  slots rescaled in the same step when the LR jumps, per-variable LR multipliers and coupled weight decay.
- `DistributedOptimizer(optimizer, ...)`: gradients averaged over the Horovod ranks, Horovod's arguments
  (gradient accumulation: `backward_passes_per_step`, or the schedule's ITER_SIZE); Horovod's own wrapper on
  Keras 2, Horovod's TensorFlow collectives on Keras 3, where Horovod's Keras wrapper averages nothing.
- `iteration_count(optimizer)`: the updates made (Detectron's iteration), whatever the framework's counter
  counts under gradient accumulation.
- `build_optimizer(solver, model, ...)`: Detectron's whole solver for a built model from one config;
  `describe_optimizer` says which rules it applies.
- `horovod_callbacks(...)`: the checks, the initial broadcast, metric averaging, the LR logger, in order.
- `ScheduleCallback(schedule, ...)`: the same schedule and correction for a plain optimizer.
- `TrainingCheckpoint(directory, period=N)`: checkpoints at epoch ends, every N iterations and at SIGTERM/SIGINT
  (every rank stops at the same iteration; `TrainingInterrupted` ends the process with 128 + the signal);
  `restore_latest` and `resume_plan` continue a run exactly, inside an epoch too.
- `LearningRateLogger`, `ScheduleLR(schedule)`, `EpochCheckpoint`, `StopOnNonFinite`,
  `RankConsistencyCheck`, `DistributedCheck`, `ElasticLRScaler` / `elastic_state`.

Examples:
    ```python
    import hvd_sched, hvd_sched.keras  # first: it checks the stack (on the tf2.21 row: keras -> tf_keras)
    import tensorflow as tf, horovod.tensorflow.keras as hvd
    from hvd_sched.keras import DistributedOptimizer, ScheduledOptimizer, horovod_callbacks
    hvd.init()
    schedule = hvd_sched.from_detectron("examples/configs/digits_warmup_steps.yaml", world_size=hvd.size(),
                                        steps_per_epoch=22)
    opt = DistributedOptimizer(ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule))
    model.compile(opt, "sparse_categorical_crossentropy", metrics=["accuracy"], jit_compile=False)
    model.fit(x, y, epochs=8, callbacks=horovod_callbacks())
    ```
"""

from hvd_sched import _compat  # noqa: F401  (first: stack check; keras -> tf_keras on TF >= 2.16; before Horovod)

from ._backend import KERAS_MAJOR
from .build import build_optimizer, describe_optimizer, parameter_groups
from .callbacks import LearningRateLogger, ScheduleCallback, horovod_callbacks
from .checkpoint import (PEER_LOST_STATUS, EpochCheckpoint, FitPart, TrainingCheckpoint, TrainingInterrupted,
                         latest_checkpoint, restore_latest, resume_plan)
from .saving import load_model
from .distributed import AverageMetrics, BroadcastVariables, DistributedCheck, DistributedOptimizer
from .elastic import ElasticLRScaler, elastic_state
from ._horovod import LauncherMismatchError, check_launcher
from .._compat import HorovodMissingError
from .guards import NonFiniteLossError, RankConsistencyCheck, RankMismatchError, StopOnNonFinite
from .lr_schedule import ScheduleLR
from .optimizer import ScheduledOptimizer, custom_objects, is_scheduled, scheduled_class, scheduled_of
from ._tracking import iteration_count

__all__ = ["ScheduledOptimizer", "DistributedOptimizer", "ScheduleCallback", "LearningRateLogger",
           "horovod_callbacks", "ScheduleLR", "is_scheduled", "scheduled_of", "scheduled_class", "custom_objects",
           "load_model", "TrainingCheckpoint", "TrainingInterrupted", "PEER_LOST_STATUS", "EpochCheckpoint",
           "latest_checkpoint",
           "restore_latest", "resume_plan", "FitPart", "StopOnNonFinite",
           "RankConsistencyCheck", "NonFiniteLossError", "RankMismatchError", "DistributedCheck",
           "BroadcastVariables", "AverageMetrics", "ElasticLRScaler", "elastic_state", "build_optimizer", "describe_optimizer",
           "parameter_groups", "iteration_count", "KERAS_MAJOR", "check_launcher",
           "LauncherMismatchError", "HorovodMissingError"]
