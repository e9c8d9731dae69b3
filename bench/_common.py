"""Helpers shared by the benchmarks in ``bench/`` (an entry point: may import everything below it).

- ``ROOT``: the checkout, put on ``sys.path`` so the scripts run without installing ``hvd_sched``;
- ``limit_threads``: one TensorFlow thread per process, set before TensorFlow runs an op;
- ``horovodrun_cmd``: the command a user types, ``horovodrun -np N -H localhost:N --gloo python ...``;
- ``worker_env``: the environment of a benchmark subprocess (one thread, quiet TensorFlow, the checkout on
  ``PYTHONPATH``);
- ``machine``: date, cores, CPU model, load, versions (Python, TensorFlow, Keras, Horovod), the stack row and the
  git commit, recorded next to every result;
- ``stack_row``: which row of the support matrix this Python is (tf2.15, tf2.21, keras3);
- ``run_checked``: run a subprocess, raise with its output if it fails;
- ``summarise``: median and min of repeated timings;
- ``bootstrap_ci``: a 95% percentile bootstrap interval of a statistic of repeated timings;
- ``verdict``: whether such an interval confirms, refutes or cannot decide an upper-bound target;
- ``compare``: one variant against its reference over interleaved rounds (ratios and extra microseconds per
  step, each with its interval, and the verdict); ``comparison_table``: those rows as a Markdown table;
- ``raw_path``: ``docs/bench/<UTC date and time>_<benchmark>.json``, where every full run keeps its raw figures;
- ``command_line``: the command that reproduces a run on its row, recorded in the report.
"""

import argparse
import datetime
import os
import pathlib
import platform
import statistics
import subprocess
import sys

__all__ = ["ROOT", "DOCS", "RAW_DIR", "limit_threads", "horovodrun_cmd", "worker_env", "machine", "stack_row",
           "git_commit", "loadavg", "run_checked", "summarise", "bootstrap_ci", "verdict", "compare",
           "comparison_table", "raw_path", "write_json", "add_output_arguments", "write_report", "command_line"]

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RAW_DIR = DOCS / "bench"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")


def limit_threads(threads=1):
    """Give TensorFlow ``threads`` intra-op and inter-op threads; call before the first op runs.

    On a 2-core machine shared with other jobs, one thread per process keeps two ranks from fighting over the
    cores and makes repeated timings comparable.
    """
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def worker_env(threads=1, extra=None):
    """The environment of a benchmark subprocess: ``threads`` threads, TensorFlow's C++ INFO lines off."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    for name in _THREAD_VARIABLES:
        env[name] = str(threads)
    env.update(extra or {})
    return env


def horovodrun_cmd(np_, script, args=()):
    """``horovodrun -np N -H localhost:N --gloo <this python> script args`` (the sibling of ``sys.executable``)."""
    horovodrun = pathlib.Path(sys.executable).with_name("horovodrun")
    return [str(horovodrun), "-np", str(np_), "-H", f"localhost:{np_}", "--gloo", sys.executable, str(script),
            *map(str, args)]


def _cpu_model():
    try:
        completed = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return platform.processor() or "unknown"
    for line in completed.stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _keras_version():
    """The version of the Keras that ``tf.keras`` is (Keras 2.15, tf-keras on TF >= 2.16, or Keras 3)."""
    import tensorflow as tf

    version = getattr(tf.keras, "__version__", None)
    if version:
        return version
    try:
        import hvd_sched._compat as compat

        major = compat.keras_major()
    except ImportError:
        major = None
    names = ("keras",) if major == 3 else ("tf_keras", "keras") if tuple(map(int, tf.__version__.split(".")[:2])) \
        >= (2, 16) else ("keras",)
    for name in names:
        try:
            return __import__(name).__version__
        except (ImportError, AttributeError):
            continue
    return "unknown"


def stack_row():
    """The support-matrix row this process runs on: "tf2.15", "tf2.21" (tf-keras) or "keras3" (TF's rule)."""
    import tensorflow as tf

    import hvd_sched._compat as compat

    minor = ".".join(tf.__version__.split(".")[:2])
    return "keras3" if compat.keras_major() == 3 else f"tf{minor}"


def git_commit():
    """``{"commit": HEAD, "dirty": [changed files under hvd_sched/ and bench/]}`` of the checkout (None if no git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--", "hvd_sched", "bench"], cwd=ROOT,
                                capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": head, "dirty": sorted(line[3:] for line in status.splitlines() if line.strip())}


def loadavg():
    """The 1, 5 and 15-minute load averages, rounded."""
    return [round(value, 2) for value in os.getloadavg()]


def machine():
    """Where and when a result was measured: UTC date, ``nproc``, the CPU model, load, versions and the commit."""
    import numpy as np

    versions = {"python": platform.python_version(), "numpy": np.__version__}
    try:
        import tensorflow as tf

        versions["tensorflow"] = tf.__version__
        versions["keras"] = _keras_version()
        versions["stack_row"] = stack_row()
    except ImportError:
        pass
    try:
        import horovod

        versions["horovod"] = horovod.__version__
    except ImportError:
        pass
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "loadavg_1min": round(os.getloadavg()[0], 2),
        **versions,
        "git": git_commit(),
    }


def run_checked(cmd, env, timeout, what):
    """Run ``cmd`` in the checkout; return (seconds, stdout), or raise RuntimeError with its output if it fails."""
    import time

    started = time.perf_counter()
    completed = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {completed.returncode}): {' '.join(map(str, cmd))}\n"
                           f"--- stdout ---\n{completed.stdout[-6000:]}\n--- stderr ---\n{completed.stderr[-6000:]}")
    return time.perf_counter() - started, completed.stdout


def summarise(values):
    """``{"median": ..., "min": ..., "n": ...}`` of a list of numbers."""
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "n": len(values)}


def bootstrap_ci(statistic, samples, *, paired, resamples=10000, seed=0, level=0.95, vectorized=False):
    """The percentile bootstrap interval ``(low, high)`` of ``statistic(*samples)``.

    Args:
        statistic: a function of numpy arrays (one per sample) returning a number, e.g. a ratio of medians.
        samples: sequences of repeated measurements.
        paired: resample the same indices in every sample (rounds that ran together, so a burst of load hits
            all of them), or each sample on its own (independent processes).
        resamples: the number of bootstrap resamples.
        seed: the seed of the resampling (the interval is reproducible).
        level: the coverage, 0.95 for a 95% interval.
        vectorized: ``statistic`` takes 2-D arrays (one resample per row) and returns one value per row: all
            resamples at once (the same resamples, so the same interval as the loop, far faster).
    """
    import numpy as np

    arrays = [np.asarray(sample, dtype=float) for sample in samples]
    rng = np.random.default_rng(seed)
    if paired:
        if len({len(array) for array in arrays}) != 1:
            raise ValueError(f"paired samples must have equal lengths, got {[len(a) for a in arrays]}")
        indices = [rng.integers(0, len(arrays[0]), (resamples, len(arrays[0])))] * len(arrays)
    else:
        indices = [rng.integers(0, len(array), (resamples, len(array))) for array in arrays]
    if vectorized:
        values = np.asarray(statistic(*(array[index] for array, index in zip(arrays, indices))), dtype=float)
    else:
        values = np.array([statistic(*(array[index[row]] for array, index in zip(arrays, indices)))
                           for row in range(resamples)])
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def verdict(ci, target):
    """For an upper-bound target: 'confirmed' (the interval's upper end <= target), 'refuted' (its lower end >
    target), or 'undecided' (the interval straddles it)."""
    low, high = ci
    if high <= target:
        return "confirmed"
    if low > target:
        return "refuted"
    return "undecided"


# compare's statistics: of 1-D arrays (one value per round), or row-wise of 2-D arrays (one resample per row).


def _ratio_of_medians(values, base):
    import numpy as np

    return np.median(values, axis=-1) / np.median(base, axis=-1)


def _ratio_of_mins(values, base):
    import numpy as np

    return np.min(values, axis=-1) / np.min(base, axis=-1)


def _paired_median(values, base):
    import numpy as np

    return np.median(values / base, axis=-1)


def _extra_us(values, base):
    import numpy as np

    return (np.median(values, axis=-1) - np.median(base, axis=-1)) * 1e6


def _extra_us_paired(values, base):
    import numpy as np

    return np.median(values - base, axis=-1) * 1e6


#: Fewer rounds than this give no verdict ("undecided"): e.g. a --quick run.
MIN_ROUNDS_FOR_VERDICT = 10
#: compare's statistics of (variant, reference) seconds per step over rounds.
STATISTICS = {"ratio_median": _ratio_of_medians, "ratio_min": _ratio_of_mins,
              "ratio_paired_median": _paired_median, "extra_us": _extra_us, "extra_us_paired": _extra_us_paired}


def compare(values, base, reference, target=None, resamples=10000):
    """One variant against its reference, both timed in the same interleaved rounds (seconds per step).

    Returns a row: median and min ms/step, the ratio of medians, of minimums, the median of per-round ratios,
    and the extra microseconds per step (difference of medians, and median of per-round differences), each with
    a 95% bootstrap interval (the rounds
    resampled jointly: a round ran both, so a burst of load hits them together); with ``target``, the verdict of
    the ratio of medians' interval against it ("undecided" below ``MIN_ROUNDS_FOR_VERDICT`` rounds).
    """
    import numpy as np

    values, base = np.asarray(values, dtype=float), np.asarray(base, dtype=float)
    stats = summarise(values)
    row = {"reference": reference, "median_ms": round(stats["median"] * 1e3, 6), "min_ms": round(stats["min"] * 1e3, 6)}
    for key, statistic in STATISTICS.items():
        digits = 2 if key.startswith("extra_us") else 4
        row[key] = round(float(statistic(values, base)), digits)
        low, high = bootstrap_ci(statistic, [values, base], paired=True, resamples=resamples, vectorized=True)
        row[key + "_ci95"] = [round(low, digits), round(high, digits)]
    if target is not None:
        row["target"] = target
        row["verdict"] = verdict(row["ratio_median_ci95"], target)
        if len(values) < MIN_ROUNDS_FOR_VERDICT:  # a bootstrap of a handful of rounds says nothing
            row["verdict"] = "undecided"
            row["verdict_note"] = f"only {len(values)} rounds (a verdict needs >= {MIN_ROUNDS_FOR_VERDICT})"
    return row


def _interval(row, key, digits=3):
    low, high = row[key + "_ci95"]
    return f"{row[key]:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def comparison_table(title, table, unit="ms", per="step"):
    """Markdown lines of ``compare`` rows (``{name: row}``; a row with ``not_applicable`` prints its reason, a
    row's ``note`` goes in the last column); ``per``: what the compared times are per ("step", "update")."""
    scale = {"ms": 1.0, "us": 1e3}[unit]
    lines = [f"**{title}**", "",
             f"| variant | median {unit}/{per} | min {unit}/{per} | ratio (median) [95% CI] | paired ratio (median) "
             f"[95% CI] | extra us/{per} [95% CI] | paired extra us/{per} [95% CI] | target | note |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for name, row in table.items():
        if "not_applicable" in row:
            lines.append(f"| {name} | n/a | n/a | n/a | n/a | n/a | n/a | | {row['not_applicable']} |")
            continue
        target = f"<= {row['target']}: {row['verdict']}" if "target" in row else ""
        lines.append(f"| {name} (/ {row['reference']}) | {row['median_ms'] * scale:.3f} | "
                     f"{row['min_ms'] * scale:.3f} | {_interval(row, 'ratio_median')} | "
                     f"{_interval(row, 'ratio_paired_median')} | {_interval(row, 'extra_us', 1)} | "
                     f"{_interval(row, 'extra_us_paired', 1)} | {target} | "
                     f"{row.get('note', '')} |")
    return lines + [""]


def raw_path(benchmark, directory=None):
    """``<directory or docs/bench>/<YYYY-MM-DDTHHMM>_<benchmark>.json`` (UTC): one file per run, never
    overwritten by a later run."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%M%S")
    return pathlib.Path(directory or RAW_DIR) / f"{stamp}_{benchmark}.json"


def command_line(row, script, quick):
    """``[TF_USE_LEGACY_KERAS=1 ]<this python, relative to the checkout> bench/<script>[ --quick]``: the variable
    on the tf-keras rows (tf2.16 and later with Keras 2), none on tf2.15 and keras3."""
    return ("TF_USE_LEGACY_KERAS=1 " if row not in ("tf2.15", "keras3") else "") + \
        f"{os.path.relpath(sys.executable, ROOT)} bench/{script}" + (" --quick" if quick else "")


def add_output_arguments(parser, benchmark, *, out_help="also write the JSON report here", workers=True):
    """The options every timing script shares: ``--out``, ``--raw-dir`` and, for scripts that start worker
    processes, ``--timeout`` and the hidden ``--worker`` / ``--result``."""
    parser.add_argument("--out", default=None, help=out_help)
    parser.add_argument("--raw-dir", default=None,
                        help=f"where the run goes as <date>_{benchmark}_<row>.json and .md (default: docs/bench/ "
                             "without --quick; with --quick only if given)")
    if workers:
        parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed to each subprocess")
        parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
        parser.add_argument("--result", default=None, help=argparse.SUPPRESS)


def write_report(report, lines, benchmark, args):
    """``report`` to ``args.out`` if given; a full run (or one given ``--raw-dir``) also keeps it as
    ``raw_path(benchmark)`` with the printed tables ``lines`` beside it as ``.md``."""
    if args.out:
        write_json(args.out, report)
        print(f"wrote {args.out}")
    if args.raw_dir or not args.quick:
        path = raw_path(benchmark, args.raw_dir)
        write_json(path, report)
        path.with_suffix(".md").write_text("\n".join(lines) + "\n")
        print(f"wrote {path} and {path.with_suffix('.md').name}")


def write_json(path, data):
    """Write ``data`` as indented JSON (atomically: a reader never sees half a file)."""
    import json

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
