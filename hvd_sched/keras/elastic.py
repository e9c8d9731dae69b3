"""Elastic Horovod: keep the linear scaling rule when the world size changes, without losing the schedule.

Each process builds its schedule for the world size it starts with (e.g. BASE_LR = hvd_sched.linear_scaled_lr(
base, hvd.size())). On an elastic reset `ElasticLRScaler` sets the optimizer's LR scale to
new_size / start_size, so every later iteration uses `schedule.lr_at(it) * scale` (the LR the schedule would give
at the new world size), and rescales the momentum slots by new_lr/old_lr at that moment, exactly as a scheduled LR
jump is corrected (Goyal et al. 2017, sec. 2.1). The iteration counter lives in the optimizer, so
`hvd.elastic.KerasState` keeps the schedule position across the reset; a process that joins later builds its
schedule for the size it starts with and receives the slots from rank 0 in the state sync.
"""

from .. import _compat
from . import _backend, _horovod
from ._tracking import iteration_count
from .optimizer import scheduled_of

__all__ = ["ElasticLRScaler", "elastic_state"]


def elastic_state(model, optimizer=None, **kwargs):
    """Horovod's elastic state of a compiled model and its optimizer, for `hvd.elastic.run`.

    Horovod's `KerasState(model, optimizer=None, **kwargs)` arguments and order. Keras 2: that class itself.
    Keras 3, where it calls Keras 2 APIs (`optimizer.variables()`): Horovod's
    `horovod.tensorflow.elastic.TensorFlowState` over the `tf.Variable`s behind every model and optimizer
    variable (the optimizer is built first, so its slots and iteration count are part of the state). Either way
    Horovod saves, restores and broadcasts the state.

    Examples:
        ```python
        state = hvd_sched.keras.elastic_state(model, batch=0, epoch=0)
        state.register_reset_callbacks([hvd_sched.keras.ElasticLRScaler(model.optimizer)])
        ```

    Args:
        model: the compiled model.
        optimizer: the optimizer whose state is kept; default `model.optimizer`.
        **kwargs: extra state attributes (`batch=0, epoch=0` for Horovod's Keras elastic callbacks).

    Returns:
        The Horovod state object (`state.model`, `state.optimizer`).
    """
    _compat.require_horovod("hvd_sched.keras.elastic_state")
    if _backend.KERAS_MAJOR == 2:
        import horovod.tensorflow.keras as hvd

        return hvd.elastic.KerasState(model, optimizer, **kwargs)
    from horovod.tensorflow.elastic import TensorFlowState

    optimizer = optimizer or model.optimizer
    _backend.build_slots(optimizer, model.trainable_variables)
    variables = list(model.variables) + _backend.optimizer_variables(optimizer)
    state = TensorFlowState(_backend.backing_variables(variables), **kwargs)
    state.model, state.optimizer = model, optimizer  # as on KerasState (not synced: the variables are)
    return state


class ElasticLRScaler:
    """A reset callback for `hvd.elastic.KerasState.register_reset_callbacks` that keeps the linear scaling rule.

    On each elastic reset the LR becomes `schedule.lr_at(it) * new_size / start_size`, the momentum slots are
    rescaled by new_lr/old_lr at that moment (as a scheduled LR jump is corrected), and the iteration is kept.

    Examples:
        ```python
        state = hvd_sched.keras.elastic_state(model, batch=0, epoch=0)  # Keras 2: hvd.elastic.KerasState
        state.register_reset_callbacks([hvd_sched.keras.ElasticLRScaler(model.optimizer)])
        ```

    Args:
        optimizer: the (Horovod-wrapped) ScheduledOptimizer, built for the world size at construction time.
        verbose: 1 prints one line on rank 0 at each rescale.
    """

    def __init__(self, optimizer, verbose=1):
        _compat.require_horovod("hvd_sched.keras.ElasticLRScaler")
        import horovod.tensorflow as hvd

        if scheduled_of(optimizer) is None:
            raise TypeError(f"ElasticLRScaler needs a ScheduledOptimizer, got {type(optimizer).__name__}")
        self.optimizer = scheduled_of(optimizer)
        self.verbose = verbose
        self.start_size = hvd.size()
        self.history = []

    def __call__(self):
        import horovod.tensorflow as hvd

        size = hvd.size()
        old_scale = self.optimizer.lr_scale
        scale = size / self.start_size
        factor = self.optimizer.set_lr_scale(scale)
        iteration = iteration_count(self.optimizer)
        self.history.append({"iteration": iteration, "world_size": size, "old_scale": old_scale, "scale": scale,
                             "slot_factor": factor})
        if self.verbose and _horovod.rank() == 0:
            print(f"hvd_sched: world size is now {size} at iteration {iteration}: LR scale {old_scale:g} -> "
                  f"{scale:g}, momentum slots scaled by {factor:g}", flush=True)
