"""What hvd_sched asks of Horovod's TensorFlow layer (`horovod.tensorflow`), the same for Keras 2 and Keras 3.

Every collective is Horovod's: gradients are averaged with `horovod.tensorflow.grouped_allreduce` (Horovod
allgathers sparse gradients itself), variables broadcast with `horovod.tensorflow.broadcast_variables`. Nothing
here imports Keras.
"""

import os

from ..launchers import launcher_problem

__all__ = ["rank", "size", "is_elastic", "xla_ops_enabled", "XLA_WITH_HOROVOD", "average_gradients",
           "adasum_problem", "check_launcher", "LauncherMismatchError"]

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


class LauncherMismatchError(RuntimeError):
    """The launcher started N processes that Horovod did not join (each would train alone as rank 0).

    A `RuntimeError` subclass; `check_launcher` raises it, naming the launcher and the sizes.
    """


LauncherMismatchError.__module__ = "hvd_sched.keras"  # its public name, in tracebacks and pickles


def check_launcher(require_init=True):
    """Stop this process where its launcher started N > 1 processes and Horovod did not join them.

    Raises `LauncherMismatchError` where the launcher (`mpirun`, `srun`, `horovodrun`, MVAPICH, Hydra, `jsrun`)
    started N > 1 processes and `hvd.size()` differs, or Horovod is not initialised. The pure rule, which also
    says which environment variables count: `hvd_sched.launchers.launcher_problem(os.environ, hvd.size())`.

    Called by `DistributedOptimizer`, `build_optimizer`, `horovod_callbacks`, `restore_latest` and, at train begin,
    `DistributedCheck` and `TrainingCheckpoint` (and `EpochCheckpoint`): whichever runs first stops the job on
    every process, before the first step and before any checkpoint is written. Cheap (a few environment reads):
    call it right after `hvd.init()` to fail at once.

    Examples:
        ```python
        import hvd_sched.keras, horovod.tensorflow.keras as hvd   # hvd_sched.keras first
        hvd.init()
        hvd_sched.keras.check_launcher()   # LauncherMismatchError if mpirun -np 4 started 4 lone rank 0s
        ```

    Args:
        require_init: where Horovod is not initialised yet, raise too (True: at train begin, or a user's call
            after `hvd.init()`), or check nothing (False: an optimizer or callbacks may be built before
            `hvd.init()`; the train-begin checks then decide).

    Raises:
        LauncherMismatchError: the launcher's process count and Horovod's disagree (the message says which).
    """
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        initialized, horovod_size = False, 1
    else:
        initialized = hvd.is_initialized()
        horovod_size = hvd.size() if initialized else 1
    from .. import _compat

    if not initialized and not require_init and _compat.HOROVOD:
        return  # hvd.init() may still come; without Horovod it never will: check now
    problem = launcher_problem(os.environ, horovod_size, initialized)
    if problem:
        if not _compat.HOROVOD:
            _compat.require_horovod(f"{problem.split(', but ')[0]}: a job of several processes")
        raise LauncherMismatchError(problem)


def is_elastic():
    """True under `horovodrun --min-np/--max-np` (Horovod sets HOROVOD_ELASTIC): the size may change later."""
    return bool(int(os.environ.get("HOROVOD_ELASTIC", "0") or 0))


def xla_ops_enabled():
    """True when the user turned Horovod's own XLA ops on (then an XLA-compiled step is theirs to try)."""
    return os.environ.get("HOROVOD_ENABLE_XLA_OPS", "").strip().lower() in ("1", "true", "yes", "on")


def is_adasum(op):
    """True where `op` is Horovod's Adasum reduction."""
    if op is None:
        return False
    import horovod.tensorflow as hvd

    return op is not None and op == hvd.Adasum


def adasum_problem(op, process_set=None, groups=None):
    """Why `op` cannot run in this job, or None (always None for ops other than Adasum).

    Horovod's Adasum runs over MPI: it needs a Horovod built with MPI and, on more than one rank, a job whose
    controller is MPI (`mpirun`, `horovodrun --mpi`, `srun --mpi=pmix`; under `horovodrun --gloo`
    `hvd.mpi_enabled()` is False and Horovod would fail in the first step: "No Adasum operation enabled"). On CPU
    tensors Horovod's Adasum needs a power-of-two number of ranks and the global process set. Each gradient is
    reduced on its own (Horovod's grouped allreduce has no Adasum), so `groups` cannot apply.
    """
    import horovod.tensorflow as hvd

    if not is_adasum(op):
        return None
    if not hvd.mpi_built():
        return ("op=hvd.Adasum needs a Horovod built with MPI (HOROVOD_WITH_MPI=1; Horovod's Adasum runs over "
                "MPI), and this Horovod has none (hvd.mpi_built() is False); rebuild it with scripts/install.sh "
                "(HVD_SCHED_MPI=1, the default) or use op=hvd.Average")
    if groups:
        return (f"op=hvd.Adasum reduces each gradient on its own (Horovod's grouped allreduce has no Adasum); "
                f"leave groups out, got groups={groups!r}")
    if process_set is not None and process_set != hvd.global_process_set:
        return "op=hvd.Adasum needs the global process set (Horovod: not supported on other process sets yet)"
    if hvd.is_initialized() and hvd.size() > 1 and not is_elastic():
        if not hvd.mpi_enabled():
            return ("op=hvd.Adasum runs over MPI, and this job's Horovod controller is Gloo (hvd.mpi_enabled() is "
                    "False: started with `horovodrun --gloo`?); start the job with `mpirun -np N`, `horovodrun "
                    "--mpi` or `srun --mpi=pmix`, or use op=hvd.Average")
        size = hvd.size()
        if size & (size - 1):
            return (f"op=hvd.Adasum on CPU tensors needs a power-of-two number of ranks (Horovod), got "
                    f"{size}; use 2, 4, 8, ... ranks or op=hvd.Average")
    elif is_elastic():
        return "op=hvd.Adasum needs MPI, and elastic Horovod runs on Gloo; use op=hvd.Average in elastic jobs"
    return None


def average_gradients(grads, variables=None, *, op=None, compression=None, sparse_as_dense=False,
                      gradient_predivide_factor=1.0, postscale=1.0, groups=None, process_set=None,
                      device_dense="", device_sparse="", name="hvd_sched_grads"):
    """`grads` reduced over the Horovod ranks (averaged by default), None kept where it was.

    Horovod's meanings, as in its Keras `DistributedOptimizer`: `op` (Average, Sum or Adasum; default Average),
    `gradient_predivide_factor` f (with Average: scaled by 1/f before the sum and by f/size after it),
    `compression`, `sparse_as_dense` (sparse gradients are allgathered by Horovod otherwise), `process_set`,
    `device_dense` / `device_sparse`. The gradients go in one `grouped_allreduce` per dtype, or, with `groups`,
    per group and dtype: an int > 0 splits them into that many groups (Horovod's `split_list`), a list of lists
    of variables (`variables` gives the variable of each gradient) puts each list in one group and every other
    gradient in a group of its own. `postscale` multiplies the result once more (the sum over micro-batches of
    an accumulation that is not averaged: Keras 3 averages them first).

    With one rank and no elastic mode nothing is emitted (the step then has no Horovod op, and can be
    XLA-compiled); only `postscale` is applied.
    """
    import horovod.tensorflow as hvd
    import tensorflow as tf

    grads = list(grads)
    process_set = hvd.global_process_set if process_set is None else process_set
    if process_set.size() == 1 and not is_elastic():
        return [g if g is None or postscale == 1.0 else g * tf.cast(postscale, g.dtype) for g in grads]
    op = hvd.Average if op is None else op
    if sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    # Horovod's split of an average into a prescale and a postscale (its C++ side divides by the size).
    averaging = op == hvd.Average
    prescale, after = (1.0 / gradient_predivide_factor, gradient_predivide_factor) if averaging else (1.0, 1.0)
    reduced = list(grads)
    if is_adasum(op):
        # Horovod's grouped allreduce has no Adasum (horovod/tensorflow/__init__.py: UnboundLocalError); each
        # tensor is reduced on its own, as Horovod's own Keras 2 wrapper does without groups.
        for i, grad in enumerate(grads):
            if grad is None:
                continue
            value = hvd.allreduce(grad, op=op, process_set=process_set, device_dense=device_dense,
                                  device_sparse=device_sparse, compression=compression or hvd.Compression.none,
                                  name=f"{name}_adasum_{i}")
            reduced[i] = value if postscale == 1.0 else value * tf.cast(postscale, value.dtype)
        return reduced
    for number, indices in enumerate(_groups(grads, variables, groups)):
        dtype = grads[indices[0]].dtype
        values = hvd.grouped_allreduce([grads[i] for i in indices], op=op, prescale_factor=prescale,
                                       postscale_factor=after * postscale, process_set=process_set,
                                       compression=compression or hvd.Compression.none, device_dense=device_dense,
                                       device_sparse=device_sparse, name=f"{name}_{dtype.name}_{number}")
        for i, value in zip(indices, values):
            reduced[i] = value
    return reduced


def _groups(grads, variables, groups):
    """Lists of positions of `grads` (not None) reduced together, each of one dtype, in a rank-independent order."""
    present = [i for i, g in enumerate(grads) if g is not None]
    if isinstance(groups, (list, tuple)):
        if variables is None:
            raise ValueError("groups given as lists of variables need the variables of the gradients")
        position = {id(_backing(v)): i for i, v in enumerate(variables) if grads[i] is not None}
        chosen = [[position.pop(id(_backing(v))) for v in group if id(_backing(v)) in position] for group in groups]
        parts = [part for part in chosen if part] + [[i] for i in present if i in position.values()]
    elif groups:
        size, extra = divmod(len(present), int(groups))
        parts, start = [], 0
        for number in range(int(groups)):  # Horovod's split_list: the first `extra` groups one longer
            end = start + size + (1 if number < extra else 0)
            parts.append(present[start:end])
            start = end
        parts = [part for part in parts if part]
    else:
        parts = [present]
    split = []
    for part in parts:
        by_dtype = {}
        for i in part:
            by_dtype.setdefault(grads[i].dtype.name, []).append(i)
        split.extend(by_dtype[name] for name in sorted(by_dtype))
    return split


def _backing(variable):
    """The tf.Variable behind a Keras 3 variable (its `value`), or the variable itself."""
    value = getattr(variable, "value", None)
    return value if value is not None and hasattr(value, "handle") else variable
