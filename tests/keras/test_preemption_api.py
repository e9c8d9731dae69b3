"""TrainingCheckpoint in one process: a stop signal at any iteration, the checkpoint it saves, and the resume that
ends bit for bit on the weights, slots and iteration of the run never stopped (TensorFlow op determinism on).

The signal is sent to this process from a callback at a chosen micro-batch, the way a scheduler's SIGTERM lands
between two steps; the multi-rank cases (launchers, one rank signalled, ranks a step apart) are in
tests/multirank/test_preemption.py.
"""

import os
import pickle
import signal

import numpy as np
import pytest

import hvd_sched
import hvd_sched.keras as hk
import rankutil

tf = pytest.importorskip("tensorflow")

STEPS, EPOCHS, BATCH = 6, 3, 8
SOLVER = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 8, 14], "MAX_ITER": 18,
          "WARM_UP_ITERS": 4, "WARM_UP_FACTOR": 0.25, "MOMENTUM": 0.9, "SCALE_MOMENTUM": True}
X, Y = rankutil.make_regression(n=200, seed=5)


def _model(horovod, iter_size):
    model = rankutil.make_mlp(seed=2)
    schedule = hvd_sched.from_detectron(dict(SOLVER, ITER_SIZE=iter_size))
    optimizer = hk.ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule,
                                      lr_multipliers={"bias": 2.0})
    if iter_size > 1:  # the accumulation is Horovod's (Keras 2) or Keras 3's, set by DistributedOptimizer
        optimizer = hk.DistributedOptimizer(optimizer)
    model.compile(optimizer, "mse")
    return model


def _data(skip):
    """An endless stream of shuffled batches, starting after `skip` micro-batches (as the example's)."""
    stream = tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(len(X), seed=3, reshuffle_each_iteration=True)
    return stream.repeat().batch(BATCH, drop_remainder=True).skip(skip)


class _SignalAt(tf.keras.callbacks.Callback):
    """Sends `number` to this process at the end of micro-batch `at` (counted from the start of training)."""

    def __init__(self, at, number=signal.SIGTERM):
        super().__init__()
        self.at, self.number, self.seen = at, number, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.at:
            os.kill(os.getpid(), self.number)


def _fit(model, part, callbacks):
    model.fit(_data(part.skip_batches), steps_per_epoch=part.steps_per_epoch, epochs=part.epochs,
              initial_epoch=part.initial_epoch, verbose=0, callbacks=callbacks)


def _state(model):
    return [v.numpy() for v in model.variables] + [v.numpy() for v in
                                                   hk._backend.optimizer_variables(model.optimizer)]


@pytest.fixture(scope="module")
def uninterrupted(horovod):
    """{iter_size: (state, iteration)} of the runs never stopped."""
    out = {}
    for k in (1, 2):
        model = _model(horovod, k)
        for part in hk.resume_plan(None, STEPS, EPOCHS, micro_batches=k):
            _fit(model, part, [])
        out[k] = (_state(model), hk.iteration_count(model.optimizer))
    return out


# (micro-batches per update, the micro-batch at whose end the signal comes, the iteration every rank stops at):
# inside an epoch, on its last update (an epoch-end checkpoint), the first update, and, with accumulation, in the
# middle of an update (the stop waits for the update's end: the accumulators are in no checkpoint).
CASES = [(1, 1, 1), (1, 4, 4), (1, 6, 6), (1, 7, 7), (1, 11, 11), (1, 17, 17),
         (2, 1, 1), (2, 5, 3), (2, 8, 4), (2, 12, 6), (2, 23, 12)]


@pytest.mark.parametrize("k, at, stops_at", CASES)
def test_a_signal_at_any_iteration_resumes_to_the_run_never_stopped(tmp_path, horovod, uninterrupted, k, at,
                                                                    stops_at):
    model = _model(horovod, k)
    handler = signal.getsignal(signal.SIGTERM)
    checkpoint = hk.TrainingCheckpoint(tmp_path, period=5, agree_every=1e-9)
    with pytest.raises(hk.TrainingInterrupted) as stopped:
        for part in hk.resume_plan(None, STEPS, EPOCHS, micro_batches=k):
            _fit(model, part, [_SignalAt(at), checkpoint])
    assert signal.getsignal(signal.SIGTERM) is handler  # restored once the job is stopped
    assert stopped.value.code == 128 + signal.SIGTERM == 143
    assert (stopped.value.signal, stopped.value.iteration) == ("SIGTERM", stops_at)
    meta = hk.latest_checkpoint(tmp_path)
    assert meta["iteration"] == stops_at and meta["signal"] == "SIGTERM" and meta["micro_batches"] == k
    assert (meta["epoch"], meta["step"], meta["steps_per_epoch"]) == ((stops_at - 1) // STEPS,
                                                                      (stops_at - 1) % STEPS + 1, STEPS)
    assert os.path.basename(meta["path"]) == (f"epoch-{meta['epoch']:04d}" if stops_at % STEPS == 0
                                              else f"iter-{stops_at:08d}")

    resumed = _model(horovod, k)
    meta = hk.restore_latest(tmp_path, resumed)
    parts = hk.resume_plan(meta, STEPS, EPOCHS, micro_batches=k)
    assert parts[0].skip_batches == stops_at * k
    for part in parts:
        _fit(resumed, part, [hk.TrainingCheckpoint(tmp_path, period=5)])
    state, iteration = uninterrupted[k]
    assert hk.iteration_count(resumed.optimizer) == iteration == STEPS * EPOCHS
    for a, b in zip(state, _state(resumed)):
        np.testing.assert_array_equal(a, b)


def test_periodic_checkpoints_land_on_the_period_and_epoch_ends_keep_their_names(tmp_path, horovod):
    model = _model(horovod, 1)
    model.fit(_data(0), steps_per_epoch=STEPS, epochs=2, verbose=0,
              callbacks=[hk.TrainingCheckpoint(tmp_path, keep=10, period=4, stop_signals=())])
    names = sorted(os.listdir(tmp_path))
    # 4 and 8 inside epochs; 12 is the end of epoch 1, saved once, as an epoch-end checkpoint.
    assert names == ["epoch-0000", "epoch-0001", "iter-00000004", "iter-00000008", "latest"]
    meta = hk.latest_checkpoint(tmp_path)
    assert (meta["epoch"], meta["step"], meta["iteration"], meta["signal"]) == (1, STEPS, 12, None)
    import json

    with open(tmp_path / "iter-00000008" / "meta.json") as f:
        # The LRs of the next update (8: the step at 8 to 0.02) and of the last one (7: 0.2), as restore_latest
        # compares them; the world size that wrote it.
        assert json.load(f) | {"time": 0} == {"epoch": 1, "step": 2, "steps_per_epoch": STEPS, "iteration": 8,
                                              "micro_batches": 1, "signal": None, "time": 0, "world_size": 1,
                                              "lr": float(np.float32(0.02)), "last_lr": float(np.float32(0.2))}


def test_keep_counts_every_kind_of_checkpoint(tmp_path, horovod):
    model = _model(horovod, 1)
    model.fit(_data(0), steps_per_epoch=STEPS, epochs=2, verbose=0,
              callbacks=[hk.TrainingCheckpoint(tmp_path, keep=2, period=5)])
    assert sorted(os.listdir(tmp_path)) == ["epoch-0001", "iter-00000010", "latest"]


def test_a_fit_that_skips_the_rest_of_a_restored_epoch_is_stopped_before_its_first_step(tmp_path, horovod):
    model = _model(horovod, 1)
    with pytest.raises(hk.TrainingInterrupted):
        model.fit(_data(0), steps_per_epoch=STEPS, epochs=EPOCHS, verbose=0,
                  callbacks=[_SignalAt(9), hk.TrainingCheckpoint(tmp_path, agree_every=1e-9)])
    before = sorted(os.listdir(tmp_path))
    resumed = _model(horovod, 1)
    meta = hk.restore_latest(tmp_path, resumed)
    assert (meta["epoch"], meta["step"], meta["iteration"]) == (1, 3, 9)
    fix = r"Fit the rest of epoch 1 first \(initial_epoch=1, epochs=2, steps_per_epoch=3, the data skipped by 9"
    # The pre-resume habit (initial_epoch = epoch + 1) and a whole epoch from the saved one: both refused, by the
    # checkpoint callback and by horovod_callbacks' DistributedCheck alike, with nothing written.
    for initial_epoch, callbacks in ((2, [hk.TrainingCheckpoint(tmp_path)]), (1, [hk.TrainingCheckpoint(tmp_path)]),
                                     (2, hk.horovod_callbacks())):
        with pytest.raises(ValueError, match=fix):
            resumed.fit(_data(0), steps_per_epoch=STEPS, epochs=EPOCHS, initial_epoch=initial_epoch, verbose=0,
                        callbacks=callbacks)
        assert hk.iteration_count(resumed.optimizer) == 9
    assert sorted(os.listdir(tmp_path)) == before


def test_resume_plan():
    assert hk.resume_plan(None, 10, 3) == [hk.FitPart(0, 3, 10, 0)]
    assert hk.resume_plan(None, 10, 3, micro_batches=2) == [hk.FitPart(0, 3, 20, 0)]
    epoch_end = {"epoch": 0, "step": 10, "steps_per_epoch": 10, "iteration": 10}
    assert hk.resume_plan(epoch_end, 10, 3) == [hk.FitPart(1, 3, 10, 10)]
    assert hk.resume_plan({"epoch": 0, "iteration": 10}, 10, 3) == [hk.FitPart(1, 3, 10, 10)]  # before steps
    inside = {"epoch": 1, "step": 4, "steps_per_epoch": 10, "iteration": 14, "micro_batches": 2}
    assert hk.resume_plan(inside, 10, 3, micro_batches=2) == [hk.FitPart(1, 2, 12, 28), hk.FitPart(2, 3, 20, 40)]
    assert hk.resume_plan(inside, 10, 2, micro_batches=2) == [hk.FitPart(1, 2, 12, 28)]
    assert hk.resume_plan({"epoch": 2, "step": 10, "steps_per_epoch": 10, "iteration": 30}, 10, 3) == []
    with pytest.raises(ValueError, match="saved at step 4 of an epoch of 10 iterations of 2 micro-batches; this "
                                         "run has 11 of 2"):
        hk.resume_plan(inside, 11, 3, micro_batches=2)
    with pytest.raises(ValueError, match="this run has 10 of 1"):
        hk.resume_plan(inside, 10, 3)
    with pytest.raises(ValueError, match="steps_per_epoch must be >= 1, got 0"):
        hk.resume_plan(None, 0, 3)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"stop_signals": "SIGTERM"}, TypeError, r"stop_signals must be a list or tuple of signals.*got 'SIGTERM'"),
    ({"stop_signals": ("SIGKILL",)}, ValueError, "SIGKILL cannot be caught by any process"),
    ({"stop_signals": ("SIGNOPE",)}, ValueError, "'SIGNOPE' is not a signal name or number here"),
    ({"stop_signals": (True,)}, ValueError, "True is not a signal name or number here"),
    ({"period": 0}, ValueError, "period must be >= 1, got 0"),
    ({"period": 2.5}, TypeError, r"period must be an int, got 2.5"),
    ({"agree_every": 0}, ValueError, "agree_every must be a number of seconds > 0, got 0"),
    ({"keep": 0}, ValueError, "keep must be an int >= 1, got 0"),
    ({"root_rank": -1}, ValueError, "root_rank must be an int >= 0, got -1"),
])
def test_bad_arguments_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        hk.TrainingCheckpoint("unused", **kwargs)


def test_signal_names_and_numbers_are_accepted_once_each():
    checkpoint = hk.TrainingCheckpoint("unused", stop_signals=("TERM", "SIGUSR1", int(signal.SIGTERM), "sigusr2"))
    assert checkpoint.stop_signals == (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
    assert hk.EpochCheckpoint("unused").stop_signals == ()


def test_training_interrupted_is_a_system_exit_with_the_shell_status():
    stop = hk.TrainingInterrupted("SIGUSR1", 12, "/x/iter-00000012", 128 + signal.SIGUSR1)
    assert isinstance(stop, SystemExit) and not isinstance(stop, Exception)
    again = pickle.loads(pickle.dumps(stop))
    assert (again.signal, again.iteration, again.path, again.code) == ("SIGUSR1", 12, "/x/iter-00000012", 138)


def test_a_second_ctrl_c_raises_keyboard_interrupt():
    from hvd_sched.keras import _stop

    requests = _stop.StopRequests(_stop.signal_numbers(("SIGINT",)))
    previous = signal.getsignal(signal.SIGINT)
    requests.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert requests.received == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is previous
    finally:
        requests.uninstall()
    assert signal.getsignal(signal.SIGINT) is previous


def test_horovod_callbacks_puts_the_checkpoint_after_the_nan_stop(horovod):
    checkpoint = hk.TrainingCheckpoint("runs/ckpt")
    callbacks = hk.horovod_callbacks(checkpoint=checkpoint)
    assert callbacks[-1] is checkpoint and isinstance(callbacks[-2], hk.StopOnNonFinite)
    assert callbacks[-2].checkpoint_dir == "runs/ckpt"  # named in the NaN stop's message
    with pytest.raises(TypeError, match="checkpoint must be a hvd_sched.keras.TrainingCheckpoint, got str"):
        hk.horovod_callbacks(checkpoint="runs/ckpt")


def test_steps_per_execution_counts_the_same_iterations(tmp_path, horovod):
    """Keras runs 3 steps per call and calls the batch hooks once per call: the checkpoints name the iteration the
    optimizer is at, the stop lands at the end of the call the signal came in, and the resume is exact."""
    def model_():
        model = _model(horovod, 1)
        model.compile(model.optimizer, "mse", steps_per_execution=3)
        return model

    reference = model_()
    _fit(reference, hk.FitPart(0, EPOCHS, STEPS, 0), [])
    model = model_()
    with pytest.raises(hk.TrainingInterrupted) as stopped:
        _fit(model, hk.FitPart(0, EPOCHS, STEPS, 0), [_SignalAt(3), hk.TrainingCheckpoint(tmp_path, keep=10,
                                                                                           period=5,
                                                                                           agree_every=1e-9)])
    assert stopped.value.iteration == hk.iteration_count(model.optimizer) == hk.latest_checkpoint(tmp_path)["iteration"]
    resumed = model_()
    meta = hk.restore_latest(tmp_path, resumed)
    for part in hk.resume_plan(meta, STEPS, EPOCHS):
        _fit(resumed, part, [hk.TrainingCheckpoint(tmp_path, period=5)])
    assert hk.iteration_count(resumed.optimizer) == hk.iteration_count(reference.optimizer)
    for a, b in zip(_state(reference), _state(resumed)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(hk.KERAS_MAJOR != 3, reason="Keras 2 runs the epoch's last call short (4 + 2 batches)")
def test_keras3_calls_that_overrun_the_epoch_are_refused(tmp_path, horovod):
    model = _model(horovod, 1)
    model.compile(model.optimizer, "mse", steps_per_execution=4)
    with pytest.raises(ValueError, match=r"an epoch of 6 batches runs 8, .* \(steps_per_epoch=4\) or compile with "
                                         r"steps_per_execution=1"):
        _fit(model, hk.FitPart(0, 1, STEPS, 0), [hk.TrainingCheckpoint(tmp_path)])
    assert not os.path.exists(tmp_path / "latest")


class _SignalInValidation(tf.keras.callbacks.Callback):
    def on_test_begin(self, logs=None):
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_signal_during_validation_stops_at_the_epoch_end_with_its_checkpoint(tmp_path, horovod):
    model = _model(horovod, 1)
    with pytest.raises(hk.TrainingInterrupted) as stopped:
        model.fit(_data(0), steps_per_epoch=STEPS, epochs=EPOCHS, validation_data=(X[:16], Y[:16]), verbose=0,
                  callbacks=[_SignalInValidation(), hk.TrainingCheckpoint(tmp_path)])
    assert (stopped.value.iteration, stopped.value.path) == (STEPS, str(tmp_path / "epoch-0000"))
    meta = hk.latest_checkpoint(tmp_path)
    assert (meta["epoch"], meta["step"], meta["iteration"], meta["signal"]) == (0, STEPS, STEPS, "SIGTERM")
    assert sorted(os.listdir(tmp_path)) == ["epoch-0000", "latest"]


def test_a_signal_between_two_fits_is_kept_for_the_next_one(tmp_path, horovod):
    model = _model(horovod, 1)
    checkpoint = hk.TrainingCheckpoint(tmp_path, agree_every=1e-9)
    handler = signal.getsignal(signal.SIGTERM)
    with checkpoint.handling_signals():
        _fit(model, hk.FitPart(0, 1, STEPS, 0), [checkpoint])
        assert signal.getsignal(signal.SIGTERM) is not handler  # still handled between the fits
        os.kill(os.getpid(), signal.SIGTERM)  # recorded, not fatal
        with pytest.raises(hk.TrainingInterrupted) as stopped:
            _fit(model, hk.FitPart(1, EPOCHS, STEPS, STEPS), [checkpoint])
    assert stopped.value.iteration == STEPS + 1  # the first agreement of the next fit
    assert signal.getsignal(signal.SIGTERM) is handler
