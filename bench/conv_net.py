"""Benchmark: the per-step cost of ``ScheduledOptimizer`` on a realistic step (a small conv net; not a test).

``bench/overhead.py``'s MLP step takes about a millisecond, so any fixed cost looks large there. Here the step
takes tens of milliseconds on this CPU with one thread, closer to a GPU step: a conv net on 32x32x3 inputs,
batch 64, generated data (``CHANNELS``: three blocks of Conv2D 3x3 (no bias) + BatchNormalization + ReLU,
max-pooling between them, global average pooling, Dense 10; 24,346 weights), trained with ``model.fit``:

- ``baseline``: ``hvd_sched.keras.DistributedOptimizer(SGD(0.05, momentum=0.9))``, constant LR;
- ``hvd_sched_optimizer``: ``hvd_sched.keras.DistributedOptimizer(hvd_sched.keras.ScheduledOptimizer(
  SGD(momentum=0.9), schedule, momentum_correction="threshold"))``, the schedule being linear warmup then two
  steps (``SOLVER``), so each round of ``EPOCHS`` x ``steps_per_epoch`` steps crosses both momentum corrections.

At 1 rank (plain ``python``, ``hvd.init()`` with size 1) and at 2 ranks (``horovodrun -np 2 --gloo``; each rank
a batch of 64). The harness is ``bench/overhead.py``'s (``_fit.time_rounds``): one untimed round traces both
variants, then R rounds in a shuffled order, a barrier before each ``fit``, the steps of each epoch timed
without Keras' once-per-epoch work; one TensorFlow thread per process. Ratio of medians with a 95% bootstrap
interval over rounds and the extra microseconds per step, in wall time (``ranks1``, ``ranks2``) and in process CPU
time (``cpu``); target ``TARGET`` (1.02x).

Usage::

    python bench/conv_net.py            # 20 rounds x 10 steps, 1 and 2 ranks
                                        # -> docs/bench/<date>_conv_net_<row>.json and .md
    python bench/conv_net.py --quick    # 2 rounds x 6 steps; writes nothing unless --out
    python bench/conv_net.py --ranks 1  # 1 rank only

The last line printed is one JSON object ``{"ranks1": {...}, "ranks2": {...}}`` of ratios of medians.
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

import _common
import _fit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

VARIANTS = ("baseline", "hvd_sched_optimizer")
REFERENCE = {name: "baseline" for name in VARIANTS}
TARGET = 1.02
BASE_LR = 0.05
MOMENTUM = 0.9
BATCH = 64
CHANNELS = (16, 32, 64)
EPOCHS = 2
SETTINGS = {"full": {"rounds": 20, "steps_per_epoch": 5}, "quick": {"rounds": 2, "steps_per_epoch": 3}}


def solver(steps):
    """Warmup over the first fifth of a round from 1/4 of the LR, then /10 at half and /100 at 4/5 of it."""
    return {"BASE_LR": BASE_LR, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1,
            "STEPS": [0, steps // 2, steps * 4 // 5], "MAX_ITER": steps, "WARM_UP_ITERS": max(steps // 5, 1),
            "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "linear", "SCALE_MOMENTUM": True,
            "SCALE_MOMENTUM_THRESHOLD": 1.1}


def _data(tf, batch=BATCH):
    """``BATCH * 8`` generated images and labels (the same on every rank), in batches of ``batch``, repeated."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * 8, 32, 32, 3)).astype(np.float32)
    y = rng.integers(0, 10, size=BATCH * 8).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).repeat()


def _model(keras):
    keras.utils.set_random_seed(0)  # the same weights on every rank (no broadcast needed)
    layers = [keras.Input((32, 32, 3))]
    for index, channels in enumerate(CHANNELS):
        layers += [keras.layers.Conv2D(channels, 3, padding="same", use_bias=False),
                   keras.layers.BatchNormalization(), keras.layers.ReLU()]
        if index < len(CHANNELS) - 1:
            layers.append(keras.layers.MaxPooling2D())
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]
    return keras.Sequential(layers)


def _build(name, keras, schedule, model=None):
    """(``model``, default ``_model(keras)``, compiled with variant `name`'s optimizer, no callbacks)."""
    import hvd_sched.keras

    model = _model(keras) if model is None else model
    if name == "baseline":
        optimizer = keras.optimizers.SGD(BASE_LR, momentum=MOMENTUM)
    elif name == "hvd_sched_optimizer":
        optimizer = hvd_sched.keras.ScheduledOptimizer(keras.optimizers.SGD(momentum=MOMENTUM), schedule,
                                                       momentum_correction="threshold")
    else:
        raise ValueError(f"unknown variant {name!r}; expected one of {VARIANTS}")
    optimizer = hvd_sched.keras.DistributedOptimizer(optimizer)
    if hvd_sched.keras.KERAS_MAJOR == 2:
        optimizer.jit_compile = False  # explicit: a GPU machine turns it on by itself
    model.compile(optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, []


def worker(args):
    """Runs on every rank; rank 0 writes the timings."""
    import numpy as np

    _common.limit_threads(1)
    import hvd_sched.keras  # noqa: F401  (before Horovod's Keras layer)
    import horovod.tensorflow as hvd
    import tensorflow as tf

    import hvd_sched

    keras = tf.keras
    hvd.init()
    steps = EPOCHS * args.steps_per_epoch
    schedule = hvd_sched.from_detectron(solver(steps))
    built = {name: _build(name, keras, schedule) for name in VARIANTS}
    barrier_tensor = tf.constant(0.0)
    times = _fit.time_rounds(
        built, _data(tf), keras=keras, epochs=EPOCHS, steps_per_epoch=args.steps_per_epoch, rounds=args.rounds,
        barrier=lambda: hvd.allreduce(barrier_tensor, name="bench_barrier"))
    if hvd.rank() == 0:
        _common.write_json(args.result, {
            "size": hvd.size(), "seconds_per_step": times["wall"], "cpu_seconds_per_step": times["cpu"],
            "fit_seconds_per_step": times["fit"],
            "final_lr": {name: _fit.current_lr(built[name][0].optimizer) for name in VARIANTS},
            "weights": int(sum(np.prod(tuple(v.shape)) for v in built["baseline"][0].trainable_variables)),
            "schedule": schedule.get_config(), "momentum_corrections": schedule.momentum_corrections(steps)})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds x 6 steps")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per variant")
    parser.add_argument("--steps-per-epoch", type=int, default=None, help=f"a round is {EPOCHS} epochs")
    parser.add_argument("--ranks", type=int, nargs="+", choices=(1, 2), default=(1, 2), help="1, 2 or both")
    _common.add_output_arguments(parser, "conv_net")
    args = parser.parse_args(argv)
    setting = dict(SETTINGS["quick" if args.quick else "full"])
    for name in ("rounds", "steps_per_epoch"):
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
            setting[name] = value
    if args.worker:
        worker(args)
        return 0
    script = pathlib.Path(__file__).resolve()
    worker_args = ["--worker", "--rounds", setting["rounds"], "--steps-per-epoch", setting["steps_per_epoch"]]
    loads, durations, raws = {"start": _common.loadavg()}, {}, {}
    machine = _common.machine()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hvd_sched_conv_net_") as tmp:
        for ranks in sorted(set(args.ranks)):
            result = pathlib.Path(tmp) / f"ranks{ranks}.json"
            cmd = [*worker_args, "--result", result]
            cmd = ([sys.executable, str(script), *map(str, cmd)] if ranks == 1
                   else _common.horovodrun_cmd(ranks, script, cmd))
            durations[f"ranks{ranks}_s"], _ = _common.run_checked(cmd, _common.worker_env(threads=1), args.timeout,
                                                                  f"the {ranks}-rank run")
            loads[f"after_ranks{ranks}"] = _common.loadavg()
            raws[f"ranks{ranks}"] = json.loads(result.read_text())
    durations["total_s"] = time.perf_counter() - started
    def table(raw, clock):
        return {name: _common.compare(raw[clock][name], raw[clock][REFERENCE[name]], REFERENCE[name],
                                      TARGET if name != "baseline" else None) for name in VARIANTS}

    results = {key: table(raw, "seconds_per_step") for key, raw in raws.items()}
    cpu_results = {key: table(raw, "cpu_seconds_per_step") for key, raw in raws.items()}
    row = machine.get("stack_row", "unknown")
    command = _common.command_line(row, "conv_net.py", args.quick)
    steps = EPOCHS * setting["steps_per_epoch"]
    report = {"machine": machine, "command": command,
              "settings": {**setting, "epochs_per_round": EPOCHS, "steps_per_round": steps, "batch": BATCH,
                           "model": f"conv net {CHANNELS} (Conv2D 3x3 + BN + ReLU blocks), GAP, Dense 10",
                           "input": [32, 32, 3], "threads_per_process": 1, "solver": solver(steps),
                           "target": TARGET},
              "durations_s": {key: round(value, 1) for key, value in durations.items()}, "loadavg": loads,
              **results, "cpu": cpu_results, **{f"raw_{key}": raw for key, raw in raws.items()}}
    lines = [f"`{command}` ({row}), {machine['date']}, {durations['total_s']:.0f} s, load averages {loads}", ""]
    for key, raw in raws.items():
        for clock, tables in (("wall time", results), ("process CPU time", cpu_results)):
            lines += _common.comparison_table(f"{raw['size']} rank(s), {clock}: {setting['rounds']} rounds x {steps} "
                                              f"steps, {raw['weights']} weights", tables[key])
    print("\n".join(lines))
    _common.write_report(report, lines, f"conv_net_{row}", args)
    print(json.dumps({key: {name: r["ratio_median"] for name, r in table.items()} for key, table in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
