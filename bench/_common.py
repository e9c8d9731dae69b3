"""Helpers shared by the benchmarks in ``bench/`` (an entry point: may import everything below it).

- ``ROOT``: the checkout, put on ``sys.path`` so the scripts run without installing ``hvd_sched``;
- ``limit_threads``: one TensorFlow thread per process, set before TensorFlow runs an op;
- ``horovodrun_cmd``: the command a user types, ``horovodrun -np N -H localhost:N --gloo python ...``;
- ``worker_env``: the environment of a benchmark subprocess (one thread, quiet TensorFlow, the checkout on
  ``PYTHONPATH``);
- ``machine``: date, cores, CPU model and versions, recorded next to every result;
- ``summarise``: median and min of repeated timings;
- ``bootstrap_ci``: a 95% percentile bootstrap interval of a statistic of repeated timings;
- ``verdict``: whether such an interval confirms, refutes or cannot decide an upper-bound target;
- ``raw_path``: ``docs/bench/<UTC date and time>_<benchmark>.json``, where every full run keeps its raw figures.
"""

import datetime
import os
import pathlib
import platform
import statistics
import subprocess
import sys

__all__ = ["ROOT", "DOCS", "RAW_DIR", "limit_threads", "horovodrun_cmd", "worker_env", "machine", "summarise",
           "bootstrap_ci", "verdict", "raw_path", "write_json"]

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


def machine():
    """Where and when a result was measured: UTC date, ``nproc``, the CPU model, load and versions."""
    import numpy as np

    versions = {"python": platform.python_version(), "numpy": np.__version__}
    try:
        import tensorflow as tf

        versions["tensorflow"] = tf.__version__
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
    }


def summarise(values):
    """``{"median": ..., "min": ..., "n": ...}`` of a list of numbers."""
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "n": len(values)}


def bootstrap_ci(statistic, samples, *, paired, resamples=10000, seed=0, level=0.95):
    """The percentile bootstrap interval ``(low, high)`` of ``statistic(*samples)``.

    Args:
        statistic: a function of numpy arrays (one per sample) returning a number, e.g. a ratio of medians.
        samples: sequences of repeated measurements.
        paired: resample the same indices in every sample (rounds that ran together, so a burst of load hits
            all of them), or each sample on its own (independent processes).
        resamples: the number of bootstrap resamples.
        seed: the seed of the resampling (the interval is reproducible).
        level: the coverage, 0.95 for a 95% interval.
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


def raw_path(benchmark, directory=None):
    """``<directory or docs/bench>/<YYYY-MM-DDTHHMM>_<benchmark>.json`` (UTC): one file per run, never
    overwritten by a later run."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%M%S")
    return pathlib.Path(directory or RAW_DIR) / f"{stamp}_{benchmark}.json"


def write_json(path, data):
    """Write ``data`` as indented JSON (atomically: a reader never sees half a file)."""
    import json

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
