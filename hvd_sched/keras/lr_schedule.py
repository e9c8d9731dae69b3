"""`ScheduleLR`: an hvd_sched schedule as a Keras `LearningRateSchedule`, evaluated inside the training graph."""

import tensorflow as tf

from .. import _validation
from . import _backend
from ._tables import as_schedule, graph_lr

__all__ = ["ScheduleLR"]


@_backend.register
class ScheduleLR(_backend.LearningRateSchedule):
    """The LR of an hvd_sched `Schedule` at `optimizer.iterations`, computed in-graph.

    The graph computes the policy's float64 formula with the same operations as `Schedule.lr_at` (a boundary
    search for the piecewise-constant policies) and rounds it to float32, so the LR used in training is
    `schedule.lr_at(step)` (float32, as Detectron's `get_lr_at_iter`), with no per-iteration table: the graph
    is the same size for MAX_ITER 1e4 and 1e9. This gives the LR without momentum correction, for any optimizer;
    `ScheduledOptimizer` uses it and adds the correction.

    Examples:
        ```python
        sched = hvd_sched.from_detectron({"BASE_LR": 0.1, "LR_POLICY": "steps_with_decay",
                                          "STEPS": [0, 300], "MAX_ITER": 400, "WARM_UP_ITERS": 50})
        opt = tf.keras.optimizers.Adam(learning_rate=ScheduleLR(sched))
        ```

    With gradient accumulation Keras 3 calls a learning-rate schedule with its micro-batch count
    (`optimizer._iterations`, not `optimizer.iterations`), so an optimizer built with
    `gradient_accumulation_steps=k` needs `ScheduleLR(schedule, micro_batches=k)`: the LR is then that of the
    update, `schedule.lr_at(step // k)` (Detectron's iteration counts updates). `ScheduledOptimizer` sets it
    itself, also for Horovod's `backward_passes_per_step` on Keras 2.

    Args:
        schedule: an `hvd_sched.Schedule` or its `get_config()` dict.
        micro_batches: micro-batches per update (int >= 1): the step Keras passes is divided by it.
    """

    def __init__(self, schedule, micro_batches=1):
        self.schedule = as_schedule(schedule)
        self.micro_batches = _validation.integer("micro_batches", micro_batches, low=1, label="micro_batches")
        # A ScheduledOptimizer sets this to its world-size scale variable (elastic Horovod); x * 1.0 == x, so
        # the LR stays exactly lr_at(step) until the world size changes.
        self.scale = None

    def __call__(self, step):
        with tf.name_scope("hvd_sched_lr"):
            step = tf.convert_to_tensor(step)  # `optimizer.iterations`: one read, not one per use
            if self.micro_batches > 1:
                step = step // tf.cast(self.micro_batches, step.dtype)  # the update this micro-batch belongs to
            lr = graph_lr(self.schedule, step)
            return lr if self.scale is None else lr * self.scale

    def get_config(self):
        return {"schedule": self.schedule.get_config(), "micro_batches": self.micro_batches}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
