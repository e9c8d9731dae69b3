"""The ``model.fit`` timing harness of ``bench/overhead.py``, ``conv_net.py`` and ``accumulation.py``, and Horovod's
timeline.

- ``timer_callbacks``: a (Stop, Start) pair of callbacks that time the steps of each epoch, not Keras' once-per-epoch
  work;
- ``time_rounds``: every variant's ``fit`` in shuffled interleaved rounds (the same order on every rank, a barrier
  before each ``fit``), wall and CPU seconds per step of each round;
- ``record_timelines``: one untimed ``fit`` of each variant in its own Horovod timeline;
- ``micro_batch_counter``: the optimizer's counter of steps (micro-batches under gradient accumulation);
- ``current_lr``: an optimizer's learning rate now, as a float (Keras 2 and Keras 3);
- ``load_timeline`` / ``count_collectives``: Horovod's timeline (``HOROVOD_TIMELINE``) read back, collectives and
  allreduce bytes per step.

Imports TensorFlow and Horovod only inside the functions (the driver side of a script never needs them).
"""

import json
import math
import pathlib
import time

__all__ = ["timer_callbacks", "time_rounds", "record_timelines", "micro_batch_counter", "current_lr", "load_timeline",
           "count_collectives"]


def timer_callbacks(keras):
    """(stop, start): put ``stop`` first and ``start`` last in the callback list.

    Between ``start.on_epoch_begin`` and ``stop.on_epoch_end`` only the epoch's steps run, with every variant's
    batch hooks; Keras' and the callbacks' once-per-epoch work is outside. ``start.steps_seconds`` sums the epochs
    of one ``fit`` (wall clock), ``start.steps_cpu_seconds`` the same in CPU time of the process (every thread:
    not inflated while another job holds the core); ``start.fit_seconds`` is the whole ``fit``, for reference.
    """

    class Start(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.steps_seconds = 0.0
            self.steps_cpu_seconds = 0.0
            self.fit_start = time.perf_counter()

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch_start = time.perf_counter()
            self.epoch_cpu_start = time.process_time()

        def on_train_end(self, logs=None):
            self.fit_seconds = time.perf_counter() - self.fit_start

    class Stop(keras.callbacks.Callback):
        def __init__(self, start):
            super().__init__()
            self.start = start

        def on_epoch_end(self, epoch, logs=None):
            self.start.steps_seconds += time.perf_counter() - self.start.epoch_start
            self.start.steps_cpu_seconds += time.process_time() - self.start.epoch_cpu_start

    start = Start()
    return Stop(start), start


def time_rounds(built, dataset, *, keras, epochs, steps_per_epoch, rounds, barrier=None, seed=1234):
    """Seconds per step of every variant in every round: ``{"wall": ..., "cpu": ..., "fit": ...}``, each a
    ``{name: [per round]}`` dict (the epochs' steps in wall and process CPU time, the whole ``fit`` in wall time).

    Args:
        built: ``{name: (compiled model, its callbacks)}``; each round resets the optimizer's step counter
            (``micro_batch_counter``) to 0, so every round runs the same part of the schedule (its corrections
            included).
        dataset: a repeated ``tf.data.Dataset``, or ``{name: dataset}`` (variants with different batches).
        keras: the Keras module (``tf.keras``).
        epochs, steps_per_epoch: one ``fit`` per variant and round; ``steps_per_epoch`` an int or ``{name: int}``
            (Keras' steps: micro-batches under gradient accumulation).
        rounds: timed rounds, after one untimed round that traces and compiles every variant.
        barrier: a function called before each ``fit`` (e.g. a Horovod allreduce so that the ranks start
            together), or None.
        seed: the shuffling seed (the same on every rank, so the ranks run the same variant).
    """
    import numpy as np

    stop, start = timer_callbacks(keras)

    def run(name):
        model, callbacks = built[name]
        micro_batch_counter(model.optimizer).assign(0)
        steps_per_name = _of_variant(steps_per_epoch, name)
        steps = epochs * steps_per_name
        model.fit(_of_variant(dataset, name), initial_epoch=0, epochs=epochs, steps_per_epoch=steps_per_name,
                  verbose=0, callbacks=[stop, *callbacks, start])
        return {"wall": start.steps_seconds / steps, "cpu": start.steps_cpu_seconds / steps,
                "fit": start.fit_seconds / steps}

    names = list(built)
    for name in names:
        if barrier is not None:
            barrier()
        run(name)
    times = {key: {name: [] for name in names} for key in ("wall", "cpu", "fit")}
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        for name in map(str, rng.permutation(names)):
            if barrier is not None:
                barrier()
            for key, value in run(name).items():
                times[key][name].append(value)
    return times


def _of_variant(value, name):
    """``value[name]`` where ``value`` is a ``{name: value}`` dict, else ``value`` (the same for every variant)."""
    return value[name] if isinstance(value, dict) else value


def record_timelines(built, dataset, directory, *, keras, epochs, steps_per_epoch, barrier):
    """One untimed ``fit`` of each variant (``time_rounds`` with no timed round), each recorded in its own Horovod
    timeline ``<directory>/<name>.json`` (``hvd.start_timeline``: the job needs ``HOROVOD_TIMELINE=DYNAMIC``).

    ``barrier`` (a Horovod collective, the same on every rank) runs before each recording starts: it is not in it.
    """
    import horovod.tensorflow as hvd

    for name in built:
        barrier()
        hvd.start_timeline(str(pathlib.Path(directory) / f"{name}.json"))
        time.sleep(0.5)  # every rank records before the first gradient is negotiated
        time_rounds({name: built[name]}, dataset, keras=keras, epochs=epochs, steps_per_epoch=steps_per_epoch,
                    rounds=0)
        hvd.stop_timeline()  # rank 0 (which writes) returned from fit: its collectives are complete


def micro_batch_counter(optimizer):
    """The variable counting the optimizer's steps: ``optimizer.iterations``, except under Keras 3's gradient
    accumulation, where ``iterations`` is ``_iterations // gradient_accumulation_steps`` (a tensor) and the
    variable is ``_iterations`` (micro-batches). Keras 2 with Horovod's accumulation counts micro-batches in
    ``iterations`` itself."""
    iterations = optimizer.iterations
    return iterations if hasattr(iterations, "assign") else optimizer._iterations


def current_lr(optimizer):
    """The optimizer's learning rate at its current ``iterations`` (a schedule is evaluated), as a float."""
    value = optimizer.learning_rate
    if callable(value) and not hasattr(value, "numpy"):
        value = value(optimizer.iterations)
    return float(value.numpy() if hasattr(value, "numpy") else value)


def load_timeline(path):
    """Horovod's timeline is a Chrome-trace JSON list, not always closed when the job ends."""
    text = pathlib.Path(path).read_text().strip().rstrip(",")
    if not text.endswith("]"):
        text += "]"
    return json.loads(text)


_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8, "uint8": 1,
                "int8": 1, "bool": 1}


def count_collectives(events, steps, ignore=None):
    """Per-step count of each top-level Horovod activity and the bytes the allreduces moved.

    Each tensor is a trace "process" (pid) named by a metadata event; a collective is a top-level B/E pair
    (NEGOTIATE_ALLREDUCE, then ALLREDUCE with nested fusion-buffer activities), and the E that closes ALLREDUCE
    carries dtype and shape. Tensors whose name contains ``ignore`` (a benchmark's own barrier) are left out.
    """
    stacks, counts, allreduce_bytes, shapes, ignored = {}, {}, 0, {}, set()
    for event in events:
        phase, pid = event.get("ph"), event.get("pid")
        if phase == "M" and event.get("name") == "process_name" and ignore \
                and ignore in str((event.get("args") or {}).get("name", "")):
            ignored.add(pid)
        if pid in ignored:
            continue
        if phase == "B":
            stack = stacks.setdefault(pid, [])
            if not stack:
                counts[event["name"]] = counts.get(event["name"], 0) + 1
            stack.append(event["name"])
        elif phase == "E" and stacks.get(pid):
            name = stacks[pid].pop()
            args = event.get("args") or {}
            if not stacks[pid] and name == "ALLREDUCE" and "shape" in args:
                shape = json.loads(args["shape"])
                nbytes = math.prod(shape) * _DTYPE_BYTES[args["dtype"]]
                allreduce_bytes += nbytes
                key = f"{args['dtype']}{shape}"
                shapes[key] = shapes.get(key, 0) + 1
    return {
        "steps": steps,
        "ops_per_step": {name: count / steps for name, count in sorted(counts.items())},
        "allreduce_bytes_per_step": allreduce_bytes / steps,
        "allreduce_tensors_per_step": {key: count / steps for key, count in sorted(shapes.items())},
    }
