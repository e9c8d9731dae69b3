"""The in-graph LR and correction factor (segments, no tables) against the numpy schedule, bit for bit.

The graph is run the way training runs it: one scalar step at a time (a `tf.while_loop` of the same ops that
`ScheduleLR` and `ScheduledOptimizer` build), over every iteration of long ranges and at samples up to 1e9.
The numpy side is `Schedule.lr_at` (checked against Detectron's own formulas in tests/unit) and a plain walk of
the correction rule over every iteration, written here, not `momentum_corrections`.
"""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings

import hvd_sched
import rows
from detectron_scalar import reference_walk, valid_solvers, walk_stop
from hvd_sched import Schedule, momentum
from hvd_sched.keras import ScheduleLR, ScheduledOptimizer
from hvd_sched.keras._tables import _MAX_COMPARED, _lookup_factor, correction_table, graph_factor

CONFIGS = {
    "step": dict(lr_policy="step", base_lr=0.1, gamma=0.5, step_size=37000, max_iter=10**6, warm_up_iters=100),
    "step_many_decays": dict(lr_policy="step", base_lr=0.1, gamma=0.9999, step_size=9, max_iter=10**6, warm_up_iters=50),
    "steps_with_decay": dict(lr_policy="steps_with_decay", base_lr=0.02, steps=[0, 3000, 600000, 900000],
                             max_iter=10**6, warm_up_iters=500),
    "steps_with_lrs": dict(lr_policy="steps_with_lrs", steps=[0, 10, 500000], lrs=[0.1, 0.05, 0.001],
                           max_iter=10**6, warm_up_iters=0),
    "steps_with_relative_lrs": dict(lr_policy="steps_with_relative_lrs", base_lr=0.4, steps=[0, 200000, 700000],
                                    lrs=[1.0, 0.1, 0.01], max_iter=10**6, warm_up_method="constant",
                                    warm_up_iters=1000, warm_up_factor=0.1),
    "cosine_decay": dict(lr_policy="cosine_decay", base_lr=0.1, max_iter=10**6, warm_up_iters=2000,
                         scale_momentum_threshold=1.0001),
    "exp_decay": dict(lr_policy="exp_decay", base_lr=0.1, gamma=1e-3, max_iter=10**6, warm_up_iters=300),
    "poly": dict(lr_policy="poly", base_lr=0.1, power=0.9, max_iter=10**6, warm_up_iters=10,
                 scale_momentum_mode="every_change"),
    "large_scale_vrd": dict(dialect="large_scale_vrd", lr_policy="variable_stepsize", base_lr=0.01,
                            step_sizes=[4000, 3000, 200000], max_iter=10**6, warm_up_iters=100, warm_up_lr=0.002,
                            gradual_increase_lr=True, gradual_lr_step=0.00001, scale_momentum_mode="any_change"),
    "video_nonlocal": dict(dialect="video_nonlocal", lr_policy="steps_with_relative_lrs", base_lr=0.01,
                           steps=[0, 500, 800, 900000], lrs=[1, 0.1, 0.01, 0.001], max_iter=10**6,
                           warm_up_iters=20000, warm_up_lr=0.001, nesterov=True, scale_momentum_mode="relative_change"),
    "variable_stepsize": dict(lr_policy="variable_stepsize", base_lr=0.1, gamma=0.3, step_sizes=[100, 20000, 5],
                              max_iter=10**6, scale_momentum_mode="every_change"),
}


def _graph_values(schedule, start, count, mode, threshold, *factor_fns):
    """(lr, factor, ...) of iterations start..start+count-1, one scalar step at a time, inside one tf.function;
    the factor from the rule in-graph, or one array per `factor_fns` (e.g. a lookup in the corrections), all
    in the same loop."""
    factor_fns = factor_fns or (lambda it: graph_factor(schedule, it, mode, threshold),)

    @tf.function
    def run():
        def body(k, lrs, *factors):
            it = tf.constant(start, tf.int64) + tf.cast(k, tf.int64)
            return (k + 1, lrs.write(k, ScheduleLR(schedule)(it)),
                    *[out.write(k, fn(it)) for out, fn in zip(factors, factor_fns)])

        arrays = [tf.TensorArray(tf.float32, count) for _ in range(1 + len(factor_fns))]
        _, *outs = tf.while_loop(lambda k, *_: k < count, body, [0, *arrays])
        return [out.stack() for out in outs]

    return tuple(out.numpy() for out in run())


def _walked_factors(schedule, its, mode, threshold):
    """The rule on every iteration, as Detectron's loop applies it (0 before iteration 0)."""
    new = schedule.lr_at(its)
    cur = np.where(its > 0, schedule.lr_at(np.maximum(its - 1, 0)), np.float32(0))
    new64, cur64 = schedule._lr64(its), schedule._lr64(np.maximum(its - 1, 0))
    mask, factors = momentum.correction_factors(cur, new, mode, threshold, cur64, new64)
    return np.where(mask & (its > 0), factors, np.float32(1))


def _check(schedule, start, count, every_form=True):
    """The LR and the factor in-graph against numpy; every form of the factor (the rule, and both forms of the
    correction lookup: a compare on a short table, a binary search on a long one), or (``every_form=False``,
    the million-iteration runs) the one ScheduledOptimizer builds for this schedule."""
    mode, threshold = schedule.correction_mode, schedule.scale_momentum_threshold
    table = correction_table(schedule, mode, threshold)

    def rule(it):
        return graph_factor(schedule, it, mode, threshold)

    def lookup(max_compared):
        return lambda it: _lookup_factor(tf.cast(it, tf.int64), *table, max_compared=max_compared)

    if every_form:
        factor_fns = [rule] + ([] if table is None else [lookup(0), lookup(10**6)])
    else:
        factor_fns = [rule if table is None else lookup(_MAX_COMPARED)]
    lrs, *factor_arrays = _graph_values(schedule, start, count, mode, threshold, *factor_fns)
    its = np.arange(start, start + count, dtype=np.int64)
    np.testing.assert_array_equal(lrs, schedule.lr_at(its))
    walked = _walked_factors(schedule, its, mode, threshold)
    for factors in factor_arrays:
        np.testing.assert_array_equal(factors, walked)
    corrected = its[factor_arrays[0] != 1]
    assert [it for it, _ in schedule.momentum_corrections(start + count, start)] == corrected.tolist()


@pytest.mark.depends_on(*rows.TF_OPS)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_graph_lr_and_factor_equal_numpy_on_the_first_iterations(name):
    _check(Schedule(**CONFIGS[name]), 0, 30000)


@pytest.mark.slow
@pytest.mark.depends_on(*rows.TF_OPS)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_graph_lr_and_factor_equal_numpy_at_every_iteration_of_a_million(name):
    schedule = Schedule(**CONFIGS[name])
    _check(schedule, 0, schedule.hold_iter + 2, every_form=False)


@pytest.mark.parametrize("policy, extra", [
    ("steps_with_decay", dict(steps=[0, 3 * 10**8, 6 * 10**8])),
    ("step", dict(step_size=10**7, gamma=0.9)),
    ("step", dict(step_size=2000, gamma=0.9999)),
    ("exp_decay", dict(gamma=0.01)),
    ("poly", dict(power=2.0)),
    ("cosine_decay", dict(max_iter=2 * 10**8)),
])
@pytest.mark.depends_on(*rows.TF_OPS)
def test_graph_lr_equals_numpy_at_samples_up_to_1e9(policy, extra):
    config = {"lr_policy": policy, "base_lr": 0.1, "max_iter": 10**9, "warm_up_iters": 10**6, **extra}
    schedule = Schedule(**config)
    end = max(schedule.max_iter, schedule.hold_iter)
    starts = sorted({0, 10**6 - 100, end // 3, end // 2, end - 5000, end - 100, *[b - 50 for b in
                     schedule.boundaries()[:20] if b >= 50]})
    for start in starts:
        _check(schedule, start, 200)


def test_optimizer_graph_has_no_per_iteration_constant():
    """The compiled step of a 1e9-iteration schedule is as small as a 1e4 one's: no table in the graph."""

    def graph_bytes(max_iter):
        schedule = Schedule(lr_policy="steps_with_decay", base_lr=0.1, steps=[0, max_iter // 2], max_iter=max_iter)
        optimizer = ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule)
        variable = tf.Variable([1.0, 2.0])

        @tf.function
        def step():
            optimizer.apply_gradients([(tf.constant([0.1, 0.2]), variable)])

        return len(step.get_concrete_function().graph.as_graph_def().SerializeToString())

    small, large = graph_bytes(10**4), graph_bytes(10**9)
    assert large <= small + 64, (small, large)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_solvers(max_iter=2000))
def test_random_valid_configs_in_graph_equal_the_per_iteration_walk(drawn):
    """For random valid SOLVERs (every policy, warmup, mode, threshold): the in-graph LR and the factor
    ScheduledOptimizer applies (its correction lookup) at every iteration equal Detectron's walk
    (tests/detectron_scalar.py, no hvd_sched code)."""
    solver, mode, threshold = drawn
    schedule = hvd_sched.from_detectron(solver)
    stop = walk_stop(solver)
    lrs, corrections = reference_walk(solver, stop, mode, threshold)
    expected = np.ones(stop, dtype=np.float32)
    for it, factor in corrections:
        expected[it] = factor
    table = correction_table(schedule, mode, threshold)
    assert table is not None  # at most a few thousand corrections
    # The lookup, and the rule in-graph (what a schedule with more than MAX_CORRECTION_TABLE corrections gets).
    graph_lrs, looked_up, ruled = _graph_values(schedule, 0, stop, mode, threshold,
                                                lambda it: _lookup_factor(tf.cast(it, tf.int64), *table),
                                                lambda it: graph_factor(schedule, it, mode, threshold))
    np.testing.assert_array_equal(graph_lrs.view(np.uint32), lrs.view(np.uint32))
    np.testing.assert_array_equal(looked_up, expected)
    np.testing.assert_array_equal(ruled, expected)
