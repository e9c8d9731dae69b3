"""Benchmark: what stopping at a signal costs with ``hvd_sched.keras.TrainingCheckpoint`` (not a test).

Three figures, on the row of the support matrix whose Python runs it:

1. **Per-step cost of watching for a signal** (``ranks1``, ``ranks2``). ``model.fit`` of ``bench/overhead.py``'s
   tiny MLP (32-64-2, batch 32, under 1 ms per step at 1 rank) at 1 rank (plain ``python``) and 2 ranks
   (``horovodrun -np 2 -H localhost:2 --gloo``), ``SGD(momentum=0.9)`` in ``ScheduledOptimizer`` in
   ``DistributedOptimizer``, callbacks ``horovod_callbacks(checkpoint=...)`` (the checkpoint last) with:

   - ``baseline``: nothing more;
   - ``checkpoint_no_signals``: ``TrainingCheckpoint(dir, stop_signals=(), peer_timeout=None)`` (no period:
     epoch ends only, no per-batch hook of its own, no heartbeat);
   - ``heartbeat``: the same with ``peer_timeout=60`` (the default): the peers' heartbeat alone (at 2 ranks a
     thread sending a datagram to the other rank every 2 s; at 1 rank there is no peer and no thread);
   - ``checkpoint_default``: ``TrainingCheckpoint(dir)`` (SIGTERM and SIGINT; the ranks agree about every
     ``agree_every=0.25`` s: one eager Horovod allgather of a 1x2 int64 tensor);
   - ``checkpoint_agree_every_step``: ``TrainingCheckpoint(dir, agree_every=1e-9)``: the worst case, one
     agreement per iteration (``agree_every`` must be > 0). At 1 rank an agreement is no collective at all
     (``_stop.agree`` returns at size 1): the row shows the Python cost of asking every step.

   Interleaved shuffled rounds (``_fit.time_rounds``: every variant traced once untimed, then R rounds in a
   shuffled order, the same on every rank, a barrier before each ``fit``); each ``fit`` is ``EPOCHS`` epochs, and
   ``_fit``'s timers leave the epoch ends out, so the epoch-end checkpoints (written into a temporary folder) and
   the epoch-end agreement are not in the step times. Every row against ``baseline`` from the same rounds
   (``_common.compare``: ratios and extra microseconds per step with 95% bootstrap intervals), in wall time and
   in process CPU time. After the rounds, one more untimed ``fit`` of each variant counts the agreements
   (``agreements``: calls of ``hvd_sched.keras._stop.agree`` per ``fit``, with the intervals rank 0 proposed).

2. **Save time** (``saves``). ``hvd_sched.keras.checkpoint.write_checkpoint`` (the write ``TrainingCheckpoint``
   makes: a temporary folder, ``tf.train.Checkpoint(model, optimizer).write``, fsync, rename, the ``latest``
   pointer) of (a) the demo's model (``examples/train_keras.py``'s ``build_model((64,), 10)``) and (b)
   ``tf.keras.applications.ResNet50(weights=None)`` (25.6 M parameters), each compiled with
   ``SGD(momentum=0.9)`` and trained one step on a tiny batch (so the slots exist), into a fresh folder of a
   temporary directory on the disk ``tempfile`` uses (its filesystem is recorded) per repetition. The first write
   is reported apart (TensorFlow builds its save functions then); the others give median, min and max, the
   checkpoint's size in MB and the write bandwidth (MB/s) to scale to another model. ``--quick`` replaces
   ResNet-50 by a 3.1 M-parameter Dense stand-in.

3. **Signal to exit** (``stop``), for real: the demo ``examples/train_keras.py --config
   examples/configs/digits_warmup_steps.yaml --epochs 8 --batch-size 8 --checkpoint-period 50`` under
   ``horovodrun -np 2 -H localhost:2 --gloo``; once ``OUT/ckpt/latest`` exists (the first periodic checkpoint),
   SIGTERM goes to horovodrun, which passes it on to the ranks (and SIGKILLs them 5 s later:
   ``GRACEFUL_TERMINATION_TIME_S`` in Horovod's ``safe_shell_exec``). Timed from the signal: the save's start
   (``meta.json``'s "time"), the arrival of rank 0's ``hvd_sched: SIGTERM: every rank stopped at iteration N ...;
   saved PATH in X s`` line (X: the save and the wait for it, read from the line), the end of each rank's process
   (watched directly, every 2 ms: horovodrun exits once one rank has ended with a non-zero status and does not
   always report the other), and horovodrun's exit. The slowest signal-to-last-rank-exit is compared with
   horovodrun's 5 s, Slurm's default ``KillWait`` (30 s) and Kubernetes' default ``terminationGracePeriodSeconds``
   (30 s).

Usage::

    python bench/preemption.py          # 30 rounds x 200 steps per variant at 1 and 2 ranks, 15/7 saves,
                                        # 3 stops; -> docs/bench/<date>_preemption_<row>.json and .md
    python bench/preemption.py --quick  # 2 rounds x 20 steps, 3/2 saves, a Dense stand-in for ResNet-50,
                                        # 1 stop; writes nothing unless --out/--raw-dir

The last line printed is one JSON object: ``{"ranks1": {variant: ratio of medians}, "ranks2": {...},
"save_median_s": {model: seconds}, "stop_median_s": seconds}``.
"""

import argparse
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import _common
import _fit
import overhead  # its MLP and data

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import hvd_sched._compat as _compat  # noqa: E402  (after sys.path and the log level are set; before Horovod)

KERAS_MAJOR = _compat.keras_major()
#: variant -> TrainingCheckpoint keyword arguments (None: no checkpoint callback).
VARIANTS = {
    "baseline": None,
    "checkpoint_no_signals": {"stop_signals": (), "peer_timeout": None},
    "heartbeat": {"stop_signals": (), "peer_timeout": 60.0},
    "checkpoint_default": {},
    "checkpoint_agree_every_step": {"agree_every": 1e-9},
}
REFERENCE = "baseline"
BOOTSTRAP_RESAMPLES = 10000
_BARRIER = "bench_barrier"

BASE_LR = overhead.BASE_LR
MOMENTUM = overhead.MOMENTUM
BATCH = overhead.BATCH
EPOCHS = 2  # per fit; the epoch ends (a checkpoint each) are outside the timed steps
SETTINGS = {
    "full": {"rounds": 30, "steps_per_epoch": 100, "save_reps": {"demo_mlp": 15, "large": 7}, "stops": 3},
    "quick": {"rounds": 2, "steps_per_epoch": 10, "save_reps": {"demo_mlp": 3, "large": 2}, "stops": 1},
}
#: The meta.json of a checkpoint saved inside an epoch, as TrainingCheckpoint writes it.
SAVE_META = {"epoch": 0, "step": 1, "steps_per_epoch": 2, "iteration": 1, "micro_batches": 1, "signal": None,
             "time": 0}

DEMO = pathlib.Path("examples") / "train_keras.py"
DEMO_CONFIG = pathlib.Path("examples") / "configs" / "digits_warmup_steps.yaml"
DEMO_PERIOD = 50
DEMO_ARGS = ["--config", DEMO_CONFIG, "--epochs", 8, "--batch-size", 8, "--checkpoint-period", DEMO_PERIOD]
#: Seconds between SIGTERM and SIGKILL: horovodrun (safe_shell_exec.GRACEFUL_TERMINATION_TIME_S, Horovod 0.28.1),
#: Slurm's KillWait default, Kubernetes' terminationGracePeriodSeconds default.
GRACE_S = {"horovodrun": 5.0, "slurm_killwait": 30.0, "kubernetes_termination_grace": 30.0}
_STOP_LINE = re.compile(r"hvd_sched: (?P<signal>SIG\w+): every rank stopped at iteration (?P<iteration>\d+) .*?"
                        r"saved (?P<path>\S+) in (?P<save_s>[0-9.]+) s; exiting with status (?P<status>\d+)")
_EXIT_LINE = re.compile(r"Process (?P<rank>\d+) exit with status code (?P<status>-?\d+)")


# ---------------------------------------------------------------------------------------------- worker side


def _solver():
    return {"BASE_LR": BASE_LR, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS_EPOCHS": [0, 1],
            "MAX_EPOCHS": EPOCHS, "WARM_UP_EPOCHS": 0.5, "WARM_UP_FACTOR": "horovod", "WARM_UP_METHOD": "linear",
            "SCALE_MOMENTUM": True, "SCALE_MOMENTUM_THRESHOLD": 1.1}


def _build(name, keras, schedule, directory):
    """(the MLP compiled for variant ``name``, its callbacks: ``horovod_callbacks(checkpoint=...)``)."""
    import hvd_sched.keras

    model = overhead._model(keras)  # the same weights on every rank (one seed)
    optimizer = hvd_sched.keras.DistributedOptimizer(hvd_sched.keras.ScheduledOptimizer(
        keras.optimizers.SGD(momentum=MOMENTUM), schedule, momentum_correction="threshold"))
    if KERAS_MAJOR == 2:
        optimizer.jit_compile = False  # explicit: a GPU machine turns it on by itself
    model.compile(optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    checkpoint = None if VARIANTS[name] is None else \
        hvd_sched.keras.TrainingCheckpoint(str(directory / name), **VARIANTS[name])
    return model, hvd_sched.keras.horovod_callbacks(checkpoint=checkpoint)  # the checkpoint last, as users


def _count_agreements(built, dataset, keras, steps_per_epoch, barrier):
    """One untimed fit per variant with ``_stop.agree`` counted: ``{variant: {"calls", "at_train_begin",
    "at_batch_end", "at_epoch_end", "proposals"}}`` (proposals: the iterations to the next agreement, rank 0's;
    where signals are handled, one agreement at train begin sets the allgather up outside Keras' batch timing, and
    one at each epoch end)."""
    from hvd_sched.keras import _stop

    original = _stop.agree
    counts = {}
    for name in built:
        proposals = []

        def counting(received, proposal, proposals=proposals):
            proposals.append(int(proposal))
            return original(received, proposal)

        _stop.agree = counting
        try:
            _fit.time_rounds({name: built[name]}, dataset, keras=keras, epochs=EPOCHS,
                             steps_per_epoch=steps_per_epoch, rounds=0, barrier=barrier)
        finally:
            _stop.agree = original
        signals = VARIANTS[name] is not None and VARIANTS[name].get("stop_signals", True) != ()
        epoch_ends, train_begin = (EPOCHS, 1) if signals else (0, 0)
        counts[name] = {"calls": len(proposals), "at_train_begin": train_begin, "at_epoch_end": epoch_ends,
                        "at_batch_end": len(proposals) - epoch_ends - train_begin,
                        "proposals": sorted(set(proposals))}
    return counts


def _step_times(args, hvd, tf, keras):
    import hvd_sched

    steps_per_epoch = args.steps_per_epoch
    schedule = hvd_sched.from_detectron(_solver(), steps_per_epoch=steps_per_epoch, world_size=hvd.size())
    dataset = overhead._data(tf)
    directory = pathlib.Path(args.checkpoint_dir)
    built = {name: _build(name, keras, schedule, directory) for name in VARIANTS}
    barrier_tensor = tf.constant(0.0)

    @tf.function
    def barrier():
        return hvd.allreduce(barrier_tensor, name=_BARRIER)

    handlers = [signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)]
    times = _fit.time_rounds(built, dataset, keras=keras, epochs=EPOCHS, steps_per_epoch=steps_per_epoch,
                             rounds=args.rounds, barrier=barrier)
    agreements = _count_agreements(built, dataset, keras, steps_per_epoch, barrier)
    checks = {
        # Every checkpoint variant wrote its epoch-end checkpoints (rank 0 writes); the baseline none.
        "epoch_checkpoints": {name: (directory / name / "latest").exists() == (VARIANTS[name] is not None)
                              for name in VARIANTS},
        # After fit the handlers are the ones before it again.
        "handlers_restored": handlers == [signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)],
    }
    return {"size": hvd.size(), "steps_per_round": EPOCHS * steps_per_epoch, "rounds": args.rounds,
            "seconds_per_step": times["wall"], "cpu_seconds_per_step": times["cpu"],
            "fit_seconds_per_step": times["fit"], "agreements": agreements, "checks": checks}


def _trained(model, keras, input_shape, classes):
    """``model`` compiled with SGD(momentum) and trained one step on a batch of 2 (slots and counter built)."""
    import numpy as np

    model.compile(keras.optimizers.SGD(0.01, momentum=MOMENTUM), loss="sparse_categorical_crossentropy")
    x = np.zeros((2, *input_shape), np.float32)
    model.train_on_batch(x, np.arange(2) % classes)
    return model


def _save_one(model, name, reps, root):
    """``reps`` timed ``write_checkpoint`` calls, each into a fresh folder (removed after, untimed)."""
    from hvd_sched.keras.checkpoint import write_checkpoint

    seconds, size = [], None
    for rep in range(reps + 1):  # rep 0: the first write (TensorFlow traces its save functions)
        directory = root / f"{name}-{rep}"
        started = time.perf_counter()
        path = write_checkpoint(str(directory), model, dict(SAVE_META), keep=3)
        seconds.append(time.perf_counter() - started)
        size = sum(entry.stat().st_size for entry in pathlib.Path(path).iterdir())
        shutil.rmtree(directory)
    warm = seconds[1:]
    stats = _common.summarise(warm)
    megabytes = size / 1e6
    return {"parameters": int(model.count_params()), "optimizer_variables": len(model.optimizer.variables),
            "size_mb": round(megabytes, 3), "first_s": round(seconds[0], 4), "median_s": round(stats["median"], 4),
            "min_s": round(stats["min"], 4), "max_s": round(max(warm), 4), "reps": len(warm),
            "mb_per_s": round(megabytes / stats["median"], 1), "seconds": [round(s, 5) for s in seconds]}


def _filesystem(path):
    """'ext4 on /dev/vda, mounted at /': where ``path`` is (``df -T``)."""
    try:
        output = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True, timeout=30,
                                check=False).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    # Filesystem Type 1K-blocks Used Available Use% Mounted on / device type ... mount point
    return f"{output[-6]} on {output[-7]}, mounted at {output[-1]}" if len(output) >= 14 else "unknown"


def _save_times(args, keras):
    """The demo's model and ResNet-50 (or, --quick, a Dense stand-in) written as TrainingCheckpoint writes."""
    sys.path.insert(0, str(_common.ROOT / "examples"))
    import train_keras

    root = pathlib.Path(args.checkpoint_dir) / "saves"
    root.mkdir(parents=True, exist_ok=True)
    results = {"filesystem": _filesystem(root)}
    keras.utils.set_random_seed(0)
    results["demo_mlp"] = {"model": "examples/train_keras.py build_model((64,), 10)",
                           **_save_one(_trained(train_keras.build_model((64,), 10), keras, (64,), 10), "demo_mlp",
                                       args.save_reps_mlp, root)}
    if args.quick:
        large = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(1024), keras.layers.Dense(1024),
                                  keras.layers.Dense(1000, activation="softmax")])
        description, shape = "Dense stand-in 1024-1024-1024-1000 (--quick: ResNet-50 skipped)", (1024,)
    else:
        large = keras.applications.ResNet50(weights=None)
        description, shape = "tf.keras.applications.ResNet50(weights=None)", (224, 224, 3)
    started = time.perf_counter()
    _trained(large, keras, shape, 1000)
    results["large"] = {"model": description, "build_and_step_s": round(time.perf_counter() - started, 1),
                        **_save_one(large, "large", args.save_reps_large, root)}
    return results


def worker(args):
    """Runs on every rank; rank 0 writes the result (the 1-rank run also times the saves)."""
    _common.limit_threads(1)
    import hvd_sched.keras  # noqa: F401  (before Horovod's Keras layer)
    import horovod.tensorflow as hvd
    import tensorflow as tf

    keras = tf.keras
    hvd.init()
    result = _step_times(args, hvd, tf, keras)
    if hvd.rank() != 0:
        return
    if args.saves:
        result["saves"] = _save_times(args, keras)
    _common.write_json(args.result, result)


# ---------------------------------------------------------------------------------------------- driver side


def _worker_args(setting, args, result, checkpoint_dir, saves):
    worker_args = ["--worker", "--rounds", setting["rounds"], "--steps-per-epoch", setting["steps_per_epoch"],
                   "--result", result, "--checkpoint-dir", checkpoint_dir,
                   "--save-reps-mlp", setting["save_reps"]["demo_mlp"],
                   "--save-reps-large", setting["save_reps"]["large"]]
    if saves:
        worker_args.append("--saves")
    if args.quick:
        worker_args.append("--quick")
    return worker_args


def _summary(raw, clock):
    seconds = raw[clock]
    table = {}
    for name in VARIANTS:
        row = _common.compare(seconds[name], seconds[REFERENCE], REFERENCE, None, BOOTSTRAP_RESAMPLES)
        table[name] = {**row, "verdict": "no target"}
    return table


def _read_lines(stream, label, lines):
    """Every line of ``stream`` with the monotonic time it arrived (split on \\n and \\r: Keras' progress bar)."""
    pending = b""
    while True:
        chunk = os.read(stream.fileno(), 65536)
        now = time.monotonic()
        if not chunk:
            break
        pending += chunk
        *complete, pending = re.split(rb"[\r\n]", pending)
        lines.extend((now, label, line.decode("utf-8", "replace")) for line in complete if line)
    if pending:
        lines.append((time.monotonic(), label, pending.decode("utf-8", "replace")))


def _ranks_of(pid):
    """``{rank: psutil.Process}`` of the demo's Python processes under horovodrun ``pid`` (HOROVOD_RANK)."""
    import psutil

    ranks = {}
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return ranks
    for process in descendants:
        try:
            command = process.cmdline()
            if command and os.path.basename(command[0]).startswith("python") and \
                    any(part.endswith(DEMO.name) for part in command):
                ranks[int(process.environ()["HOROVOD_RANK"])] = process
        except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, ValueError):
            continue
    return ranks


def _watch_exits(processes, gone, deadline):
    """Fill ``gone[rank]`` with the monotonic time each process ended (gone or a zombie), polled every 2 ms."""
    import psutil

    pending = dict(processes)
    while pending and time.monotonic() < deadline:
        for rank, process in list(pending.items()):
            try:
                alive = process.status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                alive = False
            if not alive:
                gone[rank] = time.monotonic()
                del pending[rank]
        time.sleep(0.002)


def _stop_once(out, timeout):
    """One demo under horovodrun, SIGTERM to horovodrun once its first checkpoint exists; times from the signal.

    horovodrun exits as soon as one rank has exited with a non-zero status (it may not report the other), so the
    ranks' exits are watched directly (their processes, found by HOROVOD_RANK in their environment).
    """
    cmd = _common.horovodrun_cmd(2, _common.ROOT / DEMO, [*DEMO_ARGS, "--out", out])
    lines = []
    started = time.monotonic()
    # Its own session: on a failure here the whole job goes with one signal to its group.
    proc = subprocess.Popen(cmd, cwd=_common.ROOT, env=_common.worker_env(threads=1), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    readers = [threading.Thread(target=_read_lines, args=(stream, label, lines), daemon=True)
               for stream, label in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))]
    for reader in readers:
        reader.start()
    latest = pathlib.Path(out) / "ckpt" / "latest"
    gone = {}
    try:
        while not latest.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"the demo exited ({proc.returncode}) before its first checkpoint:\n" +
                                   "\n".join(text for _, _, text in lines[-40:]))
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"no checkpoint in {out} after {timeout} s")
            time.sleep(0.005)
        ready = time.monotonic()
        first = latest.read_text().strip()
        ranks = _ranks_of(proc.pid)
        if sorted(ranks) != [0, 1]:
            raise RuntimeError(f"expected the demo's ranks 0 and 1 under horovodrun, found {sorted(ranks)}")
        load = _common.loadavg()
        signalled_wall = time.time()
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        watcher = threading.Thread(target=_watch_exits, args=(ranks, gone, signalled + 120), daemon=True)
        watcher.start()
        returncode = proc.wait(timeout=120)
        exited = time.monotonic()
        watcher.join(timeout=130)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for reader in readers:
        reader.join(timeout=10)
    stop = next(((t, _STOP_LINE.search(text)) for t, label, text in lines
                 if label == "stderr" and _STOP_LINE.search(text)), None)
    statuses = {m["rank"]: int(m["status"]) for _, _, text in lines for m in [_EXIT_LINE.search(text)] if m}
    if stop is None or sorted(gone) != [0, 1]:
        raise RuntimeError(f"the demo's output lacks the stop line, or ranks {sorted(set(ranks) - set(gone))} did "
                           "not exit within 120 s:\n" + "\n".join(text for _, _, text in lines[-40:]))
    stop_time, match = stop
    meta = json.loads((pathlib.Path(match["path"]) / "meta.json").read_text())
    return {
        "startup_to_first_checkpoint_s": round(ready - started, 2),
        "first_checkpoint": first,
        "loadavg_at_signal": load,
        "stopped_at_iteration": int(match["iteration"]),
        "stopped_at_epoch_end": os.path.basename(match["path"]).startswith("epoch-"),
        "iterations_after_first_checkpoint": int(match["iteration"]) - DEMO_PERIOD,
        "signal_to_save_start_s": round(meta["time"] - signalled_wall, 3),
        "save_s_reported": float(match["save_s"]),
        "signal_to_stop_line_s": round(stop_time - signalled, 3),
        "stop_line_to_last_rank_exit_s": round(max(gone.values()) - stop_time, 3),
        "signal_to_rank_exit_s": {str(rank): round(gone[rank] - signalled, 3) for rank in sorted(gone)},
        "signal_to_last_rank_exit_s": round(max(gone.values()) - signalled, 3),
        # horovodrun prints "Process i exit with status code N." for the ranks it saw end (not always both).
        "rank_status_reported": statuses,
        "signal_to_horovodrun_exit_s": round(exited - signalled, 3),
        "horovodrun_status": returncode,
        "checkpoint": {"path": os.path.basename(match["path"]), "signal": meta.get("signal"),
                       "iteration": meta.get("iteration"), "latest": latest.read_text().strip(),
                       "size_mb": round(sum(p.stat().st_size for p in pathlib.Path(match["path"]).iterdir()) / 1e6,
                                        3)},
    }


def _stop_summary(runs):
    keys = ("signal_to_save_start_s", "save_s_reported", "signal_to_stop_line_s", "stop_line_to_last_rank_exit_s",
            "signal_to_last_rank_exit_s", "signal_to_horovodrun_exit_s")
    summary = {key: {"median": round(_common.summarise([r[key] for r in runs])["median"], 3),
                     "min": min(r[key] for r in runs), "max": max(r[key] for r in runs)} for key in keys}
    worst = summary["signal_to_last_rank_exit_s"]["max"]
    summary["grace"] = {name: {"grace_s": grace, "worst_signal_to_last_rank_exit_s": worst,
                               "margin_s": round(grace - worst, 3), "fits": worst < grace}
                        for name, grace in GRACE_S.items()}
    # Every stop left `latest` at the iteration it stopped at: a checkpoint written for the signal, or (a signal
    # that came near an epoch end, agreed on there) that epoch's checkpoint.
    summary["all_saved_where_stopped"] = all(
        r["checkpoint"]["latest"] == r["checkpoint"]["path"] and r["checkpoint"]["iteration"] ==
        r["stopped_at_iteration"] and (r["checkpoint"]["signal"] == "SIGTERM" or r["stopped_at_epoch_end"])
        for r in runs)
    summary["rank_status_reported"] = sorted({s for r in runs for s in r["rank_status_reported"].values()})
    return summary


def _budget(large):
    """How large a checkpoint the write bandwidth of ``large`` fits into each grace period (no exit time)."""
    return {name: round(grace * large["mb_per_s"] / 1e3, 2) for name, grace in GRACE_S.items()}


def _lines(report, setting, quick):
    machine, durations, loads = report["machine"], report["durations_s"], report["loadavg"]
    lines = [f"`{report['command']}` ({machine.get('stack_row')}, Keras {KERAS_MAJOR}), {machine['date']}, "
             f"{durations['total_s']:.0f} s, 1-min load average {loads['start'][0]} -> {loads['after_ranks1'][0]} "
             f"(after 1 rank) -> {loads['after_ranks2'][0]} (after 2 ranks) -> {loads['end'][0]} (end)", ""]
    steps = EPOCHS * setting["steps_per_epoch"]
    for key, title in (("ranks1", "1 rank"), ("ranks2", "2 ranks (horovodrun -np 2 --gloo)")):
        for clock, tables in (("wall time", report), ("process CPU time", report["cpu"])):
            lines += _common.comparison_table(f"{title}, {clock}: {setting['rounds']} rounds x {steps} steps per "
                                              "variant", tables[key])
    lines.append(f"Agreements per fit of {steps} steps (`_stop.agree` calls: at train begin + at batch ends + at "
                 "epoch ends; the intervals rank 0 proposed):")
    for key in ("ranks1", "ranks2"):
        lines += [f"- {key}, {name}: {row['at_train_begin']} + {row['at_batch_end']} + {row['at_epoch_end']}, "
                  f"proposals {row['proposals']}"
                  for name, row in report["agreements"][key].items() if VARIANTS[name] is not None]
    saves = report["saves"]
    lines += ["", f"**Save time** (`write_checkpoint`, a fresh folder each time; {saves['filesystem']})", "",
              "| model | parameters | checkpoint MB | first write s | median s [min, max] (n) | MB/s (median) |",
              "|---|---:|---:|---:|---:|---:|"]
    for key in ("demo_mlp", "large"):
        row = saves[key]
        lines.append(f"| {row['model']} | {row['parameters']:,} | {row['size_mb']:.3f} | {row['first_s']:.3f} | "
                     f"{row['median_s']:.3f} [{row['min_s']:.3f}, {row['max_s']:.3f}] ({row['reps']}) | "
                     f"{row['mb_per_s']:.1f} |")
    lines.append(f"\nAt {saves['large']['mb_per_s']:.0f} MB/s a grace period holds the write of a checkpoint of "
                 + ", ".join(f"{gb} GB ({name})" for name, gb in report["budget_gb"].items())
                 + " (the write alone; add the agreement wait and the process exit below).")
    stop = report["stop"]
    lines += ["", f"**Signal to exit** (the demo under `horovodrun -np 2 --gloo`, SIGTERM to horovodrun once "
              f"`OUT/ckpt/latest` exists; {len(stop['runs'])} runs)", "",
              "| run | stopped at iteration | signal -> save start s | save s (rank 0's line) | signal -> stop line s "
              "| stop line -> last rank exit s | signal -> rank 0, rank 1 exit s | signal -> horovodrun exit s "
              "| statuses (as horovodrun reported them) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for index, run in enumerate(stop["runs"]):
        lines.append(f"| {index + 1} | {run['stopped_at_iteration']} | {run['signal_to_save_start_s']:.3f} | "
                     f"{run['save_s_reported']:.2f} | {run['signal_to_stop_line_s']:.3f} | "
                     f"{run['stop_line_to_last_rank_exit_s']:.3f} | "
                     f"{', '.join(f'{s:.2f}' for s in run['signal_to_rank_exit_s'].values())} | "
                     f"{run['signal_to_horovodrun_exit_s']:.3f} | ranks {run['rank_status_reported']}, "
                     f"horovodrun {run['horovodrun_status']} |")
    summary = stop["summary"]
    lines.append("")
    lines += [f"- against {name} ({row['grace_s']:g} s): the slowest signal -> last rank exit "
              f"{row['worst_signal_to_last_rank_exit_s']:.2f} s, margin {row['margin_s']:.2f} s"
              for name, row in summary["grace"].items()]
    lines.append(f"- every stop left `latest` at the iteration it stopped at (a signal's checkpoint, or an epoch "
                 f"end's where the ranks agreed there): {summary['all_saved_where_stopped']}")
    if quick:
        lines.append("\n(--quick: a few rounds and repetitions, a Dense stand-in for ResNet-50: the form, not figures)")
    return lines


def driver(args):
    setting = json.loads(json.dumps(SETTINGS["quick" if args.quick else "full"]))
    for name in ("rounds", "steps_per_epoch", "stops"):
        if getattr(args, name) is not None:
            setting[name] = getattr(args, name)
    script = pathlib.Path(__file__).resolve()
    env = _common.worker_env(threads=1)
    durations, loads = {}, {"start": _common.loadavg()}
    machine = _common.machine()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hvd_sched_preemption_") as tmp:
        tmp = pathlib.Path(tmp)
        raw1, raw2 = tmp / "ranks1.json", tmp / "ranks2.json"
        durations["ranks1_and_saves_s"], _ = _common.run_checked(
            [sys.executable, str(script), *map(str, _worker_args(setting, args, raw1, tmp / "ckpt1", True))], env,
            args.timeout, "the 1-rank run")
        loads["after_ranks1"] = _common.loadavg()
        durations["ranks2_s"], _ = _common.run_checked(
            _common.horovodrun_cmd(2, script, _worker_args(setting, args, raw2, tmp / "ckpt2", False)), env,
            args.timeout, "the 2-rank run")
        loads["after_ranks2"] = _common.loadavg()
        raws = {"ranks1": json.loads(raw1.read_text()), "ranks2": json.loads(raw2.read_text())}
        stop_started = time.perf_counter()
        runs = [_stop_once(tmp / f"demo{index}", args.timeout) for index in range(setting["stops"])]
        durations["stops_s"] = time.perf_counter() - stop_started
    loads["end"] = _common.loadavg()
    durations["total_s"] = time.perf_counter() - started
    row = machine.get("stack_row", "unknown")
    saves = raws["ranks1"]["saves"]
    report = {
        "machine": machine,
        "command": _common.command_line(row, "preemption.py", args.quick),
        "keras_major": KERAS_MAJOR,
        "settings": {**setting, "epochs_per_fit": EPOCHS, "steps_per_fit": EPOCHS * setting["steps_per_epoch"],
                     "batch": BATCH, "model": "MLP 32-64-2", "threads_per_process": 1,
                     "variants": {name: kwargs for name, kwargs in VARIANTS.items()}, "reference": REFERENCE,
                     "bootstrap_resamples": BOOTSTRAP_RESAMPLES, "save_meta": SAVE_META,
                     "demo": ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", "python", str(DEMO),
                              *map(str, DEMO_ARGS), "--out", "TMP"], "grace_s": GRACE_S},
        "durations_s": {key: round(value, 1) for key, value in durations.items()},
        "loadavg": loads,
        "ranks1": _summary(raws["ranks1"], "seconds_per_step"),
        "ranks2": _summary(raws["ranks2"], "seconds_per_step"),
        "cpu": {key: _summary(raws[key], "cpu_seconds_per_step") for key in raws},
        "agreements": {key: raws[key]["agreements"] for key in raws},
        "checks": {key: raws[key]["checks"] for key in raws},
        "saves": saves,
        "budget_gb": _budget(saves["large"]),
        "stop": {"runs": runs, "summary": _stop_summary(runs)},
        "seconds_per_step": {key: raws[key]["seconds_per_step"] for key in raws},
        "cpu_seconds_per_step": {key: raws[key]["cpu_seconds_per_step"] for key in raws},
        "fit_seconds_per_step": {key: raws[key]["fit_seconds_per_step"] for key in raws},
    }
    lines = _lines(report, setting, args.quick)
    print("\n".join(lines))
    print(f"took {durations['total_s']:.0f} s ({report['durations_s']}); load averages {loads}")
    _common.write_report(report, lines, f"preemption_{row}", args)
    print(json.dumps({**{key: {name: r["ratio_median"] for name, r in report[key].items()}
                         for key in ("ranks1", "ranks2")},
                      "save_median_s": {key: saves[key]["median_s"] for key in ("demo_mlp", "large")},
                      "stop_median_s": report["stop"]["summary"]["signal_to_horovodrun_exit_s"]["median"]}))
    checks_pass = all(all(c["epoch_checkpoints"].values()) and c["handlers_restored"]
                      for c in report["checks"].values()) and report["stop"]["summary"]["all_saved_where_stopped"]
    return 0 if checks_pass else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="2 rounds x 20 steps, a few saves, a Dense stand-in for ResNet-50, 1 stop (< 1 min)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per variant")
    parser.add_argument("--steps-per-epoch", type=int, default=None, help=f"steps per epoch; a fit is {EPOCHS}")
    parser.add_argument("--stops", type=int, default=None, help="demo runs stopped by SIGTERM")
    _common.add_output_arguments(parser, "preemption")
    parser.add_argument("--checkpoint-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--saves", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--save-reps-mlp", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--save-reps-large", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("rounds", "steps_per_epoch", "stops"):
        value = getattr(args, name)
        if value is not None and value < 1 and not args.worker:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.worker:
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
