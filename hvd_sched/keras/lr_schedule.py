"""`ScheduleLR`: an hvd_sched schedule as a Keras `LearningRateSchedule`, evaluated inside the training graph."""

import numpy as np
import tensorflow as tf

from ._tables import as_schedule, lr_table

__all__ = ["ScheduleLR"]


@tf.keras.utils.register_keras_serializable(package="hvd_sched")
class ScheduleLR(tf.keras.optimizers.schedules.LearningRateSchedule):
    """The LR of an hvd_sched `Schedule` at `optimizer.iterations`, computed in-graph.

    The schedule is tabulated once in numpy (`Schedule.lr_at` over 0..`hold_iter`) and the graph gathers
    `table[min(step, hold_iter)]`, so the LR used in training is exactly `schedule.lr_at(step)` (float32, as
    Detectron's `get_lr_at_iter`). This gives the LR without momentum correction; `ScheduledOptimizer` uses it
    and adds the correction.

    Example:
        >>> sched = hvd_sched.from_detectron({"BASE_LR": 0.1, "LR_POLICY": "steps_with_decay",
        ...                                   "STEPS": [0, 300], "MAX_ITER": 400, "WARM_UP_ITERS": 50})
        >>> opt = tf.keras.optimizers.Adam(learning_rate=ScheduleLR(sched))

    Args:
        schedule: an `hvd_sched.Schedule` or its `get_config()` dict.
    """

    def __init__(self, schedule):
        self.schedule = as_schedule(schedule)
        self._table = lr_table(self.schedule)
        # A ScheduledOptimizer sets this to its world-size scale variable (elastic Horovod); x * 1.0 == x, so
        # the LR stays exactly lr_at(step) until the world size changes.
        self.scale = None

    def __call__(self, step):
        with tf.name_scope("hvd_sched_lr"):
            table = tf.constant(self._table, dtype=tf.float32)
            index = tf.minimum(tf.cast(step, tf.int64), np.int64(self.schedule.hold_iter))
            lr = tf.gather(table, index)  # iterations are never negative
            return lr if self.scale is None else lr * self.scale

    def get_config(self):
        return {"schedule": self.schedule.get_config()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
