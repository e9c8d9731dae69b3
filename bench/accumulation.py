"""Benchmark: the cost of gradient accumulation per update, at 1 and 2 Horovod ranks (not a test).

With gradient accumulation each optimizer update (an iteration, Detectron's ITER) averages the gradients of k
micro-batches per rank (Caffe's ``iter_size``). At a fixed batch per update, k = 2 runs two forward and backward
passes of half the batch instead of one of the whole batch, and the ranks still reduce once per update. What
does that cost per update?

Rows, for each model at 1 rank (plain ``python``, ``hvd.init()`` with size 1) and at 2 ranks
(``horovodrun -np 2 --gloo``):

- ``mlp``: ``bench/overhead.py``'s MLP (32-64-2), 64 examples per rank and update (its data, in micro-batches);
- ``conv``: ``bench/conv_net.py``'s conv net (three Conv2D + BN + ReLU blocks, 32x32x3), its batch of 64 per rank
  and update;

each variant ``<model>_k<k>`` being ``hvd_sched.keras.DistributedOptimizer(hvd_sched.keras.ScheduledOptimizer(
SGD(momentum=0.9), schedule, momentum_correction="threshold"))``, the schedule ``conv_net.solver`` (linear warmup
from 1/4 of the LR, x0.1 at half and x0.01 at 4/5 of a round, Detectron's correction threshold 1.1) with
``ITER_SIZE: k``: micro-batch = batch per update / k, and ``model.fit`` runs k x the updates as steps (Keras'
steps are micro-batches). The schedule counts updates, so k = 1 and k = 2 run the same LRs and corrections.

The harness is ``bench/overhead.py``'s (``_fit.time_rounds``): one untimed round traces every variant, then R
rounds in a shuffled order (a barrier before each ``fit``; each ``fit`` restarts the optimizer's counter, so every
round runs the whole schedule), the steps of each epoch timed without Keras' once-per-epoch work; one TensorFlow
thread per process. Seconds per update = seconds per step x k. Reported per model and ranks: ``<model>_k2``
against ``<model>_k1``, the ratio of medians with its 95% bootstrap interval and the extra microseconds per update
(``_common.compare``), in wall time (``ranks1``, ``ranks2``) and process CPU time (``cpu``). No target: the ratio
is the result (``verdict``: "no target").

Checks, stored with the result (the script exits 1 if one fails): after the last round every variant's
``hvd_sched.keras.iteration_count`` is the updates of a round and its step counter k times that; at 2 ranks both
ranks end with identical weights (a SHA-256 of each variant's trainable weights, ``hvd.allgather_object``); and a
short 2-rank job (``HOROVOD_TIMELINE=DYNAMIC``) records one untimed round of each variant in its own timeline
(``_fit.record_timelines``): k = 2 must move the same allreduce operations and bytes per update as k = 1, so half
of them per micro-batch (one reduction per update).

Usage::

    python bench/accumulation.py            # 20 rounds; mlp 2 x 20 updates, conv 2 x 5 updates per round
                                            # -> docs/bench/<date>_accumulation_<row>.json and .md
    python bench/accumulation.py --quick    # 2 rounds of 2 x 4 (mlp) and 2 x 2 (conv) updates; writes nothing
                                            # unless --out or --raw-dir
    python bench/accumulation.py --rounds 40 --updates-per-epoch mlp=40 conv=10    # longer

A full run should take about 2 minutes on this 2-core machine when it is quiet (an estimate from the --quick
runs, which take 40-50 s; more under load).

The last line printed is one JSON object ``{"ranks1": {...}, "ranks2": {...}}``: the ratio of median wall time
per update, k = 2 over k = 1, of each model.
"""

import argparse
import hashlib
import json
import pathlib
import sys
import tempfile
import time

import _common
import _fit
import conv_net
import overhead

MODELS = {"mlp": overhead, "conv": conv_net}  # each module's _model(keras) and _data(tf, batch)
DESCRIPTIONS = {"mlp": "MLP 32-64-2 (bench/overhead.py)",
                "conv": f"conv net {conv_net.CHANNELS}, 32x32x3 (bench/conv_net.py)"}
UPDATE_BATCH = {"mlp": 64, "conv": conv_net.BATCH}  # examples per rank and update, whatever k
MICRO_BATCHES = (1, 2)
EPOCHS = 2
SETTINGS = {"full": {"rounds": 20, "updates_per_epoch": {"mlp": 20, "conv": 5}},
            "quick": {"rounds": 2, "updates_per_epoch": {"mlp": 4, "conv": 2}}}
TIMELINE_UPDATES_PER_EPOCH = {"mlp": 4, "conv": 2}
VARIANTS = tuple(f"{model}_k{k}" for model in MODELS for k in MICRO_BATCHES)
REFERENCE = {f"{model}_k{k}": f"{model}_k1" for model in MODELS for k in MICRO_BATCHES if k > 1}
BOOTSTRAP_RESAMPLES = 10000
_BARRIER = "bench_barrier"


def _split(name):
    """``"conv_k2"`` -> ``("conv", 2)``."""
    model, k = name.rsplit("_k", 1)
    return model, int(k)


# ---------------------------------------------------------------------------------------------- worker side


def _checksum(model):
    """SHA-256 (16 hex digits) of the model's trainable weights, bit for bit."""
    import numpy as np

    digest = hashlib.sha256()
    for variable in model.trainable_variables:
        digest.update(np.ascontiguousarray(np.asarray(variable)).tobytes())
    return digest.hexdigest()[:16]


def worker(args):
    """Runs on every rank; rank 0 writes the timings and checks (a timeline run: Horovod writes the timelines)."""
    _common.limit_threads(1)
    import hvd_sched.keras  # before Horovod's Keras layer (required on the tf2.21 row)
    import horovod.tensorflow as hvd
    import tensorflow as tf

    import hvd_sched

    keras = tf.keras
    hvd.init()
    per_epoch = args.updates_per_epoch
    updates = {name: EPOCHS * per_epoch[_split(name)[0]] for name in VARIANTS}
    steps_per_epoch = {name: _split(name)[1] * per_epoch[_split(name)[0]] for name in VARIANTS}
    datasets, built = {}, {}
    for name in VARIANTS:
        model, k = _split(name)
        datasets[name] = MODELS[model]._data(tf, UPDATE_BATCH[model] // k)
        schedule = hvd_sched.from_detectron({**conv_net.solver(updates[name]), "ITER_SIZE": k})
        # conv_net.py's scheduled variant; the schedule's ITER_SIZE makes DistributedOptimizer accumulate k.
        built[name] = conv_net._build("hvd_sched_optimizer", keras, schedule, model=MODELS[model]._model(keras))

    barrier_tensor = tf.constant(0.0)

    @tf.function
    def barrier():  # traced, so that the op (and its timeline entry) carries the name
        return hvd.allreduce(barrier_tensor, name=_BARRIER)

    if args.timeline_dir:
        _fit.record_timelines(built, datasets, args.timeline_dir, keras=keras, epochs=EPOCHS,
                              steps_per_epoch=steps_per_epoch, barrier=barrier)
        return
    times = _fit.time_rounds(built, datasets, keras=keras, epochs=EPOCHS, steps_per_epoch=steps_per_epoch,
                             rounds=args.rounds, barrier=barrier)
    checksums = hvd.allgather_object({name: _checksum(model) for name, (model, _) in built.items()})
    if hvd.rank() != 0:
        return
    _common.write_json(args.result, {
        "size": hvd.size(),
        "updates_per_round": updates,
        "steps_per_round": {name: EPOCHS * steps for name, steps in steps_per_epoch.items()},
        "seconds_per_update": {name: [s * _split(name)[1] for s in values] for name, values in times["wall"].items()},
        "cpu_seconds_per_update": {name: [s * _split(name)[1] for s in values]
                                   for name, values in times["cpu"].items()},
        "iteration_count": {name: int(hvd_sched.keras.iteration_count(model.optimizer))
                            for name, (model, _) in built.items()},
        "micro_batch_counter": {name: int(_fit.micro_batch_counter(model.optimizer).numpy())
                                for name, (model, _) in built.items()},
        "weights_sha256": checksums,
    })


# ---------------------------------------------------------------------------------------------- driver side


def _worker_args(setting, result, timeline_dir=None):
    args = ["--worker", "--rounds", setting["rounds"], "--result", result, "--updates-per-epoch",
            *(f"{model}={updates}" for model, updates in setting["updates_per_epoch"].items())]
    return args + (["--timeline-dir", timeline_dir] if timeline_dir else [])


def _timeline_run(script, tmp, timeout, durations):
    """Allreduce operations and bytes per update (and per micro-batch) of each variant, from one 2-rank job."""
    setting = {"rounds": 0, "updates_per_epoch": TIMELINE_UPDATES_PER_EPOCH}
    durations["timeline_s"], _ = _common.run_checked(
        _common.horovodrun_cmd(2, script, _worker_args(setting, tmp / "unused.json", timeline_dir=tmp)),
        _common.worker_env(threads=1, extra={"HOROVOD_TIMELINE": "DYNAMIC"}), timeout, "the timeline run")
    timeline = {}
    for name in VARIANTS:
        model, k = _split(name)
        updates = EPOCHS * TIMELINE_UPDATES_PER_EPOCH[model]
        counts = _fit.count_collectives(_fit.load_timeline(tmp / f"{name}.json"), updates, ignore=_BARRIER)
        timeline[name] = {"updates": updates, "micro_batches": updates * k,
                          "ops_per_update": counts["ops_per_step"],
                          "allreduce_bytes_per_update": counts["allreduce_bytes_per_step"],
                          "allreduce_bytes_per_micro_batch": counts["allreduce_bytes_per_step"] / k,
                          "allreduce_tensors_per_update": counts["allreduce_tensors_per_step"]}
    comparison = {}
    for name, reference in REFERENCE.items():
        k = _split(name)[1]
        row, base = timeline[name], timeline[reference]
        comparison[name] = {
            "reference": reference,
            "same_per_update": row["ops_per_update"] == base["ops_per_update"]
            and row["allreduce_bytes_per_update"] == base["allreduce_bytes_per_update"] > 0,
            "bytes_per_micro_batch_ratio": row["allreduce_bytes_per_micro_batch"]
            / base["allreduce_bytes_per_micro_batch"] if base["allreduce_bytes_per_micro_batch"] else None,
            "expected_ratio": 1 / k}
    return {"variants": timeline, "comparison": comparison}


def _checks(raws, timeline):
    """Every check of the run, and whether all passed."""
    checks = {}
    for key, raw in raws.items():
        for name in VARIANTS:
            k, updates = _split(name)[1], raw["updates_per_round"][name]
            checks[f"{key} {name}: iteration_count == updates of a round ({updates})"] = \
                raw["iteration_count"][name] == updates
            checks[f"{key} {name}: step counter == k x updates ({k * updates})"] = \
                raw["micro_batch_counter"][name] == k * updates
            if raw["size"] > 1:
                checks[f"{key} {name}: identical weights on the {raw['size']} ranks"] = \
                    len({sums[name] for sums in raw["weights_sha256"]}) == 1
    for name, row in timeline["comparison"].items():
        checks[f"timeline {name}: same allreduce ops and bytes per update as {row['reference']}"] = \
            row["same_per_update"]
        checks[f"timeline {name}: {row['expected_ratio']:g} x the bytes per micro-batch"] = \
            row["bytes_per_micro_batch_ratio"] == row["expected_ratio"]
    return {"passed": all(checks.values()), "each": checks}


def _tables(raws, clock):
    """``{ranks key: {variant: compare row}}`` of every k > 1 against k = 1 (same model, same ranks)."""
    tables = {}
    for key, raw in raws.items():
        tables[key] = {}
        for name, reference in REFERENCE.items():
            row = _common.compare(raw[clock][name], raw[clock][reference], reference,
                                  resamples=BOOTSTRAP_RESAMPLES)
            tables[key][name] = {**row, "verdict": "no target", "note": "no target"}
    return tables


def driver(args):
    setting = dict(SETTINGS["quick" if args.quick else "full"])
    for name in ("rounds", "updates_per_epoch"):
        if getattr(args, name) is not None:
            setting[name] = getattr(args, name)
    script = pathlib.Path(__file__).resolve()
    loads, durations, raws = {"start": _common.loadavg()}, {}, {}
    machine = _common.machine()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hvd_sched_accumulation_") as tmp:
        tmp = pathlib.Path(tmp)
        for ranks in (1, 2):
            result = tmp / f"ranks{ranks}.json"
            cmd = list(map(str, _worker_args(setting, result)))
            cmd = [sys.executable, str(script), *cmd] if ranks == 1 else _common.horovodrun_cmd(ranks, script, cmd)
            durations[f"ranks{ranks}_s"], _ = _common.run_checked(cmd, _common.worker_env(threads=1), args.timeout,
                                                                  f"the {ranks}-rank run")
            loads[f"after_ranks{ranks}"] = _common.loadavg()
            raws[f"ranks{ranks}"] = json.loads(result.read_text())
        timeline = _timeline_run(script, tmp, args.timeout, durations)
    loads["end"] = _common.loadavg()
    durations["total_s"] = time.perf_counter() - started
    results = _tables(raws, "seconds_per_update")
    cpu_results = _tables(raws, "cpu_seconds_per_update")
    checks = _checks(raws, timeline)
    row = machine.get("stack_row", "unknown")
    command = _common.command_line(row, "accumulation.py", args.quick)
    report = {
        "machine": machine, "command": command, "keras_major": overhead.KERAS_MAJOR,
        "settings": {**setting, "epochs_per_round": EPOCHS, "micro_batches": list(MICRO_BATCHES),
                     "batch_per_rank_and_update": UPDATE_BATCH, "models": DESCRIPTIONS,
                     "micro_batch": {name: UPDATE_BATCH[_split(name)[0]] // _split(name)[1] for name in VARIANTS},
                     "solver": {name: {**conv_net.solver(EPOCHS * setting["updates_per_epoch"][_split(name)[0]]),
                                       "ITER_SIZE": _split(name)[1]} for name in VARIANTS},
                     "threads_per_process": 1, "bootstrap_resamples": BOOTSTRAP_RESAMPLES,
                     "timeline_updates_per_epoch": TIMELINE_UPDATES_PER_EPOCH},
        "durations_s": {key: round(value, 1) for key, value in durations.items()}, "loadavg": loads,
        **results, "cpu": cpu_results, "timeline": timeline, "checks": checks,
        **{f"raw_{key}": raw for key, raw in raws.items()},
    }
    lines = [f"`{command}` ({row}, Keras {overhead.KERAS_MAJOR}), {machine['date']}, {durations['total_s']:.0f} s, "
             f"load averages {loads}", ""]
    for key, raw in raws.items():
        for clock, tables in (("wall time", results), ("process CPU time", cpu_results)):
            rounds = ", ".join(f"{model} {EPOCHS * setting['updates_per_epoch'][model]}" for model in MODELS)
            lines += _common.comparison_table(f"{raw['size']} rank(s), {clock}: k micro-batches per update against "
                                              f"1, {setting['rounds']} rounds of {rounds} updates", tables[key],
                                              per="update")
    lines.append("Horovod timeline, 2 ranks:")
    lines += [f"- {name}: ops per update {row['ops_per_update']}, allreduce bytes per update "
              f"{row['allreduce_bytes_per_update']:g}, per micro-batch {row['allreduce_bytes_per_micro_batch']:g}"
              for name, row in timeline["variants"].items()]
    lines += [f"- {name}: the same ops and bytes per update as {row['reference']}: {row['same_per_update']}; bytes "
              f"per micro-batch x{row['bytes_per_micro_batch_ratio']} (expected x{row['expected_ratio']:g})"
              for name, row in timeline["comparison"].items()]
    lines.append(f"\nChecks: {'all passed' if checks['passed'] else 'FAILED'}")
    lines += [f"- {'ok' if ok else 'FAILED'}: {what}" for what, ok in checks["each"].items() if not ok]
    print("\n".join(lines))
    print(f"took {durations['total_s']:.0f} s ({report['durations_s']})")
    _common.write_report(report, lines, f"accumulation_{row}", args)
    print(json.dumps({key: {name: r["ratio_median"] for name, r in table.items()} for key, table in results.items()}))
    return 0 if checks["passed"] else 1


def _model_updates(text):
    """The argparse type of ``--updates-per-epoch``: ``"mlp=20"`` -> ``("mlp", 20)``."""
    model, _, value = text.partition("=")
    if model not in MODELS or not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected MODEL=N with MODEL one of {list(MODELS)} and an int N >= 1, "
                                         f"got {text!r}")
    return model, int(value)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of a few updates")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per variant")
    parser.add_argument("--updates-per-epoch", nargs="+", type=_model_updates, default=None, metavar="MODEL=N",
                        help=f"updates per epoch of each model ({', '.join(MODELS)}); a round is {EPOCHS} epochs")
    _common.add_output_arguments(parser, "accumulation")
    parser.add_argument("--timeline-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.updates_per_epoch is not None:
        updates = dict(args.updates_per_epoch)
        if len(updates) != len(args.updates_per_epoch) or set(updates) != set(MODELS):
            parser.error(f"--updates-per-epoch takes each model of {list(MODELS)} once, got "
                         f"{[f'{model}={n}' for model, n in args.updates_per_epoch]}")
        args.updates_per_epoch = updates
    if args.worker:
        worker(args)
        return 0
    if args.rounds is not None and args.rounds < 1:  # (a timeline worker runs 0 timed rounds)
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
