"""Benchmark: the per-step cost of LR scheduling in ``model.fit``, at 1 and 2 Horovod ranks (not a test).

The user's view: a tiny MLP (32-64-2, batch 32, data in memory) trained with ``model.fit``; every variant's
optimizer goes through ``hvd_sched.keras.DistributedOptimizer`` (on Keras 2 that is Horovod's own
``hvd.DistributedOptimizer``). For the optimizer's cost without the model, measured with far less noise, see
``bench/apply_loop.py``; for a model with tens of ms per step, ``bench/conv_net.py``.

Keras 2 (rows tf2.15 and tf2.21), all with ``SGD(momentum=0.9)``:

- ``baseline``: constant LR;
- ``horovod_callbacks``: Horovod's ``LearningRateWarmupCallback`` + ``LearningRateScheduleCallback`` (one per
  phase, with constant multiplier *functions*: a float multiplier means exponential decay in Horovod) and
  ``momentum_correction=False``, because True crashes on TF 2.15's SGD (the script checks that and records the
  message);
- ``keras_schedule``: Keras' in-graph ``PiecewiseConstantDecay`` at the same step boundaries (it has no warmup);
- ``hvd_sched_optimizer``: ``hvd_sched.keras.ScheduledOptimizer`` with linear warmup, two steps and momentum
  correction (``'threshold'``);
- ``hvd_sched_callback``: ``hvd_sched.keras.ScheduleCallback`` with the same schedule and correction;
- ``*_spe16``: compiled with ``steps_per_execution=16`` (16 steps per call of the train function);
- ``*_xla``: ``opt.jit_compile = True`` set on the optimizer ``DistributedOptimizer`` returned, as a GPU would
  have it: Keras 2 then runs each variable's update in ``_update_step_xla`` (XLA's CPU backend here). Not
  ``model.compile(jit_compile=True)``: a whole-step XLA graph cannot contain Horovod's allreduce (hvd_sched
  raises a clear ValueError for it by design).

Keras 3 (row keras3): ``baseline``, ``keras_schedule``, ``hvd_sched_optimizer`` and ``hvd_sched_callback`` as
above (through hvd_sched's Keras 3 ``DistributedOptimizer``), plus ``floor``: a bare subclass of
``keras.optimizers.SGD`` whose ``apply`` runs ``horovod.tensorflow.grouped_allreduce(grads, op=hvd.Average)``
and then ``super().apply``, the least a Keras 3 data-parallel optimizer can do. Extra rows ``distributed_vs_floor``
(``baseline`` / ``floor``, at steps_per_execution 1 and 16) give the wrapper's cost. At 1 rank hvd_sched's
wrapper emits no collective at all (size 1, not elastic) while the floor still calls ``grouped_allreduce``: the
rows say so. Horovod's callbacks and the ``_xla`` rows are n/a on Keras 3 (``NOT_APPLICABLE`` gives why).

Schedule shape, per round of ``EPOCHS`` epochs of ``steps_per_epoch`` steps: linear warmup over epoch 0 from
``lr / size`` (Horovod's gradual warmup; flat at 1 rank), ``lr`` for epochs 1-2, ``lr / 10`` from epoch 3 and
``lr / 100`` from epoch 4. Every round resets ``optimizer.iterations``, so each round runs the whole schedule,
corrections included. Each variant is traced once (one untimed round); then for R rounds the variants run in a
shuffled order (the same on every rank, a barrier before each ``fit``). A round's time is the sum over its
epochs of the time from the start of the first step to the end of the last, divided by the steps (``_fit``).
No broadcast callback: every rank builds the same weights from the same seed. One TensorFlow thread per process.

Every ratio comes with a 95% percentile bootstrap interval over rounds (``_common.compare``: ratio of medians, of
minimums, median of per-round ratios, extra microseconds per step), in wall time (``ranks1``, ``ranks2``: the user's
view) and in the process's CPU time (``cpu``: not inflated while another job holds the core). Targets (``TARGETS``, 1.02x): the scheduled
optimizer against constant LR at every steps_per_execution (and with XLA on Keras 2); on Keras 3 also the
distributed wrapper against the floor. "confirmed" when the interval's upper end is <= the target, "refuted"
when its lower end is above it, else "undecided".

A second check, at 2 ranks: one short job (``HOROVOD_TIMELINE=DYNAMIC``) records one untimed round of each of
``TIMELINE_VARIANTS`` in its own Horovod timeline (``hvd.start_timeline``/``stop_timeline``); the allreduce
operations and bytes per step must be equal in all of them (the script exits 1 otherwise).

Usage::

    python bench/overhead.py            # 40 rounds x 100 steps per variant at 1 and 2 ranks; raw figures and the
                                        # tables -> docs/bench/<date>_overhead_<row>.json/.md
    python bench/overhead.py --quick    # 2 rounds x 20 steps, about a minute; writes nothing unless --out/--raw-dir

The last line printed is one JSON object ``{"ranks1": {...}, "ranks2": {...}}`` mapping each measured row to its
ratio of median step time against its reference in the same run.
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

import _baselines
import _common
import _fit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import hvd_sched._compat as _compat  # noqa: E402  (after sys.path and the log level are set; before Horovod)

KERAS_MAJOR = _compat.keras_major()
STEPS_PER_EXECUTION = 16
_SPE = f"_spe{STEPS_PER_EXECUTION}"
_XLA = "_xla"
TARGET = 1.02

if KERAS_MAJOR == 2:
    VARIANTS = ("baseline", "horovod_callbacks", "keras_schedule", "hvd_sched_optimizer", "hvd_sched_callback",
                "baseline" + _SPE, "hvd_sched_optimizer" + _SPE, "baseline" + _XLA, "hvd_sched_optimizer" + _XLA,
                "baseline" + _XLA + _SPE, "hvd_sched_optimizer" + _XLA + _SPE)
    NOT_APPLICABLE = {
        "horovod_callbacks" + _SPE: "Horovod's LR callbacks set the LR from Python in on_batch_begin/on_batch_end; "
                                    "at steps_per_execution > 1 Keras calls those hooks once per 16 steps, so the "
                                    "LR would change every 16 steps, not per step",
        "hvd_sched_callback" + _SPE: "ScheduleCallback sets the LR and rescales the momentum from Python before "
                                     "each batch; at steps_per_execution > 1 it would run once per 16 steps",
    }
    EXTRA_ROWS = {}  # row name -> (variant, reference)
    TIMELINE_VARIANTS = ("baseline", "hvd_sched_optimizer", "hvd_sched_optimizer" + _XLA)
else:
    VARIANTS = ("baseline", "keras_schedule", "hvd_sched_optimizer", "hvd_sched_callback", "floor",
                "baseline" + _SPE, "hvd_sched_optimizer" + _SPE, "floor" + _SPE)
    _NO_XLA = ("Keras 3 optimizers have no per-variable XLA update (Keras 2's _update_step_xla); the only XLA is the "
               "whole step (model.compile(jit_compile=True)), which cannot contain Horovod's collectives: "
               "hvd_sched.keras.DistributedOptimizer raises a clear ValueError for it at more than 1 rank")
    _HOROVOD_K3 = ("Horovod 0.28.1's Keras callbacks call var.ref() and optimizer.lr, which Keras 3 lacks, and its "
                   "Keras DistributedOptimizer does not average there (hvd_sched refuses it)")
    NOT_APPLICABLE = {
        "horovod_callbacks": _HOROVOD_K3, "horovod_callbacks" + _SPE: _HOROVOD_K3,
        "hvd_sched_callback" + _SPE: "ScheduleCallback sets the LR and rescales the momentum from Python before "
                                     "each batch; at steps_per_execution > 1 it would run once per 16 steps",
        "baseline" + _XLA: _NO_XLA, "hvd_sched_optimizer" + _XLA: _NO_XLA,
    }
    EXTRA_ROWS = {"distributed_vs_floor": ("baseline", "floor"),
                  "distributed_vs_floor" + _SPE: ("baseline" + _SPE, "floor" + _SPE)}
    TIMELINE_VARIANTS = ("floor", "baseline", "hvd_sched_optimizer")


def _reference(name):
    """Constant-LR SGD through the same wrapper, at the same steps_per_execution and XLA setting."""
    if name.startswith("floor"):
        return name
    return "baseline" + (_XLA if _XLA in name else "") + (_SPE if name.endswith(_SPE) else "")


REFERENCE = {name: _reference(name) for name in VARIANTS}
TARGETS = {name: TARGET for name in VARIANTS if name.startswith("hvd_sched_optimizer")}
TARGETS.update({name: TARGET for name in EXTRA_ROWS})
_FLOOR_NOTE = ("1 rank: hvd_sched's Keras 3 DistributedOptimizer emits no collective at size 1 (not elastic); the "
               "floor still calls grouped_allreduce")
BOOTSTRAP_RESAMPLES = 10000
_BARRIER = "bench_barrier"

BASE_LR = 0.05
MOMENTUM = 0.9
BATCH = 32
EPOCHS = 5  # per round: warmup (epoch 0), lr (1-2), lr/10 (3), lr/100 (4)
WARMUP_EPOCHS = 1
DECAY_EPOCHS = (3, 4)
GAMMA = 0.1
SETTINGS = {"full": {"rounds": 40, "steps_per_epoch": 20}, "quick": {"rounds": 2, "steps_per_epoch": 4}}
TIMELINE_STEPS_PER_EPOCH = 4  # a timeline run: one round of EPOCHS * 4 steps


# ---------------------------------------------------------------------------------------------- worker side


def _solver():
    return {"BASE_LR": BASE_LR, "LR_POLICY": "steps_with_decay", "GAMMA": GAMMA,
            "STEPS_EPOCHS": [0, *DECAY_EPOCHS], "MAX_EPOCHS": EPOCHS, "WARM_UP_EPOCHS": WARMUP_EPOCHS,
            "WARM_UP_FACTOR": "horovod", "WARM_UP_METHOD": "linear", "SCALE_MOMENTUM": True,
            "SCALE_MOMENTUM_THRESHOLD": 1.1}


def _data(tf, batch=BATCH):
    """``BATCH * 64`` generated examples (the same on every rank), in batches of ``batch``, repeated."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * 64, 32)).astype(np.float32)
    y = (x @ rng.normal(size=32) > 0).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).repeat()


def _model(keras):
    keras.utils.set_random_seed(0)  # the same weights on every rank (no broadcast needed)
    return keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(2)])


def _build(name, keras, schedule, steps_per_epoch):
    """(model compiled for variant `name`, its scheduling callbacks)."""
    import hvd_sched.keras

    model = _model(keras)
    callbacks = []
    steps_per_execution = STEPS_PER_EXECUTION if name.endswith(_SPE) else 1
    xla = _XLA in name
    base = name.removesuffix(_SPE).removesuffix(_XLA)
    sgd = keras.optimizers.SGD
    if base == "baseline":
        optimizer = sgd(BASE_LR, momentum=MOMENTUM)
    elif base == "horovod_callbacks":
        optimizer = sgd(BASE_LR, momentum=MOMENTUM)
        callbacks = _baselines.horovod_lr_callbacks(steps_per_epoch, base_lr=BASE_LR, warmup_epochs=WARMUP_EPOCHS,
                                                    decay_epochs=DECAY_EPOCHS, gamma=GAMMA)
    elif base == "keras_schedule":
        boundaries = [epoch * steps_per_epoch for epoch in DECAY_EPOCHS]
        values = [BASE_LR, BASE_LR * GAMMA, BASE_LR * GAMMA ** 2]
        optimizer = sgd(keras.optimizers.schedules.PiecewiseConstantDecay(boundaries, values), momentum=MOMENTUM)
    elif base == "hvd_sched_optimizer":
        optimizer = hvd_sched.keras.ScheduledOptimizer(sgd(momentum=MOMENTUM), schedule,
                                                       momentum_correction="threshold")
    elif base == "hvd_sched_callback":
        optimizer = sgd(BASE_LR, momentum=MOMENTUM)
        callbacks = [hvd_sched.keras.ScheduleCallback(schedule, momentum_correction="threshold", verbose=0)]
    elif base == "floor":
        optimizer = _baselines.floor_optimizer_class(keras)(BASE_LR, momentum=MOMENTUM)
    else:
        raise ValueError(f"unknown variant {name!r}; expected one of {VARIANTS}")
    if base != "floor":
        optimizer = hvd_sched.keras.DistributedOptimizer(optimizer)
    if KERAS_MAJOR == 2:
        # Explicit either way: on a GPU machine Keras 2 optimizers turn jit_compile on by themselves.
        optimizer.jit_compile = xla
    model.compile(optimizer, steps_per_execution=steps_per_execution,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, callbacks


def worker(args):
    """Runs on every rank; rank 0 writes the timings (or, for a timeline run, nothing: Horovod writes it)."""
    _common.limit_threads(1)
    import hvd_sched.keras  # before Horovod's Keras layer (required on the tf2.21 row)
    import horovod.tensorflow as hvd
    import tensorflow as tf

    import hvd_sched

    keras = tf.keras  # Keras 2 or Keras 3, whichever this row has
    hvd.init()
    steps_per_epoch = args.steps_per_epoch
    steps = EPOCHS * steps_per_epoch
    schedule = hvd_sched.from_detectron(_solver(), steps_per_epoch=steps_per_epoch, world_size=hvd.size())
    dataset = _data(tf)
    names = list(TIMELINE_VARIANTS if args.timeline_dir else VARIANTS)
    built = {name: _build(name, keras, schedule, steps_per_epoch) for name in names}

    barrier_tensor = tf.constant(0.0)

    @tf.function
    def barrier():  # traced, so that the op (and its timeline entry) carries the name
        return hvd.allreduce(barrier_tensor, name=_BARRIER)

    if args.timeline_dir:  # each variant's fit recorded in its own timeline file
        _fit.record_timelines(built, dataset, args.timeline_dir, keras=keras, epochs=EPOCHS,
                              steps_per_epoch=steps_per_epoch, barrier=barrier)
        return
    barrier_tensor = tf.constant(0.0)
    times = _fit.time_rounds(built, dataset, keras=keras, epochs=EPOCHS, steps_per_epoch=steps_per_epoch,
                             rounds=args.rounds, barrier=barrier)
    if hvd.rank() != 0:
        return
    result = {
        "size": hvd.size(),
        "steps_per_round": steps,
        "rounds": args.rounds,
        "seconds_per_step": times["wall"],
        "cpu_seconds_per_step": times["cpu"],
        "fit_seconds_per_step": times["fit"],
        "final_lr": {name: _fit.current_lr(built[name][0].optimizer) for name in names},
        "schedule": schedule.get_config(),
        "momentum_corrections": schedule.momentum_corrections(steps),
    }
    if args.check_horovod_momentum_correction and KERAS_MAJOR == 2:
        result["horovod_momentum_correction_true"] = _baselines.horovod_momentum_correction_check(
            keras, _model(keras), dataset, base_lr=BASE_LR, momentum=MOMENTUM)
    _common.write_json(args.result, result)


# ---------------------------------------------------------------------------------------------- driver side


def _worker_args(setting, result, timeline_dir=None, check=False):
    args = ["--worker", "--rounds", setting["rounds"], "--steps-per-epoch", setting["steps_per_epoch"],
            "--result", result]
    if timeline_dir:
        args += ["--timeline-dir", timeline_dir]
    if check:
        args.append("--check-horovod-momentum-correction")
    return args


def _summary(raw, ranks, clock="seconds_per_step"):
    """Every variant against its REFERENCE, the EXTRA_ROWS, and the n/a rows with their reasons, in wall time
    (``clock="seconds_per_step"``) or process CPU time (``"cpu_seconds_per_step"``)."""
    seconds = raw[clock]
    table = {}
    rows = [(name, name, REFERENCE[name]) for name in VARIANTS]
    rows += [(row, variant, reference) for row, (variant, reference) in EXTRA_ROWS.items()]
    for row, variant, reference in rows:
        table[row] = _common.compare(seconds[variant], seconds[reference], reference, TARGETS.get(row),
                                     BOOTSTRAP_RESAMPLES)
        if ranks == 1 and (variant.startswith("floor") or reference.startswith("floor")) and variant != reference:
            table[row]["note"] = _FLOOR_NOTE
    for name, reason in NOT_APPLICABLE.items():
        table[name] = {"reference": _reference(name), "not_applicable": reason}
    return table


def _timeline_run(script, tmp, timeout, durations):
    """One 2-rank job records each of TIMELINE_VARIANTS in its own timeline (hvd.start_timeline/stop_timeline)."""
    setting = {"rounds": 0, "steps_per_epoch": TIMELINE_STEPS_PER_EPOCH}
    durations["timeline_s"], _ = _common.run_checked(
        _common.horovodrun_cmd(2, script, _worker_args(setting, tmp / "unused.json", timeline_dir=tmp)),
        _common.worker_env(threads=1, extra={"HOROVOD_TIMELINE": "DYNAMIC"}), timeout, "the timeline run")
    timelines = {variant: _fit.count_collectives(_fit.load_timeline(tmp / f"{variant}.json"),
                                                 EPOCHS * TIMELINE_STEPS_PER_EPOCH, ignore=_BARRIER)
                 for variant in TIMELINE_VARIANTS}
    fields = ("ops_per_step", "allreduce_bytes_per_step", "allreduce_tensors_per_step")
    first = timelines[TIMELINE_VARIANTS[0]]
    same = all(first[field] == counts[field] for counts in timelines.values() for field in fields)
    return {**timelines, "identical": same, "compared": list(TIMELINE_VARIANTS)}


def driver(args):
    setting = dict(SETTINGS["quick" if args.quick else "full"])
    if args.rounds is not None:
        setting["rounds"] = args.rounds
    if args.steps_per_epoch is not None:
        setting["steps_per_epoch"] = args.steps_per_epoch
    script = pathlib.Path(__file__).resolve()
    env = _common.worker_env(threads=1)
    durations = {}
    loads = {"start": _common.loadavg()}
    machine = _common.machine()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hvd_sched_overhead_") as tmp:
        tmp = pathlib.Path(tmp)
        raw1, raw2 = tmp / "ranks1.json", tmp / "ranks2.json"
        durations["ranks1_s"], _ = _common.run_checked(
            [sys.executable, str(script), *map(str, _worker_args(setting, raw1, check=True))], env, args.timeout,
            "the 1-rank run")
        loads["after_ranks1"] = _common.loadavg()
        durations["ranks2_s"], _ = _common.run_checked(
            _common.horovodrun_cmd(2, script, _worker_args(setting, raw2)), env, args.timeout, "the 2-rank run")
        loads["after_ranks2"] = _common.loadavg()
        raws = {"ranks1": json.loads(raw1.read_text()), "ranks2": json.loads(raw2.read_text())}
        timeline = _timeline_run(script, tmp, args.timeout, durations)
    loads["end"] = _common.loadavg()
    durations["total_s"] = time.perf_counter() - started
    results = {key: _summary(raws[key], raws[key]["size"]) for key in raws}
    cpu_results = {key: _summary(raws[key], raws[key]["size"], "cpu_seconds_per_step") for key in raws}
    row = machine.get("stack_row", "unknown")
    command = _common.command_line(row, "overhead.py", args.quick)
    report = {
        "machine": machine,
        "command": command,
        "keras_major": KERAS_MAJOR,
        "settings": {**setting, "epochs_per_round": EPOCHS, "steps_per_round": EPOCHS * setting["steps_per_epoch"],
                     "batch": BATCH, "model": "MLP 32-64-2", "threads_per_process": 1, "base_lr": BASE_LR,
                     "warmup_epochs": WARMUP_EPOCHS, "decay_epochs": list(DECAY_EPOCHS), "gamma": GAMMA,
                     "target": TARGET, "bootstrap_resamples": BOOTSTRAP_RESAMPLES},
        "durations_s": {key: round(value, 1) for key, value in durations.items()},
        "loadavg": loads,
        "steps_per_execution": {name: (STEPS_PER_EXECUTION if name.endswith(_SPE) else 1) for name in VARIANTS},
        "jit_compile_optimizer": {name: _XLA in name for name in VARIANTS},
        "not_applicable": NOT_APPLICABLE,
        "extra_rows": {name: list(pair) for name, pair in EXTRA_ROWS.items()},
        "ranks1": results["ranks1"],
        "ranks2": results["ranks2"],
        "cpu": cpu_results,
        "final_lr": {key: raws[key]["final_lr"] for key in raws},
        "momentum_corrections": {key: raws[key]["momentum_corrections"] for key in raws},
        "horovod_momentum_correction_true": raws["ranks1"].get("horovod_momentum_correction_true"),
        "timeline": timeline,
        "seconds_per_step": {key: raws[key]["seconds_per_step"] for key in raws},
        "cpu_seconds_per_step": {key: raws[key]["cpu_seconds_per_step"] for key in raws},
        "fit_seconds_per_step": {key: raws[key]["fit_seconds_per_step"] for key in raws},
    }
    lines = [f"`{command}` ({row}, Keras {KERAS_MAJOR}), {machine['date']}, {durations['total_s']:.0f} s, "
             f"1-min load average {loads['start'][0]} -> {loads['after_ranks1'][0]} (after 1 rank) -> "
             f"{loads['after_ranks2'][0]} (after 2 ranks)", ""]
    for key, title in (("ranks1", "1 rank"), ("ranks2", "2 ranks (horovodrun -np 2 --gloo)")):
        for clock, tables in (("wall time", results), ("process CPU time", cpu_results)):
            lines += _common.comparison_table(f"{title}, {clock}: {setting['rounds']} rounds x "
                                              f"{EPOCHS * setting['steps_per_epoch']} steps per variant", tables[key])
    lines.append("Horovod timeline, 2 ranks, per step:")
    lines += [f"- {variant}: ops {timeline[variant]['ops_per_step']}, allreduce bytes "
              f"{timeline[variant]['allreduce_bytes_per_step']:g}, tensors "
              f"{timeline[variant]['allreduce_tensors_per_step']}" for variant in TIMELINE_VARIANTS]
    lines.append(f"- identical: {timeline['identical']}")
    check = report["horovod_momentum_correction_true"]
    if check is not None:
        lines.append(f"\nHorovod LearningRateWarmupCallback(momentum_correction=True): "
                     f"{'runs' if check['runs'] else 'fails: ' + check['error']}")
    lines.append("\nLR after a round (baseline and floor keep BASE_LR; the others end at BASE_LR * GAMMA ** 2):")
    lines += [f"- {key}: " + ", ".join(f"{name} {value:.6g}" for name, value in lrs.items())
              for key, lrs in report["final_lr"].items()]
    print("\n".join(lines))
    print(f"took {durations['total_s']:.0f} s ({report['durations_s']}); load averages {loads}")
    _common.write_report(report, lines, f"overhead_{row}", args)
    print(json.dumps({key: {name: r["ratio_median"] for name, r in results[key].items() if "not_applicable" not in r}
                      for key in ("ranks1", "ranks2")}))
    return 0 if timeline["identical"] else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds x 20 steps (about a minute)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per variant")
    parser.add_argument("--steps-per-epoch", type=int, default=None,
                        help=f"steps per epoch; a round is {EPOCHS} epochs")
    _common.add_output_arguments(parser, "overhead", out_help="also write the JSON report here")
    parser.add_argument("--timeline-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--check-horovod-momentum-correction", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("rounds", "steps_per_epoch"):
        value = getattr(args, name)
        if value is not None and value < 1 and not args.worker:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.worker:
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
