"""What hvd_sched asks of Horovod's TensorFlow layer (`horovod.tensorflow`), the same for Keras 2 and Keras 3.

Every collective is Horovod's: gradients are averaged with `horovod.tensorflow.grouped_allreduce` (Horovod
allgathers sparse gradients itself), variables broadcast with `horovod.tensorflow.broadcast_variables`. Nothing
here imports Keras.
"""

import os

__all__ = ["rank", "size", "is_elastic", "xla_ops_enabled", "XLA_WITH_HOROVOD", "average_gradients"]

XLA_WITH_HOROVOD = (
    "hvd_sched: the whole train step is XLA-compiled (model.compile(..., jit_compile=True){auto}) and contains "
    "Horovod's collectives, which have no XLA kernels here (Horovod has them only in GPU builds that include "
    "xla_mpi_ops.cc, with HOROVOD_ENABLE_XLA_OPS=1); compile the model with model.compile(..., "
    "jit_compile=False). The optimizer's own per-variable XLA update (Keras 2 optimizers' jit_compile, on by "
    "default on a GPU) works with hvd_sched.")


def _ask(question, alone):
    """`horovod.tensorflow.<question>()`, or `alone` when Horovod is missing or not initialised."""
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return alone
    try:
        return getattr(hvd, question)() if hvd.is_initialized() else alone
    except ValueError:
        return alone


def rank():
    """This process's Horovod rank, or 0 when Horovod is not initialised (single-process Keras)."""
    return _ask("rank", 0)


def size():
    """The number of Horovod ranks, or 1 when Horovod is not initialised."""
    return _ask("size", 1)


def is_elastic():
    """True under `horovodrun --min-np/--max-np` (Horovod sets HOROVOD_ELASTIC): the size may change later."""
    return bool(int(os.environ.get("HOROVOD_ELASTIC", "0") or 0))


def xla_ops_enabled():
    """True when the user turned Horovod's own XLA ops on (then an XLA-compiled step is theirs to try)."""
    return os.environ.get("HOROVOD_ENABLE_XLA_OPS", "").strip().lower() in ("1", "true", "yes", "on")


def average_gradients(grads, *, sparse_as_dense=False, compression=None, name="hvd_sched_grads"):
    """`grads` averaged over the Horovod ranks: one `grouped_allreduce` per dtype, None kept where it was.

    With one rank and no elastic mode nothing is emitted (the step then has no Horovod op, and can be
    XLA-compiled). Sparse gradients (`tf.IndexedSlices`) are allgathered by Horovod and averaged, or made dense
    first with `sparse_as_dense`.
    """
    import horovod.tensorflow as hvd
    import tensorflow as tf

    if hvd.size() == 1 and not is_elastic():
        return list(grads)
    grads = list(grads)
    if sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    groups = {}
    for index, grad in enumerate(grads):
        if grad is not None:
            groups.setdefault(grad.dtype, []).append(index)
    averaged = list(grads)
    extra = {} if compression is None else {"compression": compression}
    for number, (dtype, indices) in enumerate(sorted(groups.items(), key=lambda item: item[0].name)):
        reduced = hvd.grouped_allreduce([grads[i] for i in indices], op=hvd.Average,
                                        name=f"{name}_{dtype.name}_{number}", **extra)
        for i, value in zip(indices, reduced):
            averaged[i] = value
    return averaged
