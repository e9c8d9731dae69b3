"""One source of truth for the pinned stack: scripts/versions.env, setup.py, docker/ and the installed packages agree.

Nothing here builds an image (no Docker daemon on the development machines); it reads the files.
"""

import importlib.metadata
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCKERFILES = {"gpu": ROOT / "docker" / "Dockerfile", "cpu": ROOT / "docker" / "Dockerfile.cpu"}
PINNED = ("PYTHON_VERSION", "TENSORFLOW_VERSION", "HOROVOD_VERSION")


def _versions_env():
    values = {}
    for line in (ROOT / "scripts" / "versions.env").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip().strip("\"'")
    return values


def _setup_constant(name):
    match = re.search(rf'^{name} = "([^"]+)"$', (ROOT / "setup.py").read_text(), re.MULTILINE)
    assert match, f"setup.py has no {name} constant"
    return match.group(1)


def _dockerfile_args(path):
    """Every `ARG NAME=default` of a Dockerfile (the last one wins, as for Docker's own re-declarations)."""
    return dict(re.findall(r"^ARG\s+(\w+)=(\S+)\s*$", path.read_text(), re.MULTILINE))


def _run_lines(path):
    """The Dockerfile's instructions with line continuations joined."""
    return re.sub(r"\\\n", " ", path.read_text()).splitlines()


ENV = _versions_env()


def test_versions_env_pins_the_stack():
    assert {"PYTHON_VERSION", "TENSORFLOW_VERSION", "TENSORFLOW_CPU_VERSION", "HOROVOD_VERSION"} <= set(ENV)
    assert ENV["TENSORFLOW_CPU_VERSION"] == ENV["TENSORFLOW_VERSION"]
    assert ENV["NUMPY_SPEC"] == "numpy<2"  # TensorFlow 2.15 is built against numpy 1.x


def test_setup_py_constants_equal_versions_env():
    assert _setup_constant("TENSORFLOW_VERSION") == ENV["TENSORFLOW_VERSION"]
    assert _setup_constant("HOROVOD_VERSION") == ENV["HOROVOD_VERSION"]
    major, minor = ENV["PYTHON_VERSION"].split(".")
    assert f'python_requires=">={major}.{minor},<{major}.{int(minor) + 1}"' in (ROOT / "setup.py").read_text()


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
@pytest.mark.parametrize("name", PINNED)
def test_dockerfile_arg_defaults_equal_versions_env(kind, name):
    args = _dockerfile_args(DOCKERFILES[kind])
    assert args.get(name) == ENV[name], f"{DOCKERFILES[kind].name}: ARG {name}={args.get(name)}, " \
                                        f"versions.env {name}={ENV[name]}"


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfiles_install_with_the_one_install_script(kind):
    lines = _run_lines(DOCKERFILES[kind])
    installs = [line for line in lines if line.startswith("RUN") and "scripts/install.sh" in line]
    assert len(installs) == 1, f"{DOCKERFILES[kind].name} must run scripts/install.sh exactly once"
    assert "HVD_SCHED_SYSTEM=1" in installs[0]
    assert ("HVD_SCHED_GPU=1" in installs[0]) == (kind == "gpu")
    # No second source of versions: pip never installs TensorFlow or Horovod outside install.sh.
    assert not [line for line in lines if re.search(r"pip\d?\s+install.*(tensorflow|horovod)", line)]
    assert any(line.startswith("COPY scripts/") for line in lines)
    assert "scripts/install.sh" in (ROOT / "Makefile").read_text()


def test_gpu_base_image_is_cuda_12_2_with_cudnn_8():
    base = _dockerfile_args(DOCKERFILES["gpu"])["CUDA_IMAGE"]
    # TensorFlow 2.15's tested GPU build: CUDA 12.2, cuDNN 8.9 (the cudnn8 12.2.2 image ships cuDNN 8.9.x and
    # libnccl-dev 2.19 for HOROVOD_GPU_OPERATIONS=NCCL).
    assert re.fullmatch(r"nvidia/cuda:12\.2\.\d+-cudnn8-devel-ubuntu22\.04", base), base
    assert "FROM ${CUDA_IMAGE}" in DOCKERFILES["gpu"].read_text()


def test_cpu_base_image_is_the_pinned_python():
    base = _dockerfile_args(DOCKERFILES["cpu"])["PYTHON_IMAGE"]
    assert re.fullmatch(rf"python:{re.escape(ENV['PYTHON_VERSION'])}-slim(-\w+)?", base), base
    assert "FROM ${PYTHON_IMAGE}" in DOCKERFILES["cpu"].read_text()


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfiles_run_horovodrun_from_the_repository(kind):
    text = DOCKERFILES[kind].read_text()
    assert "WORKDIR /opt/hvd_sched" in text and "COPY examples/ examples/" in text
    assert "ENTRYPOINT" not in text  # `docker run IMAGE horovodrun -np 4 python examples/train_keras.py` as typed
    assert 'CMD ["horovodrun", "--check-build"]' in text


@pytest.mark.parametrize("dist, key", [("tensorflow-cpu", "TENSORFLOW_CPU_VERSION"), ("horovod", "HOROVOD_VERSION")])
def test_installed_packages_match_the_pins(dist, key):
    try:
        installed = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{dist} is not installed here (e.g. a GPU image has tensorflow instead)")
    assert installed == ENV[key]
