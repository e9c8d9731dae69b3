"""The global iteration of each batch, for the callbacks, without reading the device every batch."""

from . import _backend

__all__ = ["IterationTracker"]


class IterationTracker(_backend.keras.callbacks.Callback):
    """Knows the global iteration of each batch: the optimizer's `iterations` at the epoch's start + batch index.

    Where a skipped step does not count (Keras 3's LossScaleOptimizer skips steps with non-finite gradients
    without advancing `iterations`), the batch index runs ahead of the schedule, and the iteration is read from
    the optimizer instead: at batch begin the one the step will run at, at batch end the last applied one.
    """

    def __init__(self):
        super().__init__()
        self._epoch_start = 0

    def _read_iterations(self):
        return int(_backend.get_value(self.model.optimizer.iterations))

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._read_iterations()

    def _iteration(self, batch):
        """The iteration of the step `batch` ran (at batch end: the last applied one)."""
        if _backend.skips_iterations(self.model.optimizer):
            return max(self._read_iterations() - 1, 0)
        return self._epoch_start + int(batch)

    def _iteration_begin(self, batch):
        """The iteration the step of `batch` is about to run."""
        if _backend.skips_iterations(self.model.optimizer):
            return self._read_iterations()
        return self._epoch_start + int(batch)
