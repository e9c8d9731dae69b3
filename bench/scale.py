"""Benchmark: the cost of a schedule against its length (MAX_ITER), from the config to the first ``fit`` step.

For ``steps_with_decay`` (STEPS at 0, 2/3 and 8/9 of MAX_ITER) and ``cosine_decay`` at MAX_ITER 1e4, 1e6, 1e8 and
1e9, each case runs in a fresh Python process and measures:

- ``schedule_s``: ``hvd_sched.from_detectron(solver)``;
- ``corrections_s``: ``schedule.momentum_corrections(MAX_ITER + 1)`` (how many it finds is recorded too);
- ``fit_s``: ``hvd_sched.keras.ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule)``, compiling
  a tiny Keras model (MLP 8-16-2, batch 16) with it and its first ``fit`` step (tracing included);
- ``graphdef_bytes`` / ``graphdef_nodes``: ``ByteSize()`` and node count of the compiled train step's GraphDef
  (the concrete function of ``model.train_function`` that ``fit`` traced);
- ``peak_rss_mb``: the process's ``VmHWM`` (``/proc/self/status``; ``ru_maxrss`` where that is missing) at the
  end, TensorFlow's import included (``import_rss_mb`` is the same right after importing TensorFlow);
- ``show_s`` / ``show_rc`` / ``show_peak_rss_mb``: ``hvd-sched show CONFIG`` run as a command on a YAML file in a
  temporary directory, its wall time, exit status and peak RSS (``RUSAGE_CHILDREN`` of the case process, whose
  only child it is).

``cosine_decay`` above MAX_ITER ~2e8 is rejected by ``from_detectron``: float64 rounds the LR to 0 before MAX_ITER.
Its largest row is the largest MAX_ITER that ``from_detectron`` accepts, found by bisection between 1e8 and 1e9
(it accepts that value and rejects the next); the JSON records the value and the message for 1e9.

Every case is repeated ``--repeats`` times, the cases interleaved in a shuffled order per repeat (a burst of load
from elsewhere then hits one repeat of every size rather than one size). Ratios are against the 1e4 row of the
same policy in the same run: ratio of medians over repeats, with a 95% bootstrap interval (the repeats of each
size resampled independently; fresh processes, so there is no pairing). Targets: at the largest MAX_ITER,
``fit_s`` and ``show_s`` within 1.1x and peak RSS within +50 MB of 1e4.

Usage::

    python bench/scale.py            # 4 sizes x 2 policies x 5 repeats -> docs/bench/<date>_scale.json + .md
    python bench/scale.py --quick    # 1e4 and the largest size, 1 repeat; writes nothing unless --out

The last line printed is one JSON object ``{policy: {max_iter: {"fit_s": ratio, "show_s": ratio,
"peak_rss_mb_delta": MB}}}`` against the 1e4 row.
"""

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import _common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

POLICIES = ("steps_with_decay", "cosine_decay")
SIZES = (10 ** 4, 10 ** 6, 10 ** 8, 10 ** 9)
QUICK_SIZES = (10 ** 4, 10 ** 9)
BASE_LR = 0.1
TARGET_TIME_RATIO = 1.1
TARGET_RSS_DELTA_MB = 50.0
BOOTSTRAP_RESAMPLES = 10000


def solver(policy, max_iter):
    """The SOLVER section of one case (Detectron keys)."""
    if policy == "steps_with_decay":
        return {"BASE_LR": BASE_LR, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "MAX_ITER": max_iter,
                "STEPS": [0, max_iter * 2 // 3, max_iter * 8 // 9]}
    if policy == "cosine_decay":
        return {"BASE_LR": BASE_LR, "LR_POLICY": "cosine_decay", "MAX_ITER": max_iter}
    raise ValueError(f"unknown policy {policy!r}; expected one of {POLICIES}")


def largest_valid_max_iter(policy, low, high):
    """(the MAX_ITER used for ``high``, the error for ``high`` or None): ``high`` itself when it is valid, else
    the largest value in ``[low, high)`` that ``from_detectron`` accepts with the next one rejected (bisection)."""
    import hvd_sched

    def valid(max_iter):
        try:
            hvd_sched.from_detectron(solver(policy, max_iter))
        except ValueError as error:
            return str(error)
        return None

    error = valid(high)
    if error is None:
        return high, None
    if valid(low) is not None:
        raise ValueError(f"{policy} rejects MAX_ITER={low} too: {valid(low)}")
    while high - low > 1:
        middle = (low + high) // 2
        if valid(middle) is None:
            low = middle
        else:
            high = middle
    return low, error


# ---------------------------------------------------------------------------------------------- case side


def _peak_rss_mb():
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def case(args):
    """One case in this (fresh) process; prints one JSON line."""
    import yaml

    policy, max_iter = args.policy, args.max_iter
    result = {"policy": policy, "max_iter": max_iter}
    with tempfile.TemporaryDirectory(prefix="hvd_sched_scale_") as tmp:  # first: the only child of this process
        config = pathlib.Path(tmp) / "solver.yaml"
        config.write_text(yaml.safe_dump({"SOLVER": solver(policy, max_iter)}))
        command = [str(pathlib.Path(sys.executable).with_name("hvd-sched")), "show", str(config)]
        started = time.perf_counter()
        try:
            shown = subprocess.run(command, capture_output=True, text=True, timeout=args.show_timeout, check=False)
            result["show_rc"] = shown.returncode
            result["show_stdout_lines"] = len(shown.stdout.splitlines())
            result["show_stderr_tail"] = shown.stderr[-2000:]
        except subprocess.TimeoutExpired:
            result["show_rc"] = "timeout"
        result["show_s"] = time.perf_counter() - started
        result["show_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024

    _common.limit_threads(1)
    import tensorflow as tf

    import hvd_sched
    import hvd_sched.keras

    result["import_rss_mb"] = _peak_rss_mb()
    started = time.perf_counter()
    schedule = hvd_sched.from_detectron(solver(policy, max_iter))
    result["schedule_s"] = time.perf_counter() - started
    started = time.perf_counter()
    corrections = schedule.momentum_corrections(max_iter + 1)
    result["corrections_s"] = time.perf_counter() - started
    result["corrections"] = len(corrections)
    result["schedule_rss_mb"] = _peak_rss_mb()

    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    tf.keras.utils.set_random_seed(0)
    started = time.perf_counter()
    optimizer = hvd_sched.keras.ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule)
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    model.compile(optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=16, epochs=1, steps_per_epoch=1, verbose=0)
    result["fit_s"] = time.perf_counter() - started
    result["lr_after_step"] = float(np.asarray(optimizer.learning_rate))
    result["lr_at_0"] = float(np.float32(schedule.lr_at(0)))  # the LR the first step used
    functions = _traced_functions(model.train_function)  # the step(s) fit traced
    graphs = [function.graph.as_graph_def() for function in functions]
    result["graphdef_bytes"] = max(graph.ByteSize() for graph in graphs)
    result["graphdef_nodes"] = max(len(graph.node) + sum(len(f.node_def) for f in graph.library.function)
                                   for graph in graphs)
    result["peak_rss_mb"] = _peak_rss_mb()
    print(json.dumps(result))


def _traced_functions(train_function):
    """The concrete functions `fit` traced: Keras 2's train_function is a tf.function; Keras 3's is a Python
    function calling tf.functions it holds in its closure."""
    if hasattr(train_function, "_list_all_concrete_functions"):
        return train_function._list_all_concrete_functions()
    functions = []
    for cell in train_function.__closure__ or ():
        inner = cell.cell_contents
        if hasattr(inner, "_list_all_concrete_functions"):
            functions += inner._list_all_concrete_functions()
    return functions


# ---------------------------------------------------------------------------------------------- driver side

_MEASURES = ("schedule_s", "corrections_s", "fit_s", "show_s", "peak_rss_mb", "show_peak_rss_mb",
             "graphdef_bytes")


def _ratio_of_medians(values, base):
    return float(statistics.median(values) / statistics.median(base))


def _delta_of_medians(values, base):
    return float(statistics.median(values) - statistics.median(base))


def summarise(runs, sizes):
    """Per policy and size: the medians, and the ratios (with intervals) against the smallest size."""
    summary = {}
    for policy, by_size in runs.items():
        rows = {}
        base_size = sizes[policy][0]
        base = by_size[str(base_size)]
        for size in sizes[policy]:
            reps = by_size[str(size)]
            row = {"max_iter": size, "repeats": len(reps), "corrections": reps[0]["corrections"],
                   "show_rc": sorted({str(r["show_rc"]) for r in reps}),
                   "graphdef_nodes": reps[0]["graphdef_nodes"]}
            for measure in _MEASURES:
                row[measure] = statistics.median(r[measure] for r in reps)
            for measure in ("schedule_s", "corrections_s", "fit_s", "show_s", "graphdef_bytes"):
                values, base_values = [r[measure] for r in reps], [r[measure] for r in base]
                ci = _common.bootstrap_ci(_ratio_of_medians, [values, base_values], paired=False,
                                          resamples=BOOTSTRAP_RESAMPLES)
                row[f"{measure}_ratio"] = {"ratio": _ratio_of_medians(values, base_values), "ci95": list(ci)}
            for measure in ("peak_rss_mb", "show_peak_rss_mb"):
                values, base_values = [r[measure] for r in reps], [r[measure] for r in base]
                ci = _common.bootstrap_ci(_delta_of_medians, [values, base_values], paired=False,
                                          resamples=BOOTSTRAP_RESAMPLES)
                row[f"{measure}_delta"] = {"delta": _delta_of_medians(values, base_values), "ci95": list(ci)}
            rows[str(size)] = row
        top = rows[str(sizes[policy][-1])]
        top["verdicts"] = {
            "fit_s": _common.verdict(top["fit_s_ratio"]["ci95"], TARGET_TIME_RATIO),
            "show_s": _common.verdict(top["show_s_ratio"]["ci95"], TARGET_TIME_RATIO),
            "schedule_s": _common.verdict(top["schedule_s_ratio"]["ci95"], TARGET_TIME_RATIO),
            "peak_rss_mb": _common.verdict(top["peak_rss_mb_delta"]["ci95"], TARGET_RSS_DELTA_MB),
            "show_peak_rss_mb": _common.verdict(top["show_peak_rss_mb_delta"]["ci95"], TARGET_RSS_DELTA_MB),
        }
        summary[policy] = rows
    return summary


def _ratio_text(entry):
    low, high = entry["ci95"]
    return f"{entry['ratio']:.3f} [{low:.3f}, {high:.3f}]"


def _delta_text(entry):
    low, high = entry["ci95"]
    return f"{entry['delta']:+.1f} [{low:+.1f}, {high:+.1f}]"


def markdown(summary, labels):
    lines = []
    for policy, rows in summary.items():
        lines += [f"\n**{policy}**\n",
                  "| MAX_ITER | corrections | schedule ms | corrections ms | optimizer + compile + 1st step s "
                  "(ratio [95% CI]) | peak RSS MB (delta [95% CI]) | GraphDef bytes (ratio) | `hvd-sched show` s "
                  "(ratio [95% CI]) | show exit | show peak RSS MB |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for size, row in rows.items():
            lines.append(
                f"| {labels[policy][size]} | {row['corrections']} | {row['schedule_s'] * 1e3:.2f} | "
                f"{row['corrections_s'] * 1e3:.2f} | {row['fit_s']:.3f} ({_ratio_text(row['fit_s_ratio'])}) | "
                f"{row['peak_rss_mb']:.0f} ({_delta_text(row['peak_rss_mb_delta'])}) | "
                f"{row['graphdef_bytes']:.0f} ({row['graphdef_bytes_ratio']['ratio']:.3f}) | "
                f"{row['show_s']:.3f} ({_ratio_text(row['show_s_ratio'])}) | {'/'.join(row['show_rc'])} | "
                f"{row['show_peak_rss_mb']:.0f} |")
        top = list(rows.values())[-1]
        lines.append("\nTargets at the largest MAX_ITER: " + ", ".join(
            f"{measure} {result}" for measure, result in top["verdicts"].items()))
    return "\n".join(lines) + "\n"


def _label(size):
    exponent = len(str(size)) - 1
    return f"1e{exponent}" if size == 10 ** exponent else f"{size:,}"


def driver(args):
    import numpy as np

    sizes_wanted = QUICK_SIZES if args.quick else SIZES
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 5)
    script = pathlib.Path(__file__).resolve()
    env = _common.worker_env(threads=1)
    sizes, notes = {}, {}
    for policy in POLICIES:
        top, error = largest_valid_max_iter(policy, 10 ** 8, sizes_wanted[-1])
        sizes[policy] = [*sizes_wanted[:-1], top]
        if error:
            notes[policy] = {"rejected_max_iter": sizes_wanted[-1], "error": error, "largest_valid_max_iter": top}
    cases = [(policy, size) for policy in POLICIES for size in sizes[policy]]
    runs = {policy: {str(size): [] for size in sizes[policy]} for policy in POLICIES}
    rng = np.random.default_rng(1234)
    started = time.perf_counter()
    loads = [round(os.getloadavg()[0], 2)]
    for repeat in range(repeats):
        for index in rng.permutation(len(cases)):
            policy, size = cases[index]
            completed = subprocess.run(
                [sys.executable, str(script), "--case", "--policy", policy, "--max-iter", str(size),
                 "--show-timeout", str(args.show_timeout)],
                env=env, cwd=_common.ROOT, capture_output=True, text=True, timeout=args.timeout, check=False)
            if completed.returncode != 0:
                raise RuntimeError(f"case {policy} MAX_ITER={size} failed (exit {completed.returncode})\n"
                                   f"--- stdout ---\n{completed.stdout[-4000:]}\n--- stderr ---\n"
                                   f"{completed.stderr[-6000:]}")
            result = json.loads(completed.stdout.strip().splitlines()[-1])
            result["repeat"] = repeat
            runs[policy][str(size)].append(result)
            print(f"  repeat {repeat} {policy} MAX_ITER={size}: fit {result['fit_s']:.3f} s, show "
                  f"{result['show_s']:.3f} s (exit {result['show_rc']}), peak RSS {result['peak_rss_mb']:.0f} MB",
                  flush=True)
        loads.append(round(os.getloadavg()[0], 2))
    summary = summarise(runs, sizes)
    labels = {policy: {str(size): _label(size) for size in sizes[policy]} for policy in POLICIES}
    table = markdown(summary, labels)
    report = {
        "machine": _common.machine(),
        "command": "python bench/scale.py" + (" --quick" if args.quick else "") +
                   (f" --repeats {args.repeats}" if args.repeats is not None else ""),
        "settings": {"repeats": repeats, "sizes": sizes, "model": "MLP 8-16-2", "batch": 16,
                     "threads_per_process": 1, "bootstrap_resamples": BOOTSTRAP_RESAMPLES,
                     "targets": {"time_ratio": TARGET_TIME_RATIO, "rss_delta_mb": TARGET_RSS_DELTA_MB}},
        "loadavg_1min_per_repeat": loads,
        "duration_s": round(time.perf_counter() - started, 1),
        "notes": notes,
        "summary": summary,
        "runs": runs,
        "table_markdown": table,
    }
    print(table)
    for policy, note in notes.items():
        print(f"{policy}: MAX_ITER={note['rejected_max_iter']} rejected ({note['error']}); largest valid "
              f"{note['largest_valid_max_iter']}")
    print(f"took {report['duration_s']:.0f} s; 1-min load average per repeat {loads}")
    out = args.out
    if out is None and not args.quick:
        out = _common.raw_path("scale")
    if out:
        out = pathlib.Path(out)
        _common.write_json(out, report)
        out.with_suffix(".md").write_text(table)
        print(f"wrote {out} and {out.with_suffix('.md')}")
    print(json.dumps({policy: {str(row["max_iter"]): {"fit_s": round(row["fit_s_ratio"]["ratio"], 4),
                                                      "show_s": round(row["show_s_ratio"]["ratio"], 4),
                                                      "peak_rss_mb_delta": round(row["peak_rss_mb_delta"]["delta"],
                                                                                 1)}
                                for row in rows.values()} for policy, rows in summary.items()}))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1e4 and the largest MAX_ITER, 1 repeat")
    parser.add_argument("--repeats", type=int, default=None, help="fresh processes per case (default 5; quick 1)")
    parser.add_argument("--out", default=None, help="JSON report (a .md table beside it); default "
                                                    "docs/bench/<date>_scale.json without --quick")
    parser.add_argument("--timeout", type=float, default=600, help="seconds allowed to each case")
    parser.add_argument("--show-timeout", type=float, default=300, help="seconds allowed to `hvd-sched show`")
    parser.add_argument("--case", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--policy", choices=POLICIES, help=argparse.SUPPRESS)
    parser.add_argument("--max-iter", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.case:
        case(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
