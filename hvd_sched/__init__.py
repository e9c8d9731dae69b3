"""hvd_sched: Detectron's solver schedule (policies, warmup, momentum correction), pure numpy.

The maths imports no TensorFlow and no Horovod, so a schedule can be tested, plotted and checked without a
training run; the Keras/Horovod glue is the separate subpackage `hvd_sched.keras`.

Examples:
    >>> import numpy as np, hvd_sched
    >>> schedule = hvd_sched.from_detectron("examples/configs/e2e_faster_rcnn_R-50-FPN_1x.yaml")  # or a SOLVER dict
    >>> schedule.lr_at(np.arange(schedule.max_iter)).dtype    # float32, bit-identical to Detectron
    dtype('float32')
    >>> schedule.momentum_corrections(schedule.max_iter)     # [(iteration, new_lr / old_lr), ...]
    [(60000, 0.10000000894069672), (80000, 0.09999999403953552)]
    >>> hvd_sched.Schedule.from_config(schedule.get_config()) == schedule
    True
"""

from ._version import __version__
from .config import (
    EPOCH_KEYS,
    SOLVER_KEYS,
    from_detectron,
    gradual_warmup_factor,
    linear_scaled_lr,
    linear_scaled_lr_for_batch,
    load_solver,
    snapshot_period,
)
from .momentum import MODES, correction_factor, correction_factors, lr_change_ratio
from .policies import POLICIES, WARM_UP_METHODS
from .schedules import Schedule

__all__ = [
    "Schedule",
    "from_detectron",
    "load_solver",
    "snapshot_period",
    "linear_scaled_lr",
    "linear_scaled_lr_for_batch",
    "gradual_warmup_factor",
    "correction_factor",
    "correction_factors",
    "lr_change_ratio",
    "POLICIES",
    "WARM_UP_METHODS",
    "MODES",
    "SOLVER_KEYS",
    "EPOCH_KEYS",
    "__version__",
]
