"""Benchmark: the optimizer's ``apply_gradients`` alone, many steps in one compiled loop (low noise; not a test).

``model.fit`` on a tiny model jitters by more than the cost being measured (issue 19: two runs of the same
comparison gave 1.05x and 1.15x). Here each variant is ONE ``tf.function`` whose body is
``for _ in tf.range(steps): optimizer.apply_gradients(zip(grads, variables))`` on fixed gradients for the
variables of ``bench/overhead.py``'s MLP (32-64-2: 4 variables, 2,242 weights). A call runs ``steps`` (2,000)
updates with no Python, no data and no model in between, so what is timed is the optimizer's graph: the update,
the LR schedule and the momentum correction. Before each call ``optimizer.iterations`` is reset to 0, so every
call runs the whole schedule, corrections included.

Variants (all ``SGD(momentum=0.9)``; the schedule is linear warmup over the first tenth from half the LR, then
steps to 1/10 and 1/100 at 1/2 and 3/4 of the loop, momentum correction with Detectron's threshold rule):

- ``baseline``: constant LR (the reference);
- ``baseline_copy``: a second, identical constant-LR optimizer: its ratio to ``baseline`` is the noise floor;
- ``keras_schedule``: Keras' ``PiecewiseConstantDecay`` at the same steps (no warmup, no correction);
- ``hvd_sched_lr_only``: ``SGD(learning_rate=hvd_sched.keras.ScheduleLR(schedule))``: hvd_sched's in-graph LR,
  no correction (diagnostic: splits the cost into LR and correction);
- ``hvd_sched_no_correction``: ``ScheduledOptimizer(..., momentum_correction="off")`` (diagnostic);
- ``hvd_sched_optimizer``: ``hvd_sched.keras.ScheduledOptimizer(SGD(momentum=0.9), schedule,
  momentum_correction="threshold")``;
- Keras 2 only: ``baseline_xla`` and ``hvd_sched_optimizer_xla``, the same with ``opt.jit_compile = True`` (each
  variable's update in Keras' ``_update_step_xla``, as on a GPU); ``hvd_sched_optimizer_xla``'s reference is
  ``baseline_xla``. Keras 3 has no per-variable XLA update: n/a.

Method: every variant is traced and run once untimed; then for R rounds every variant runs once, in a shuffled
order per round. Each call is timed in process CPU time (``time.process_time``: every thread of the process, so
not inflated while another job holds the core: the headline on a shared machine) and in wall time. Ratios of
medians over rounds (and the other statistics of ``_common.compare``), with 95%
bootstrap intervals over rounds resampled jointly, and the extra microseconds per step (difference of
medians), the figure that matters next to a GPU step of tens of ms. Target (``TARGET``): the scheduled optimizer
within 1.02x of its constant-LR reference. Here the denominator is the update alone (no forward or backward
pass), so a ratio is far larger than in a training step; the microseconds are what carry over.
Checks, stored with the result: every function traced once, ``iterations`` equal to ``steps`` after a call, and
the LR at the end equal to ``schedule.lr_at(steps)`` for the scheduled variants. One TensorFlow thread.

Usage::

    python bench/apply_loop.py           # 40 rounds x 2,000 steps -> docs/bench/<date>_apply_loop_<row>.json and .md
    python bench/apply_loop.py --quick   # 4 rounds x 200 steps; writes nothing unless --out

The last line printed is one JSON object mapping each measured row to its ratio of medians (CPU time).
"""

import argparse
import json
import os
import sys
import time

import _common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import hvd_sched._compat as _compat  # noqa: E402  (after sys.path and the log level are set)

KERAS_MAJOR = _compat.keras_major()
TARGET = 1.02
BASE_LR = 0.05
MOMENTUM = 0.9
GAMMA = 0.1
WARMUP_FACTOR = 0.5
VARIANTS = ("baseline", "baseline_copy", "keras_schedule", "hvd_sched_lr_only", "hvd_sched_no_correction",
            "hvd_sched_optimizer") + (("baseline_xla", "hvd_sched_optimizer_xla") if KERAS_MAJOR == 2 else ())
NOT_APPLICABLE = {} if KERAS_MAJOR == 2 else {
    name: "Keras 3 optimizers have no per-variable XLA update (Keras 2's _update_step_xla, on by default on a "
          "GPU); Keras 3's only XLA is the whole train step" for name in ("baseline_xla", "hvd_sched_optimizer_xla")}
REFERENCE = {name: "baseline_xla" if name.endswith("_xla") else "baseline" for name in VARIANTS}
TARGETS = {name: TARGET for name in VARIANTS if name.startswith("hvd_sched_optimizer")}
#: Rows beyond "variant / its reference": the price of the per-variable XLA update itself on this CPU.
EXTRA_ROWS = {"baseline_xla_vs_baseline": ("baseline_xla", "baseline")} if KERAS_MAJOR == 2 else {}
SETTINGS = {"full": {"rounds": 40, "steps": 2000}, "quick": {"rounds": 4, "steps": 200}}


def solver(steps):
    """Warmup over the first tenth, decays at 1/2 and 3/4, Detectron's momentum correction (threshold 1.1)."""
    return {"BASE_LR": BASE_LR, "LR_POLICY": "steps_with_decay", "GAMMA": GAMMA,
            "STEPS": [0, steps // 2, steps * 3 // 4], "MAX_ITER": steps, "WARM_UP_ITERS": max(steps // 10, 1),
            "WARM_UP_FACTOR": WARMUP_FACTOR, "WARM_UP_METHOD": "linear", "SCALE_MOMENTUM": True,
            "SCALE_MOMENTUM_THRESHOLD": 1.1}


def _optimizer(name, keras, schedule, steps):
    import hvd_sched.keras

    sgd = keras.optimizers.SGD
    base = name.removesuffix("_xla")
    if base in ("baseline", "baseline_copy"):
        optimizer = sgd(BASE_LR, momentum=MOMENTUM)
    elif base == "keras_schedule":
        boundaries = [steps // 2, steps * 3 // 4]
        lr = keras.optimizers.schedules.PiecewiseConstantDecay(boundaries, [BASE_LR, BASE_LR * GAMMA,
                                                                            BASE_LR * GAMMA ** 2])
        optimizer = sgd(lr, momentum=MOMENTUM)
    elif base == "hvd_sched_lr_only":
        optimizer = sgd(hvd_sched.keras.ScheduleLR(schedule), momentum=MOMENTUM)
    elif base == "hvd_sched_no_correction":
        optimizer = hvd_sched.keras.ScheduledOptimizer(sgd(momentum=MOMENTUM), schedule, momentum_correction="off")
    elif base == "hvd_sched_optimizer":
        optimizer = hvd_sched.keras.ScheduledOptimizer(sgd(momentum=MOMENTUM), schedule,
                                                       momentum_correction="threshold")
    else:
        raise ValueError(f"unknown variant {name!r}; expected one of {VARIANTS}")
    if KERAS_MAJOR == 2:
        optimizer.jit_compile = name.endswith("_xla")  # explicit: a GPU machine turns it on by itself
    return optimizer


def _loop(tf, optimizer, grads, variables, steps):
    """One compiled function: `steps` updates in a tf.range loop; returns the iterations after it."""

    @tf.function
    def run():
        for _ in tf.range(steps):
            optimizer.apply_gradients(zip(grads, variables))
        return tf.identity(optimizer.iterations)

    return run


def measure(args):
    """Build, trace and time every variant in this process; return the raw figures."""
    import numpy as np

    _common.limit_threads(1)
    import tensorflow as tf

    import hvd_sched
    import hvd_sched.keras
    from _fit import current_lr

    keras = tf.keras
    steps = args.steps
    schedule = hvd_sched.from_detectron(solver(steps))
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(2)])
    variables = list(model.trainable_variables)
    rng = np.random.default_rng(0)
    # Small fixed gradients: the weights drift by ~1 per call, far from overflow or subnormals.
    grads = [tf.constant(rng.normal(size=tuple(v.shape)).astype(np.float32) * 1e-3) for v in variables]
    optimizers, loops, trace_s = {}, {}, {}
    for name in VARIANTS:
        optimizer = _optimizer(name, keras, schedule, steps)
        optimizer.apply_gradients(zip(grads, variables))  # builds the slots eagerly, outside the loop
        optimizers[name] = optimizer
        loops[name] = _loop(tf, optimizer, grads, variables, steps)
        optimizer.iterations.assign(0)
        started = time.perf_counter()
        loops[name]()
        trace_s[name] = round(time.perf_counter() - started, 3)
    times = {name: [] for name in VARIANTS}
    cpu_times = {name: [] for name in VARIANTS}
    order = np.random.default_rng(1234)
    checks = {"iterations": {}, "final_lr": {}}
    for _ in range(args.rounds):
        for name in map(str, order.permutation(VARIANTS)):
            optimizers[name].iterations.assign(0)
            started, cpu_started = time.perf_counter(), time.process_time()
            iterations = loops[name]()
            iterations = int(iterations.numpy())  # the value is ready: the loop has run
            times[name].append((time.perf_counter() - started) / steps)
            cpu_times[name].append((time.process_time() - cpu_started) / steps)
            checks["iterations"][name] = iterations
    for name in VARIANTS:
        checks["final_lr"][name] = current_lr(optimizers[name])
    tracing = {name: int(loops[name].experimental_get_tracing_count()) for name in VARIANTS}
    graph_ops = {name: loop_graph_ops(loops[name]) for name in VARIANTS}
    expected_lr = float(np.float32(schedule.lr_at(steps)))
    scheduled = [name for name in VARIANTS if not name.startswith("baseline")]
    ok = (all(count == 1 for count in tracing.values())
          and all(checks["iterations"][name] == steps for name in VARIANTS)
          and all(abs(checks["final_lr"][name] - expected_lr) <= 1e-7 for name in scheduled)
          and all(checks["final_lr"][name] == np.float32(BASE_LR) for name in VARIANTS if name not in scheduled))
    return {"seconds_per_step": times, "cpu_seconds_per_step": cpu_times, "trace_and_first_call_s": trace_s,
            "tracing_count": tracing, "graph_ops_per_step": graph_ops,
            "checks": {**checks, "expected_final_lr": expected_lr, "passed": bool(ok)},
            "schedule": schedule.get_config(), "momentum_corrections": schedule.momentum_corrections(steps + 1),
            "variables": {variable_path(v): list(v.shape) for v in variables}}


def loop_graph_ops(function):
    """Graph nodes run per step: the loop body's, and those of the functions it calls (Keras 2's per-variable XLA
    update is one such function per variable). A deterministic companion to the timings."""
    library = function.get_concrete_function().graph.as_graph_def().library.function
    body = [f for f in library if "while_body" in f.signature.name]
    others = [f for f in library if "while_body" not in f.signature.name and "while_cond" not in f.signature.name]
    return {"loop_body": sum(len(f.node_def) for f in body), "called_functions": sum(len(f.node_def) for f in others)}


def variable_path(variable):
    return getattr(variable, "path", None) or variable.name


def summarise(seconds):
    """Every variant against its reference, the EXTRA_ROWS, the n/a rows (one clock's ``{name: [per round]}``)."""
    table = {name: _common.compare(seconds[name], seconds[REFERENCE[name]], REFERENCE[name], TARGETS.get(name))
             for name in VARIANTS}
    for row, (variant, reference) in EXTRA_ROWS.items():
        table[row] = _common.compare(seconds[variant], seconds[reference], reference)
    table["baseline_copy"]["note"] = "A/A: two identical optimizers; the spread of this row is the noise floor"
    for name, reason in NOT_APPLICABLE.items():
        table[name] = {"reference": REFERENCE.get(name, "baseline_xla"), "not_applicable": reason}
    return table


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 rounds x 200 steps (well under a minute)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (one call per variant each)")
    parser.add_argument("--steps", type=int, default=None, help="updates per call of a variant's loop")
    _common.add_output_arguments(parser, "apply_loop", workers=False)
    args = parser.parse_args(argv)
    setting = dict(SETTINGS["quick" if args.quick else "full"])
    for name in ("rounds", "steps"):
        value = getattr(args, name)
        if value is not None:
            if value < (1 if name == "rounds" else 20):
                parser.error(f"--{name} must be >= {1 if name == 'rounds' else 20}, got {value}")
            setting[name] = value
    args.rounds, args.steps = setting["rounds"], setting["steps"]
    loads = {"start": _common.loadavg()}
    machine = _common.machine()
    started = time.perf_counter()
    raw = measure(args)
    duration = time.perf_counter() - started
    loads["end"] = _common.loadavg()
    summaries = {clock: summarise(raw[clock]) for clock in ("cpu_seconds_per_step", "seconds_per_step")}
    row = machine.get("stack_row", "unknown")
    command = _common.command_line(row, "apply_loop.py", args.quick)
    report = {"machine": machine, "command": command, "keras_major": KERAS_MAJOR,
              "settings": {**setting, "model_variables": "MLP 32-64-2 (4 variables)", "threads_per_process": 1,
                           "base_lr": BASE_LR, "momentum": MOMENTUM, "solver": solver(setting["steps"]),
                           "target": TARGET},
              "duration_s": round(duration, 1), "loadavg": loads, "summary": summaries["cpu_seconds_per_step"],
              "summary_wall": summaries["seconds_per_step"],
              "not_applicable": NOT_APPLICABLE, **raw}
    lines = [f"`{command}` ({row}, Keras {KERAS_MAJOR}), {machine['date']}, {duration:.0f} s, 1-min load average "
             f"{loads['start'][0]} -> {loads['end'][0]}; checks passed: {raw['checks']['passed']}", ""]
    for clock, title in (("cpu_seconds_per_step", "process CPU time (the headline)"),
                         ("seconds_per_step", "wall time")):
        lines += _common.comparison_table(f"apply_gradients in a compiled loop, {title}: {setting['rounds']} rounds "
                                          f"x {setting['steps']} steps per variant", summaries[clock], unit="us")
    lines.append("Graph nodes per step (loop body + functions it calls): " + ", ".join(
        f"{name} {ops['loop_body']} + {ops['called_functions']}" for name, ops in raw["graph_ops_per_step"].items()))
    print("\n".join(lines))
    _common.write_report(report, lines, f"apply_loop_{row}", args)
    print(json.dumps({name: r["ratio_median"] for name, r in summaries["cpu_seconds_per_step"].items()
                      if "not_applicable" not in r}))
    return 0 if raw["checks"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
