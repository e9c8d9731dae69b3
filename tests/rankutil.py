"""Helpers imported by the scripts that tests run under `horovodrun` (and by the tests that launch them).

A rank script calls `emit(result)` once; the launcher collects one JSON file per rank. Keeping these in one
module means every multi-rank test builds its model and data the same way.
"""

import json
import os

import hvd_sched._compat  # noqa: F401  (before Horovod: keras -> tf_keras on TF >= 2.16, clear stack errors)

import numpy as np

__all__ = ["emit", "make_mlp", "make_regression", "shard_batches", "to_list"]


def to_list(value):
    """JSON-friendly copy of numpy arrays / lists of arrays."""
    if isinstance(value, dict):
        return {k: to_list(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_list(v) for v in value]
    if hasattr(value, "numpy"):
        value = value.numpy()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def emit(result, rank=None):
    """Write this rank's result as JSON where the launcher looks for it."""
    out_dir = os.environ["HVD_SCHED_TEST_OUT"]
    if rank is None:
        import horovod.tensorflow.keras as hvd  # only imported inside rank processes

        rank = hvd.rank()
    path = os.path.join(out_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(to_list(result), f)
    os.replace(path + ".tmp", path)


def make_regression(n=64, d=5, k=3, seed=0):
    """A small dense regression problem: float32 inputs x (n, d) and targets y (n, k)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    w = rng.normal(size=(d, k)).astype(np.float32)
    y = (np.tanh(x @ w) + 0.1 * rng.normal(size=(n, k))).astype(np.float32)
    return x, y


def make_mlp(seed=1):
    """The tests' model: Dense(8, tanh) -> Dense(3) on 5 inputs (tests/reference.py derives its gradients),
    built after `tf.keras.utils.set_random_seed(seed)` so every rank and process starts from the same weights."""
    import tensorflow as tf  # only the Keras and multi-rank tests use the model

    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([tf.keras.Input((5,)), tf.keras.layers.Dense(8, activation="tanh"),
                                tf.keras.layers.Dense(3)])


def shard_batches(x, y, global_batch, rank, size):
    """This rank's part of every global batch: global batch i is rows [i*B, (i+1)*B) and rank r takes its r-th
    slice of B/size rows, so `size` ranks at batch B/size see exactly one process's batches of B."""
    steps = len(x) // global_batch
    part = lambda a: a.reshape(steps, size, global_batch // size, -1)[:, rank].reshape(-1, a.shape[1])
    return part(x), part(y)
