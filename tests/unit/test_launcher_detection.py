"""hvd_sched.launchers: which launcher started a process as one of how many, and when that disagrees with Horovod.

Each environment below is what that launcher sets (seen here for horovodrun, Open MPI 5's mpirun, Slurm 22.05's
srun and sbatch; from the launchers' documentation for MVAPICH2, MPICH/Intel MPI Hydra and jsrun). The real
launches are in tests/multirank/test_launchers.py.
"""

import doctest

import pytest

from hvd_sched import launchers
from hvd_sched.launchers import Launcher, launcher_of, launcher_problem

HOROVODRUN = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "x"}
OPEN_MPI = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "PMIX_RANK": "1", "PMIX_NAMESPACE": "prterun-vm-1@1"}
MVAPICH = {"MV2_COMM_WORLD_SIZE": "4", "MV2_COMM_WORLD_RANK": "3"}
HYDRA = {"PMI_SIZE": "4", "PMI_RANK": "2", "MPI_LOCALNRANKS": "4"}
JSRUN = {"JSM_NAMESPACE_SIZE": "6", "JSM_NAMESPACE_RANK": "5"}
SRUN_STEP = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2",
             "SLURM_PROCID": "1"}
SRUN_PMI2 = {**SRUN_STEP, "PMI_SIZE": "2", "PMI_RANK": "1", "PMI_FD": "5"}
SRUN_PMIX = {**SRUN_STEP, "PMIX_RANK": "1", "PMIX_NAMESPACE": "slurm.pmix.7.0"}
SBATCH_SCRIPT = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_NPROCS": "2"}


@pytest.mark.parametrize("environ, expected", [
    ({}, None),
    (HOROVODRUN, Launcher("horovodrun", 2, 1, "HOROVOD_SIZE")),
    (OPEN_MPI, Launcher("Open MPI's mpirun", 2, 1, "OMPI_COMM_WORLD_SIZE")),
    (MVAPICH, Launcher("MVAPICH2's launcher", 4, 3, "MV2_COMM_WORLD_SIZE")),
    (HYDRA, Launcher("a PMI launcher (MPICH or Intel MPI mpirun/mpiexec, or srun --mpi=pmi2)", 4, 2, "PMI_SIZE")),
    (JSRUN, Launcher("IBM jsrun", 6, 5, "JSM_NAMESPACE_SIZE")),
    (SRUN_STEP, Launcher("Slurm's srun", 2, 1, "SLURM_STEP_NUM_TASKS")),
    (SRUN_PMI2, Launcher("Slurm's srun --mpi=pmi2", 2, 1, "PMI_SIZE")),
    (SRUN_PMIX, Launcher("Slurm's srun", 2, 1, "SLURM_STEP_NUM_TASKS")),
    # The batch script of sbatch is one process, not one of the allocation's SLURM_NTASKS.
    (SBATCH_SCRIPT, None),
    # The innermost launcher: mpirun or horovodrun started inside a Slurm allocation or step sets its own size.
    ({**SBATCH_SCRIPT, **OPEN_MPI}, Launcher("Open MPI's mpirun", 2, 1, "OMPI_COMM_WORLD_SIZE")),
    ({**SRUN_STEP, "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0", **{**HOROVODRUN, "HOROVOD_SIZE": "4"}},
     Launcher("horovodrun", 4, 1, "HOROVOD_SIZE")),
    # horovodrun --mpi: Open MPI's variables (horovodrun sets none of its own there).
    ({**OPEN_MPI, "HOROVOD_HOSTNAME": "localhost"}, Launcher("Open MPI's mpirun", 2, 1, "OMPI_COMM_WORLD_SIZE")),
    # Elastic horovodrun: the size changes while the job runs; Horovod's is the truth.
    ({**HOROVODRUN, "HOROVOD_ELASTIC": "1"}, None),
    # Values that are no count are no launcher.
    ({"OMPI_COMM_WORLD_SIZE": ""}, None), ({"OMPI_COMM_WORLD_SIZE": "two"}, None), ({"PMI_SIZE": "0"}, None),
    ({"OMPI_COMM_WORLD_SIZE": " 2 "}, Launcher("Open MPI's mpirun", 2, None, "OMPI_COMM_WORLD_SIZE")),
])
def test_launcher_of(environ, expected):
    assert launcher_of(environ) == expected


@pytest.mark.parametrize("environ", [{}, HOROVODRUN, OPEN_MPI, SRUN_STEP, SRUN_PMIX, SBATCH_SCRIPT,
                                     {"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"}])
def test_agreeing_sizes_and_single_processes_pass(environ):
    launcher = launcher_of(environ)
    assert launcher_problem(environ, launcher.size if launcher else 1) is None


def test_mpirun_around_a_horovod_that_did_not_join():
    message = launcher_problem(OPEN_MPI, horovod_size=1)
    assert message == (
        "hvd_sched: Open MPI's mpirun started this process as one of 2 (OMPI_COMM_WORLD_SIZE=2, rank 1), but Horovod "
        "joined 1 (hvd.size() == 1): each process would train alone as rank 0 of 1, on the whole data set, and "
        "write the same checkpoints. Fix: build Horovod with MPI, against the MPI of this launcher "
        "(scripts/install.sh does so by default, HVD_SCHED_MPI=1; `horovodrun --check-build` must show [X] MPI), "
        "or launch with `horovodrun -np N --gloo` instead; see the README, \"Launching\".")


@pytest.mark.parametrize("environ", [SRUN_STEP, SRUN_PMI2])
def test_an_srun_step_that_horovod_did_not_join_names_pmix(environ):
    message = launcher_problem(environ, horovod_size=1)
    assert "started this process as one of 2" in message and "Horovod joined 1" in message
    assert "Fix: start the step with `srun --mpi=pmix`" in message
    assert "or run `horovodrun -np N` or `mpirun -np N` inside the allocation" in message


def test_other_mismatches_and_an_uninitialised_horovod():
    assert "Horovod joined 4 (hvd.size() == 4): the ranks would not be the processes the launcher started" in \
        launcher_problem(HYDRA | {"PMI_SIZE": "8"}, horovod_size=4)
    assert "do not copy HOROVOD_* variables by hand" in launcher_problem(HOROVODRUN, horovod_size=1)
    message = launcher_problem(OPEN_MPI, horovod_size=1, initialized=False)
    assert message.startswith("hvd_sched: Open MPI's mpirun started this process as one of 2")
    assert "Horovod is not initialised in it; call hvd.init() first" in message
    assert launcher_problem({}, horovod_size=1, initialized=False) is None


def test_the_environment_is_read_not_changed():
    environ = dict(OPEN_MPI)
    launcher_problem(environ, 1)
    assert environ == OPEN_MPI


def test_doctests():
    assert doctest.testmod(launchers).failed == 0
