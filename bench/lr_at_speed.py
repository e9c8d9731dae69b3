"""Benchmark: ``Schedule.lr_at`` over N iterations at once vs a plain Python loop (a benchmark, not a test).

The loop calls a scalar re-derivation of Detectron's ``get_lr_at_iter`` (Python floats, ``np.cos`` /
``np.exp`` on scalars, ``np.float32`` at the end, as ``detectron/utils/lr_policy.py`` does) once per iteration;
the vectorised call evaluates the whole range with numpy. Both results are compared bit for bit.

Usage::

    python bench/lr_at_speed.py            # 10,000,000 iterations (the Python loop takes tens of seconds)
    python bench/lr_at_speed.py --quick    # 100,000 iterations

The last line printed is one JSON object: ``n``, ``policy``, ``vectorised_s`` (best of 3 calls),
``vectorised_first_s`` (the first call), ``python_loop_s`` (one pass), ``ratio`` (loop time / best vectorised
time) and ``bit_identical``.
"""

import argparse
import json
import math
import pathlib
import sys
import time

import numpy as np

try:
    import hvd_sched
except ImportError:  # run from a checkout without installing: the package is the script's grandparent's child
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    import hvd_sched

# One SOLVER per policy benchmarked: Detectron's 1x schedule shapes, MAX_ITER inside the range walked.
_SOLVERS = {
    "cosine_decay": {"BASE_LR": 0.02, "LR_POLICY": "cosine_decay", "MAX_ITER": 9_000_000},
    "steps_with_decay": {"BASE_LR": 0.02, "LR_POLICY": "steps_with_decay", "STEPS": [0, 6_000_000, 8_000_000],
                         "MAX_ITER": 9_000_000},
    "exp_decay": {"BASE_LR": 0.02, "LR_POLICY": "exp_decay", "GAMMA": 0.01, "MAX_ITER": 9_000_000},
}


def _scalar_lr(solver):
    """A plain-Python ``get_lr_at_iter`` for ``solver`` (Detectron's formulas, one iteration at a time)."""
    base_lr, max_iter = solver["BASE_LR"], solver["MAX_ITER"]
    warm_up_iters, warm_up_factor = solver["WARM_UP_ITERS"], solver["WARM_UP_FACTOR"]
    policy, gamma, steps = solver["LR_POLICY"], solver["GAMMA"], solver["STEPS"]

    def policy_lr(it):
        if policy == "cosine_decay":
            iter_frac = float(min(it, max_iter)) / max_iter
            return base_lr * (0.5 * (np.cos(np.pi * iter_frac) + 1))
        if policy == "exp_decay":
            iter_frac = float(min(it, max_iter)) / max_iter
            return base_lr * np.exp(iter_frac * np.log(gamma))
        index = 0
        while index + 1 < len(steps) and steps[index + 1] <= it:
            index += 1
        return base_lr * gamma**index

    def lr_at(it):
        lr = policy_lr(it)
        if it < warm_up_iters:
            alpha = it / warm_up_iters
            lr *= warm_up_factor * (1 - alpha) + alpha
        return np.float32(lr)

    return lr_at


def run(n, policy):
    """Time both ways over ``range(n)``; returns the JSON-ready result."""
    solver = {"GAMMA": 0.1, "STEPS": [], "WARM_UP_ITERS": 500, "WARM_UP_FACTOR": 1.0 / 3.0, **_SOLVERS[policy]}
    schedule = hvd_sched.from_detectron(solver)
    scalar_lr = _scalar_lr(solver)

    its = np.arange(n, dtype=np.int64)
    timings = []
    for _ in range(3):  # the first call also pays for page-faulting fresh memory; report it and the best
        start = time.perf_counter()
        vectorised = schedule.lr_at(its)
        timings.append(time.perf_counter() - start)
    vectorised_first_s, vectorised_s = timings[0], min(timings)

    looped = np.empty(n, dtype=np.float32)
    start = time.perf_counter()
    for it in range(n):
        looped[it] = scalar_lr(it)
    python_loop_s = time.perf_counter() - start

    return {
        "n": n,
        "policy": policy,
        "vectorised_s": round(vectorised_s, 4),
        "vectorised_first_s": round(vectorised_first_s, 4),
        "python_loop_s": round(python_loop_s, 4),
        "ratio": round(python_loop_s / vectorised_s, 1) if vectorised_s > 0 else math.inf,
        "bit_identical": bool(np.array_equal(vectorised.view(np.uint32), looped.view(np.uint32))),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 iterations instead of 10,000,000")
    parser.add_argument("--n", type=int, default=None, help="number of iterations (overrides --quick)")
    parser.add_argument("--policy", choices=sorted(_SOLVERS), default="cosine_decay")
    args = parser.parse_args(argv)
    n = args.n if args.n is not None else (100_000 if args.quick else 10_000_000)
    if n < 1:
        parser.error(f"--n must be >= 1, got {n}")
    result = run(n, args.policy)
    print(f"lr_at over {n:,} iterations ({args.policy}): {result['vectorised_s']:.4f} s vectorised "
          f"(first call {result['vectorised_first_s']:.4f} s), "
          f"{result['python_loop_s']:.4f} s Python loop, {result['ratio']}x; "
          f"bit-identical: {result['bit_identical']}")
    print(json.dumps(result))
    return 0 if result["bit_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
