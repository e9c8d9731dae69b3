"""Which launcher started this process, and as one of how many: read from the environment, nothing imported.

A cluster starts a Horovod job with `horovodrun`, `mpirun`, `srun` (Slurm) or `jsrun` (LSF). Each tells the
processes it starts how many they are, in variables of its own. Horovod joins them only where it can talk to that
launcher: a Horovod built without MPI under `mpirun`, or a Slurm step whose PMI Horovod's MPI cannot use
(`srun` without `--mpi=pmix`), starts N processes that each initialise as rank 0 of 1 and train alone, writing the
same checkpoints. `launcher_problem` compares the launcher's count with Horovod's (`hvd.size()`), and says what is
wrong and how to fix it; `hvd_sched.keras` raises it before the first step.

The variables, innermost launcher first (a launcher started inside another's allocation sets its own, and the
innermost one started this process):

| launcher | size / rank variables |
| --- | --- |
| `horovodrun` (Gloo) | `HOROVOD_SIZE` / `HOROVOD_RANK` (skipped in elastic mode, where the size changes) |
| Open MPI `mpirun` (also under `horovodrun --mpi`) | `OMPI_COMM_WORLD_SIZE` / `OMPI_COMM_WORLD_RANK` |
| MVAPICH2 | `MV2_COMM_WORLD_SIZE` / `MV2_COMM_WORLD_RANK` |
| MPICH / Intel MPI (Hydra), Slurm's `--mpi=pmi2` | `PMI_SIZE` / `PMI_RANK` |
| IBM `jsrun` | `JSM_NAMESPACE_SIZE` / `JSM_NAMESPACE_RANK` |
| Slurm `srun` (a job step's task) | `SLURM_STEP_NUM_TASKS` / `SLURM_PROCID` |

Slurm: only a *step's* tasks are "one of N". The batch script of `sbatch` (and `salloc`'s shell) has
`SLURM_NTASKS`, the allocation's task count, but is a single process: it has no `SLURM_STEP_NUM_TASKS`, or the
batch step's, which is 1. PMIx (`srun --mpi=pmix`, Open MPI 5) exports no size of its own; the launcher's
variables above carry it.

Example:
    >>> launcher_of({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"})
    Launcher(name="Open MPI's mpirun", size=2, rank=1, variable='OMPI_COMM_WORLD_SIZE')
    >>> launcher_problem({"OMPI_COMM_WORLD_SIZE": "2"}, horovod_size=2) is None
    True
"""

import collections

__all__ = ["Launcher", "launcher_of", "launcher_problem", "LAUNCHER_VARIABLES"]

Launcher = collections.namedtuple("Launcher", ["name", "size", "rank", "variable"])
Launcher.__doc__ = "The launcher that started this process: its name, how many it started, this one's rank."

# (name, size variable, rank variable), innermost launcher first.
LAUNCHER_VARIABLES = (
    ("horovodrun", "HOROVOD_SIZE", "HOROVOD_RANK"),
    ("Open MPI's mpirun", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
    ("MVAPICH2's launcher", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK"),
    ("a PMI launcher (MPICH or Intel MPI mpirun/mpiexec, or srun --mpi=pmi2)", "PMI_SIZE", "PMI_RANK"),
    ("IBM jsrun", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_RANK"),
    ("Slurm's srun", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID"),
)


def _count(environ, name):
    """The positive int in `environ[name]`, or None where it is absent or not one (a launcher never sets 0)."""
    value = str(environ.get(name, "")).strip()
    try:
        number = int(value)
    except ValueError:
        return None
    return number if number >= 1 else None


def launcher_of(environ):
    """The innermost launcher whose variables `environ` holds, as a `Launcher`, or None (a plain `python` run).

    Args:
        environ: a mapping of environment variables (`os.environ`).

    Returns:
        `Launcher(name, size, rank, variable)`; `rank` is None where the launcher's rank variable is absent.
        horovodrun's own variables are skipped in elastic mode (`HOROVOD_ELASTIC=1`: ranks come and go, and
        Horovod's size is the truth).
    """
    elastic = str(environ.get("HOROVOD_ELASTIC", "0")).strip() not in ("", "0")
    for name, size_var, rank_var in LAUNCHER_VARIABLES:
        if elastic and size_var == "HOROVOD_SIZE":
            continue
        size = _count(environ, size_var)
        if size is None:
            continue
        rank_text = str(environ.get(rank_var, "")).strip()
        rank = int(rank_text) if rank_text.isdigit() else None
        if size_var == "PMI_SIZE" and environ.get("SLURM_STEP_ID") is not None:
            name = "Slurm's srun --mpi=pmi2"
        return Launcher(name, size, rank, size_var)
    return None


def _fix(launcher):
    if launcher.variable == "SLURM_STEP_NUM_TASKS" or launcher.name.startswith("Slurm"):
        return ("start the step with `srun --mpi=pmix` (Horovod built with MPI joins a PMIx step; `srun --mpi=list` "
                "shows what this Slurm has), or run `horovodrun -np N` or `mpirun -np N` inside the allocation; "
                "see the README, \"Launching\"")
    if launcher.variable == "HOROVOD_SIZE":
        return "start every process with the same `horovodrun` command (do not copy HOROVOD_* variables by hand)"
    return ("build Horovod with MPI, against the MPI of this launcher (scripts/install.sh does so by default, "
            "HVD_SCHED_MPI=1; `horovodrun --check-build` must show [X] MPI), or launch with `horovodrun -np N "
            "--gloo` instead; see the README, \"Launching\"")


def launcher_problem(environ, horovod_size, initialized=True):
    """Why this process must not train, or None: its launcher started N > 1 processes that Horovod did not join.

    Args:
        environ: a mapping of environment variables (`os.environ`).
        horovod_size: `hvd.size()` (ignored where `initialized` is False).
        initialized: whether Horovod is initialised (`hvd.is_initialized()`).

    Returns:
        A message naming the launcher, its variable, both sizes and the fix; None where they agree, where no
        launcher started several processes, or in horovodrun's elastic mode.
    """
    launcher = launcher_of(environ)
    if launcher is None or launcher.size <= 1:
        return None
    where = f"{launcher.name} started this process as one of {launcher.size} ({launcher.variable}=" \
            f"{launcher.size}{'' if launcher.rank is None else f', rank {launcher.rank}'})"
    if not initialized:
        return (f"hvd_sched: {where}, but Horovod is not initialised in it; call hvd.init() first (before "
                "building the optimizer and the callbacks)")
    if horovod_size == launcher.size:
        return None
    alone = ("each process would train alone as rank 0 of 1, on the whole data set, and write the same checkpoints"
             if horovod_size == 1 else "the ranks would not be the processes the launcher started")
    return (f"hvd_sched: {where}, but Horovod joined {horovod_size} (hvd.size() == {horovod_size}): {alone}. "
            f"Fix: {_fix(launcher)}.")
