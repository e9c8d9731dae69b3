"""What ``bench/overhead.py`` compares hvd_sched with, besides Keras itself: Horovod's own LR callbacks (Keras 2) and
the least data-parallel Keras 3 optimizer (the "floor"). Imports TensorFlow and Horovod inside the functions."""

__all__ = ["horovod_lr_callbacks", "horovod_momentum_correction_check", "floor_optimizer_class"]


def horovod_lr_callbacks(steps_per_epoch, *, base_lr, warmup_epochs, decay_epochs, gamma):
    """Horovod's LR callbacks for warmup then steps: one LearningRateScheduleCallback per phase."""
    # Horovod reads a float multiplier as exponential decay (multiplier ** (epoch - start_epoch)); a constant
    # function gives the step schedule.
    import horovod.tensorflow.keras as hvd_keras

    first, second = decay_epochs
    common = {"initial_lr": base_lr, "momentum_correction": False, "steps_per_epoch": steps_per_epoch}
    return [
        hvd_keras.callbacks.LearningRateWarmupCallback(warmup_epochs=warmup_epochs, **common),
        hvd_keras.callbacks.LearningRateScheduleCallback(multiplier=lambda epoch: 1.0, start_epoch=warmup_epochs,
                                                         end_epoch=first, **common),
        hvd_keras.callbacks.LearningRateScheduleCallback(multiplier=lambda epoch: gamma, start_epoch=first,
                                                         end_epoch=second, **common),
        hvd_keras.callbacks.LearningRateScheduleCallback(multiplier=lambda epoch: gamma ** 2, start_epoch=second,
                                                         **common),
    ]


def floor_optimizer_class(keras):
    """Keras 3's least data-parallel SGD: ``apply`` averages with one ``grouped_allreduce``, then updates."""
    import horovod.tensorflow as hvd

    class FloorSGD(keras.optimizers.SGD):
        def apply(self, grads, trainable_variables=None):
            return super().apply(hvd.grouped_allreduce(list(grads), op=hvd.Average), trainable_variables)

    return FloorSGD


def horovod_momentum_correction_check(keras, model, dataset, *, base_lr, momentum):
    """Keras 2: run Horovod's warmup callback with momentum_correction=True once on `model` (uncompiled); return
    what happened."""
    import horovod.tensorflow.keras as hvd_keras

    model.compile(hvd_keras.DistributedOptimizer(keras.optimizers.SGD(base_lr, momentum=momentum)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = hvd_keras.callbacks.LearningRateWarmupCallback(initial_lr=base_lr, warmup_epochs=1,
                                                              momentum_correction=True, steps_per_epoch=2)
    try:
        model.fit(dataset, epochs=1, steps_per_epoch=2, verbose=0, callbacks=[callback])
    except AttributeError as error:  # the known failure: `momentum` is a Python float on the TF 2.11+ SGD
        return {"runs": False, "error": f"{type(error).__name__}: {error}"}
    return {"runs": True, "error": None}
