"""Benchmark: the per-step cost of LR scheduling in ``model.fit``, at 1 and 2 Horovod ranks (not a test).

The same tiny model (MLP 32-64-2, batch 32, data in memory) trains under five variants, all wrapped in
``hvd.DistributedOptimizer(SGD(momentum=0.9))``:

- ``baseline``: constant LR;
- ``horovod_callbacks``: Horovod's ``LearningRateWarmupCallback`` + ``LearningRateScheduleCallback`` (one per
  phase, with constant multiplier *functions*: a float multiplier means exponential decay in Horovod) and
  ``momentum_correction=False``, because True crashes on TF 2.15's SGD (the script checks that and records the
  message);
- ``keras_schedule``: Keras' in-graph ``PiecewiseConstantDecay`` at the same step boundaries (it has no warmup);
- ``hvd_sched_optimizer``: ``hvd_sched.keras.ScheduledOptimizer`` with linear warmup, two steps and momentum
  correction (``'threshold'``);
- ``hvd_sched_callback``: ``hvd_sched.keras.ScheduleCallback`` with the same schedule and correction.

Schedule shape (b)-(e), per round of ``EPOCHS`` epochs of ``steps_per_epoch`` steps: linear warmup over epoch 0
from ``lr / size`` (Horovod's gradual warmup; flat at 1 rank), ``lr`` for epochs 1-2, ``lr / 10`` from epoch 3 and
``lr / 100`` from epoch 4. Every round resets ``optimizer.iterations`` and starts at epoch 0, so each round runs
the whole schedule, corrections included. Each variant is compiled and traced once (one untimed round); then
for R rounds the variants run in a shuffled order (the same on every rank, a barrier before each ``fit``). A
round's time is the sum over its epochs of the time from the start of the first step to the end of the last
(timer callbacks first and last in the list; every variant's batch hooks are inside, Keras' once-per-epoch work
is not), divided by the steps. Short rounds, many of them: the machine is shared, and a burst of load from
elsewhere then hits one round of every variant rather than one variant. No
``BroadcastGlobalVariablesCallback``: every rank builds the same weights from the same seed, and that callback
would switch on Keras' per-batch hooks for every variant. Each process uses one TensorFlow thread.

Two more variants compile with ``steps_per_execution=16`` (16 steps per call of the train function, no Python
in between): ``baseline_spe16`` and ``hvd_sched_optimizer_spe16``, timed in the same interleaved rounds; their
ratios are against ``baseline_spe16``. Horovod's LR callbacks and ``ScheduleCallback`` set the LR from Python in
per-batch hooks, which Keras calls once per execution, so they cannot run there: their rows are marked n/a with
the reason (``NOT_APPLICABLE``).

Every ratio comes with a 95% percentile bootstrap interval over rounds (10,000 resamples of the round indices,
the same indices for the variant and its reference, since they ran in the same round). The target (``TARGET``:
``hvd_sched_optimizer`` within 1.02x of constant-LR SGD, at both steps_per_execution) is "confirmed" when the
interval of the ratio of medians lies at or below it, "refuted" when it lies entirely above it, else "undecided".

A second check, at 2 ranks: one short run each of ``baseline`` and ``hvd_sched_optimizer`` with
``HOROVOD_TIMELINE`` set; the allreduce operations and bytes per step in the two timelines must be equal.

Usage::

    python bench/overhead.py            # 40 rounds x 100 steps per variant at 1 and 2 ranks -> docs/overhead.json
                                        # and the raw per-round figures -> docs/bench/<date>_overhead.json
    python bench/overhead.py --quick    # 3 rounds x 40 steps, about a minute; writes nothing unless --out/--raw-dir

Reported per variant: median and min seconds per step over the rounds, their ratios to the reference's median
and min, and the median over rounds of (variant / reference in the same round), each with its interval. The
last line printed is one JSON object ``{"ranks1": {...}, "ranks2": {...}}`` mapping each measured variant to its
ratio of median step time against its reference in the same run.
"""

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

import _common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before _common.machine() imports TensorFlow
import hvd_sched._compat  # noqa: F401,E402  (after sys.path and the log level are set; before Horovod)

STEPS_PER_EXECUTION = 16
_SPE = f"_spe{STEPS_PER_EXECUTION}"
VARIANTS = ("baseline", "horovod_callbacks", "keras_schedule", "hvd_sched_optimizer", "hvd_sched_callback",
            "baseline" + _SPE, "hvd_sched_optimizer" + _SPE)
#: Variants that cannot run at ``model.compile(steps_per_execution=16)``, and why (rows marked n/a).
NOT_APPLICABLE = {
    "horovod_callbacks" + _SPE: "Horovod's LR callbacks set the LR from Python in on_batch_begin/on_batch_end; at "
                                "steps_per_execution > 1 Keras calls those hooks once per 16 steps, so the LR "
                                "would change every 16 steps, not per step",
    "hvd_sched_callback" + _SPE: "ScheduleCallback sets the LR and rescales the momentum from Python before each "
                                 "batch; at steps_per_execution > 1 it would run once per 16 steps",
}
#: The reference each variant's ratios are taken against: constant-LR SGD at the same steps_per_execution.
REFERENCE = {name: ("baseline" + _SPE if name.endswith(_SPE) else "baseline") for name in VARIANTS}
TARGET = {"hvd_sched_optimizer": 1.02, "hvd_sched_optimizer" + _SPE: 1.02}  # ratio (median) to REFERENCE
BOOTSTRAP_RESAMPLES = 10000
TIMELINE_VARIANTS = ("baseline", "hvd_sched_optimizer")

BASE_LR = 0.05
MOMENTUM = 0.9
BATCH = 32
EPOCHS = 5  # per round: warmup (epoch 0), lr (1-2), lr/10 (3), lr/100 (4)
WARMUP_EPOCHS = 1
DECAY_EPOCHS = (3, 4)
GAMMA = 0.1
SETTINGS = {"full": {"rounds": 40, "steps_per_epoch": 20}, "quick": {"rounds": 3, "steps_per_epoch": 8}}
TIMELINE_STEPS_PER_EPOCH = 4  # a timeline run: one round of EPOCHS * 4 steps


# ---------------------------------------------------------------------------------------------- worker side


def _solver():
    return {"BASE_LR": BASE_LR, "LR_POLICY": "steps_with_decay", "GAMMA": GAMMA,
            "STEPS_EPOCHS": [0, *DECAY_EPOCHS], "MAX_EPOCHS": EPOCHS, "WARM_UP_EPOCHS": WARMUP_EPOCHS,
            "WARM_UP_FACTOR": "horovod", "WARM_UP_METHOD": "linear", "SCALE_MOMENTUM": True,
            "SCALE_MOMENTUM_THRESHOLD": 1.1}


def _data(tf):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * 64, 32)).astype(np.float32)
    y = (x @ rng.normal(size=32) > 0).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True).repeat()


def _model(tf):
    tf.keras.utils.set_random_seed(0)  # the same weights on every rank (no broadcast needed)
    return tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="relu"),
                                tf.keras.layers.Dense(2)])


def _horovod_lr_callbacks(hvd, steps_per_epoch):
    # Horovod reads a float multiplier as exponential decay (multiplier ** (epoch - start_epoch)); a constant
    # function gives the step schedule.
    first, second = DECAY_EPOCHS
    common = {"initial_lr": BASE_LR, "momentum_correction": False, "steps_per_epoch": steps_per_epoch}
    return [
        hvd.callbacks.LearningRateWarmupCallback(warmup_epochs=WARMUP_EPOCHS, **common),
        hvd.callbacks.LearningRateScheduleCallback(multiplier=lambda epoch: 1.0, start_epoch=WARMUP_EPOCHS,
                                                   end_epoch=first, **common),
        hvd.callbacks.LearningRateScheduleCallback(multiplier=lambda epoch: GAMMA, start_epoch=first,
                                                   end_epoch=second, **common),
        hvd.callbacks.LearningRateScheduleCallback(multiplier=lambda epoch: GAMMA ** 2, start_epoch=second,
                                                   **common),
    ]


def _build(name, tf, hvd, schedule, steps_per_epoch):
    """(model compiled for variant `name`, its scheduling callbacks)."""
    import hvd_sched.keras

    model = _model(tf)
    callbacks = []
    steps_per_execution = STEPS_PER_EXECUTION if name.endswith(_SPE) else 1
    name = name.removesuffix(_SPE)
    if name == "baseline":
        optimizer = tf.keras.optimizers.SGD(BASE_LR, momentum=MOMENTUM)
    elif name == "horovod_callbacks":
        optimizer = tf.keras.optimizers.SGD(BASE_LR, momentum=MOMENTUM)
        callbacks = _horovod_lr_callbacks(hvd, steps_per_epoch)
    elif name == "keras_schedule":
        boundaries = [epoch * steps_per_epoch for epoch in DECAY_EPOCHS]
        values = [BASE_LR, BASE_LR * GAMMA, BASE_LR * GAMMA ** 2]
        lr = tf.keras.optimizers.schedules.PiecewiseConstantDecay(boundaries, values)
        optimizer = tf.keras.optimizers.SGD(lr, momentum=MOMENTUM)
    elif name == "hvd_sched_optimizer":
        optimizer = hvd_sched.keras.ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=MOMENTUM), schedule,
                                                       momentum_correction="threshold")
    elif name == "hvd_sched_callback":
        optimizer = tf.keras.optimizers.SGD(BASE_LR, momentum=MOMENTUM)
        callbacks = [hvd_sched.keras.ScheduleCallback(schedule, momentum_correction="threshold")]
    else:
        raise ValueError(f"unknown variant {name!r}; expected one of {VARIANTS}")
    model.compile(hvd.DistributedOptimizer(optimizer), steps_per_execution=steps_per_execution,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, callbacks


def _timer_classes(tf):
    """(Start, Stop): Start goes last in the callback list and Stop first, so that between Start's
    `on_epoch_begin` and Stop's `on_epoch_end` only the epoch's steps run (with every variant's batch hooks),
    not Keras' or the callbacks' once-per-epoch work. Start also times the whole `fit` for reference."""

    class Start(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.steps_seconds = 0.0
            self.fit_start = time.perf_counter()

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch_start = time.perf_counter()

        def on_train_end(self, logs=None):
            self.fit_seconds = time.perf_counter() - self.fit_start

    class Stop(tf.keras.callbacks.Callback):
        def __init__(self, start):
            super().__init__()
            self.start = start

        def on_epoch_end(self, epoch, logs=None):
            self.start.steps_seconds += time.perf_counter() - self.start.epoch_start

    return Start, Stop


def _current_lr(tf, optimizer):
    lr = optimizer.learning_rate
    return float(tf.keras.backend.get_value(lr))


def _horovod_momentum_correction_check(tf, hvd, dataset):
    """Run Horovod's warmup callback with momentum_correction=True once; return what happened."""
    model = _model(tf)
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(BASE_LR, momentum=MOMENTUM)),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = hvd.callbacks.LearningRateWarmupCallback(initial_lr=BASE_LR, warmup_epochs=1,
                                                        momentum_correction=True, steps_per_epoch=2)
    try:
        model.fit(dataset, epochs=1, steps_per_epoch=2, verbose=0, callbacks=[callback])
    except AttributeError as error:  # the known failure: `momentum` is a Python float on the TF 2.11+ SGD
        return {"runs": False, "error": f"{type(error).__name__}: {error}"}
    return {"runs": True, "error": None}


def worker(args):
    """Runs on every rank; rank 0 writes the timings (or, for a timeline run, nothing: Horovod writes it)."""
    import numpy as np

    _common.limit_threads(1)
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    import hvd_sched

    hvd.init()
    steps_per_epoch = args.steps_per_epoch
    steps = EPOCHS * steps_per_epoch
    schedule = hvd_sched.from_detectron(_solver(), steps_per_epoch=steps_per_epoch, world_size=hvd.size())
    dataset = _data(tf)
    names = [args.variant] if args.variant else list(VARIANTS)
    built = {name: _build(name, tf, hvd, schedule, steps_per_epoch) for name in names}
    start_class, stop_class = _timer_classes(tf)
    start = start_class()
    stop = stop_class(start)

    def run(name):
        model, callbacks = built[name]
        model.optimizer.iterations.assign(0)
        model.fit(dataset, initial_epoch=0, epochs=EPOCHS, steps_per_epoch=steps_per_epoch, verbose=0,
                  callbacks=[stop, *callbacks, start])
        return start.steps_seconds / steps, start.fit_seconds / steps

    if args.variant:  # a timeline run: one round, no warm-up, no barrier (the timeline counts every op)
        run(args.variant)
        return

    barrier = tf.constant(0.0)
    for name in names:  # compile and trace each variant (the first fit traces)
        run(name)
    times = {name: [] for name in names}
    fit_times = {name: [] for name in names}
    rng = np.random.default_rng(1234)  # the same order on every rank
    for _ in range(args.rounds):
        for name in map(str, rng.permutation(names)):
            hvd.allreduce(barrier, name="bench_barrier")  # both ranks start each fit together
            step_seconds, fit_seconds = run(name)
            times[name].append(step_seconds)
            fit_times[name].append(fit_seconds)
    if hvd.rank() != 0:
        return
    result = {
        "size": hvd.size(),
        "steps_per_round": steps,
        "rounds": args.rounds,
        "seconds_per_step": times,
        "fit_seconds_per_step": fit_times,
        "final_lr": {name: _current_lr(tf, built[name][0].optimizer) for name in names},
        "schedule": schedule.get_config(),
        "momentum_corrections": schedule.momentum_corrections(steps),
    }
    if args.check_horovod_momentum_correction:
        result["horovod_momentum_correction_true"] = _horovod_momentum_correction_check(tf, hvd, dataset)
    _common.write_json(args.result, result)


# ---------------------------------------------------------------------------------------------- driver side


def _run(cmd, env, timeout, what):
    started = time.perf_counter()
    completed = subprocess.run(cmd, env=env, cwd=_common.ROOT, capture_output=True, text=True, timeout=timeout,
                               check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {completed.returncode}): {' '.join(cmd)}\n--- stdout ---\n"
                           f"{completed.stdout[-6000:]}\n--- stderr ---\n{completed.stderr[-6000:]}")
    return time.perf_counter() - started, completed.stdout


def _worker_args(setting, result, variant=None, check=False):
    args = ["--worker", "--rounds", setting["rounds"], "--steps-per-epoch", setting["steps_per_epoch"],
            "--result", result]
    if variant:
        args += ["--variant", variant]
    if check:
        args.append("--check-horovod-momentum-correction")
    return args


def _ratio_of_medians(values, base):
    return float(np.median(values) / np.median(base))


def _ratio_of_mins(values, base):
    return float(np.min(values) / np.min(base))


def _paired_median(values, base):
    return float(np.median(values / base))


_STATISTICS = {"ratio_median": _ratio_of_medians, "ratio_min": _ratio_of_mins,
               "ratio_paired_median": _paired_median}


def _summary(raw):
    """Per variant: median and min ms/step and every ratio to its REFERENCE with a 95% bootstrap interval over
    rounds (the rounds resampled jointly: a round ran every variant, so a burst of load hits them together)."""
    seconds = raw["seconds_per_step"]
    table = {}
    for name in VARIANTS:
        reference = REFERENCE[name]
        values, base = np.asarray(seconds[name]), np.asarray(seconds[reference])
        stats = _common.summarise(values)
        row = {"reference": reference, "median_ms": round(stats["median"] * 1e3, 4),
               "min_ms": round(stats["min"] * 1e3, 4)}
        for key, statistic in _STATISTICS.items():
            row[key] = round(statistic(values, base), 4)
            ci = _common.bootstrap_ci(statistic, [values, base], paired=True, resamples=BOOTSTRAP_RESAMPLES)
            row[key + "_ci95"] = [round(ci[0], 4), round(ci[1], 4)]
        if name in TARGET:
            row["target"] = TARGET[name]
            row["verdict"] = _common.verdict(row["ratio_median_ci95"], TARGET[name])
        table[name] = row
    for name, reason in NOT_APPLICABLE.items():
        table[name] = {"reference": REFERENCE.get(name, "baseline" + _SPE), "not_applicable": reason}
    return table


def _load_timeline(path):
    """Horovod's timeline is a Chrome-trace JSON list, not always closed when the job ends."""
    text = pathlib.Path(path).read_text().strip().rstrip(",")
    if not text.endswith("]"):
        text += "]"
    return json.loads(text)


_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8, "uint8": 1,
                "int8": 1, "bool": 1}


def count_collectives(events, steps):
    """Per-step count of each top-level Horovod activity and the bytes the allreduces moved.

    Each tensor is a trace "process" (pid); a collective is a top-level B/E pair (NEGOTIATE_ALLREDUCE, then
    ALLREDUCE with nested fusion-buffer activities), and the E that closes ALLREDUCE carries dtype and shape.
    """
    stacks, counts, allreduce_bytes, shapes = {}, {}, 0, {}
    for event in events:
        phase, pid = event.get("ph"), event.get("pid")
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


def _interval(row, key):
    low, high = row[key + "_ci95"]
    return f"{row[key]:.3f} [{low:.3f}, {high:.3f}]"


def _print_table(title, table):
    print(f"\n{title}")
    print("| variant | median ms/step | min ms/step | ratio (median) [95% CI] | ratio (min) [95% CI] | "
          "paired ratio (median) [95% CI] | target |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, row in table.items():
        if "not_applicable" in row:
            print(f"| {name} | n/a | n/a | n/a | n/a | n/a | {row['not_applicable']} |")
            continue
        target = f"<= {row['target']}: {row['verdict']}" if "target" in row else ""
        print(f"| {name} (/ {row['reference']}) | {row['median_ms']:.3f} | {row['min_ms']:.3f} | "
              f"{_interval(row, 'ratio_median')} | {_interval(row, 'ratio_min')} | "
              f"{_interval(row, 'ratio_paired_median')} | {target} |")


def driver(args):
    setting = dict(SETTINGS["quick" if args.quick else "full"])
    if args.rounds is not None:
        setting["rounds"] = args.rounds
    if args.steps_per_epoch is not None:
        setting["steps_per_epoch"] = args.steps_per_epoch
    script = pathlib.Path(__file__).resolve()
    env = _common.worker_env(threads=1)
    results, durations = {}, {}
    loads = {"start": round(os.getloadavg()[0], 2)}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hvd_sched_overhead_") as tmp:
        tmp = pathlib.Path(tmp)
        raw1 = tmp / "ranks1.json"
        durations["ranks1_s"], _ = _run([sys.executable, str(script), *map(str, _worker_args(
            setting, raw1, check=True))], env, args.timeout, "the 1-rank run")
        loads["after_ranks1"] = round(os.getloadavg()[0], 2)
        raw2 = tmp / "ranks2.json"
        durations["ranks2_s"], _ = _run(_common.horovodrun_cmd(2, script, _worker_args(setting, raw2)), env,
                                        args.timeout, "the 2-rank run")
        loads["after_ranks2"] = round(os.getloadavg()[0], 2)
        raws = {"ranks1": json.loads(raw1.read_text()), "ranks2": json.loads(raw2.read_text())}
        timelines = {}
        for variant in TIMELINE_VARIANTS:
            path = tmp / f"timeline_{variant}.json"
            timeline_setting = {"rounds": 1, "steps_per_epoch": TIMELINE_STEPS_PER_EPOCH}
            durations[f"timeline_{variant}_s"], _ = _run(
                _common.horovodrun_cmd(2, script, _worker_args(timeline_setting, tmp / "unused.json", variant)),
                _common.worker_env(threads=1, extra={"HOROVOD_TIMELINE": str(path)}), args.timeout,
                f"the timeline run of {variant}")
            timelines[variant] = count_collectives(_load_timeline(path), EPOCHS * TIMELINE_STEPS_PER_EPOCH)
    durations["total_s"] = time.perf_counter() - started
    for key in ("ranks1", "ranks2"):
        results[key] = _summary(raws[key])
    same = all(timelines[TIMELINE_VARIANTS[0]][field] == timelines[variant][field] for variant in TIMELINE_VARIANTS
               for field in ("ops_per_step", "allreduce_bytes_per_step", "allreduce_tensors_per_step"))

    report = {
        "machine": _common.machine(),
        "command": "python bench/overhead.py" + (" --quick" if args.quick else ""),
        "settings": {**setting, "epochs_per_round": EPOCHS, "steps_per_round": EPOCHS * setting["steps_per_epoch"],
                     "batch": BATCH, "model": "MLP 32-64-2", "threads_per_process": 1, "base_lr": BASE_LR,
                     "warmup_epochs": WARMUP_EPOCHS, "decay_epochs": list(DECAY_EPOCHS), "gamma": GAMMA},
        "durations_s": {key: round(value, 1) for key, value in durations.items()},
        "loadavg_1min": loads,
        "steps_per_execution": {name: (STEPS_PER_EXECUTION if name.endswith(_SPE) else 1) for name in VARIANTS},
        "not_applicable": NOT_APPLICABLE,
        "ranks1": results["ranks1"],
        "ranks2": results["ranks2"],
        "final_lr": {key: raws[key]["final_lr"] for key in raws},
        "momentum_corrections": {key: raws[key]["momentum_corrections"] for key in raws},
        "horovod_momentum_correction_true": raws["ranks1"]["horovod_momentum_correction_true"],
        "timeline": {**timelines, "identical": same},
        "seconds_per_step": {key: raws[key]["seconds_per_step"] for key in raws},
        "fit_seconds_per_step": {key: raws[key]["fit_seconds_per_step"] for key in raws},
    }
    for key, title in (("ranks1", "1 rank"), ("ranks2", "2 ranks (horovodrun -np 2 --gloo)")):
        _print_table(f"{title}: {setting['rounds']} rounds x {EPOCHS * setting['steps_per_epoch']} steps per "
                     f"variant", results[key])
    print("\nHorovod timeline, 2 ranks, per step:")
    for variant, counts in timelines.items():
        print(f"  {variant}: ops {counts['ops_per_step']}, allreduce bytes {counts['allreduce_bytes_per_step']:g}, "
              f"tensors {counts['allreduce_tensors_per_step']}")
    print(f"  identical: {same}")
    check = report["horovod_momentum_correction_true"]
    print(f"Horovod LearningRateWarmupCallback(momentum_correction=True): "
          f"{'runs' if check['runs'] else 'fails: ' + check['error']}")
    print("LR after a round (baseline keeps BASE_LR; the others end at BASE_LR * GAMMA ** 2):")
    for key, lrs in report["final_lr"].items():
        print(f"  {key}: " + ", ".join(f"{name} {value:.6g}" for name, value in lrs.items()))
    print(f"took {durations['total_s']:.0f} s")
    print(f"1-min load average: {loads}")
    if args.out:
        _common.write_json(args.out, report)
        print(f"wrote {args.out}")
    if args.raw_dir or not args.quick:  # every full run keeps its raw per-round figures, under its own name
        raw = _common.raw_path("overhead", args.raw_dir)
        _common.write_json(raw, report)
        print(f"wrote {raw}")
    print(json.dumps({key: {name: row["ratio_median"] for name, row in results[key].items()
                            if "not_applicable" not in row} for key in ("ranks1", "ranks2")}))
    return 0 if same else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds x 40 steps (under a minute)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per variant")
    parser.add_argument("--steps-per-epoch", type=int, default=None,
                        help=f"steps per epoch; a round is {EPOCHS} epochs")
    parser.add_argument("--out", default=None,
                        help="where to write the JSON report (default: docs/overhead.json without --quick)")
    parser.add_argument("--raw-dir", default=None,
                        help="where this run's raw figures go as <date>_overhead.json (default: docs/bench/ without "
                             "--quick; with --quick only if given)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed to each subprocess")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--check-horovod-momentum-correction", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("rounds", "steps_per_epoch"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.worker:
        worker(args)
        return 0
    if args.out is None and not args.quick:
        args.out = str(_common.DOCS / "overhead.json")
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
