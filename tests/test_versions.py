"""One source of truth for the pinned stacks: scripts/versions.env, pyproject.toml, docker/ and the installed packages
agree.

Every row of the support matrix (STACKS in versions.env) is checked; the default row's pins are the unprefixed
names, another row's are STACK_<row>_<NAME> there and ARG HVD_SCHED_<NAME>_<row> in the Dockerfiles (row
`tf2.21` -> `tf2_21`; the HVD_SCHED_ prefix because a base image's ENV of the same name,
e.g. the python images' PYTHON_VERSION=3.11.x, shadows a stage's ARG under podman/buildah). Nothing here builds
an image (no Docker daemon on the development machines); it reads the files.
"""

import ast
import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement

import rows

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCKERFILES = {"gpu": ROOT / "docker" / "Dockerfile", "cpu": ROOT / "docker" / "Dockerfile.cpu"}
PINNED = ("PYTHON_VERSION", "TENSORFLOW_VERSION", "HOROVOD_VERSION")
DOCKER_ARG_PREFIX = "HVD_SCHED_"  # the stages' ARGs: PINNED names with this prefix
# Version ENVs the base images set (python:3.x-slim: PYTHON_VERSION, PYTHON_SHA256, GPG_KEY; nvidia/cuda:
# CUDA_VERSION, NCCL_VERSION, NV_CUDNN_VERSION, ...): a stage's ARG of one of these names is shadowed under
# podman/buildah, so `${NAME}` there means the base image's value, never the pin; the pins' old unprefixed names
# are listed too. (PATH is extended on purpose.)
BASE_IMAGE_ENV = ("PYTHON_VERSION", "PYTHON_SHA256", "GPG_KEY", "CUDA_VERSION", "CUDNN_VERSION", "NCCL_VERSION",
                  "TENSORFLOW_VERSION", "HOROVOD_VERSION")


def _versions_env():
    values = {}
    for line in (ROOT / "scripts" / "versions.env").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip().strip("\"'")
    return values


PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# The Pythons scripts/package_check.sh installs the wheel on without TensorFlow (CI): with the rows' own Pythons,
# what requires-python may admit.
PACKAGE_CHECK = ROOT / "scripts" / "package_check.sh"


def _package_check_pythons():
    match = re.search(r'^PYTHONS="([^"]+)"', PACKAGE_CHECK.read_text(), re.MULTILINE)
    assert match, "scripts/package_check.sh has no PYTHONS=\"...\" line"
    return match.group(1).split()


def _requirements():
    """Every requirement of pyproject.toml: (extra or None, packaging Requirement)."""
    found = [(None, Requirement(text)) for text in PYPROJECT["dependencies"]]
    for extra, texts in PYPROJECT["optional-dependencies"].items():
        found += [(extra, Requirement(text)) for text in texts]
    return found


def _dockerfile_args(path):
    """Every `ARG NAME=default` of a Dockerfile (the last one wins, as for Docker's own re-declarations)."""
    return dict(re.findall(r"^ARG\s+(\w+)=(\S+)\s*$", path.read_text(), re.MULTILINE))


def _stage_args(path):
    """The names of the ARGs declared inside build stages (after the first FROM), where a base image's ENV wins."""
    text = path.read_text()
    stages = text[re.search(r"^FROM ", text, re.MULTILINE).start():]
    return re.findall(r"^ARG\s+(\w+)", stages, re.MULTILINE)


def _run_lines(path):
    """The Dockerfile's instructions with line continuations joined."""
    return re.sub(r"\\\n", " ", path.read_text()).splitlines()


ENV = _versions_env()
STACKS = ENV["STACKS"].split()
DEFAULT = STACKS[0]
ROW_VARS = ("PYTHON_VERSION", "TENSORFLOW_CPU_VERSION", "TENSORFLOW_VERSION", "TF_KERAS_VERSION", "KERAS_VERSION",
            "HOROVOD_VERSION", "NUMPY_SPEC", "HOROVOD_NO_XLA", "LEGACY_KERAS", "CUDA_VERSION", "CUDNN_VERSION",
            "CUDA_IMAGE", "TEST_MARKS")


def _suffix(stack):
    return stack.replace(".", "_").replace("-", "_")


def _row(stack):
    """The pins of one row: the default's, overridden by STACK_<row>_<NAME>."""
    if stack == DEFAULT:
        return {var: ENV[var] for var in ROW_VARS}
    return {var: ENV.get(f"STACK_{_suffix(stack)}_{var}", ENV[var]) for var in ROW_VARS}


def _row_name(name, stack, upper=False):
    """How a pin is spelled for a row outside versions.env: NAME for the default, NAME_<row> otherwise."""
    if stack == DEFAULT:
        return name
    return f"{name}_{_suffix(stack).upper() if upper else _suffix(stack)}"


def _running_stack():
    """The row this interpreter belongs to: HVD_SCHED_STACK (the Makefile exports it), else the row whose virtual
    environment this is (.venv, .venv-NAME), else by Python version and, where two rows share a Python (tf2.21,
    keras3), by TF_USE_LEGACY_KERAS."""
    if os.environ.get("HVD_SCHED_STACK") in STACKS:
        return os.environ["HVD_SCHED_STACK"]
    venv = pathlib.Path(sys.prefix).name
    for stack in STACKS:
        if venv == (".venv" if stack == DEFAULT else f".venv-{stack}"):
            return stack
    python = "%d.%d" % sys.version_info[:2]
    candidates = [stack for stack in STACKS if _row(stack)["PYTHON_VERSION"] == python]
    legacy = "1" if os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True") else "0"
    return next((stack for stack in candidates if _row(stack)["LEGACY_KERAS"] == legacy),
                candidates[0] if candidates else DEFAULT)


def test_versions_env_pins_the_stack():
    assert {"PYTHON_VERSION", "TENSORFLOW_VERSION", "TENSORFLOW_CPU_VERSION", "HOROVOD_VERSION"} <= set(ENV)
    assert ENV["TENSORFLOW_CPU_VERSION"] == ENV["TENSORFLOW_VERSION"]
    assert ENV["NUMPY_SPEC"] == "numpy<2"  # TensorFlow 2.15 is built against numpy 1.x


def test_requires_python_spans_exactly_what_is_tested():
    # From the oldest Python the wheel is installed and tested on (package_check.sh, the schedule half) to the
    # newest row's; every row's Python is inside.
    tested = {tuple(map(int, version.split("."))) for version in _package_check_pythons()}
    tested |= {tuple(map(int, _row(stack)["PYTHON_VERSION"].split("."))) for stack in STACKS}
    (low_major, low_minor), (high_major, high_minor) = min(tested), max(tested)
    assert PYPROJECT["requires-python"] == f">={low_major}.{low_minor},<{high_major}.{high_minor + 1}"
    listed = {c.rsplit(" :: ", 1)[-1] for c in PYPROJECT["classifiers"]
              if c.startswith("Programming Language :: Python :: 3.")}
    assert listed == {f"{major}.{minor}" for major, minor in tested}


def test_stacks_rows_are_complete_and_the_default_is_first():
    assert DEFAULT == "tf2.15" and len(STACKS) == len(set(STACKS)) >= 2
    for stack in STACKS:
        row = _row(stack)
        assert row["TENSORFLOW_CPU_VERSION"] == row["TENSORFLOW_VERSION"], stack
        major_minor = tuple(int(part) for part in row["TENSORFLOW_VERSION"].split(".")[:2])
        if major_minor >= (2, 16):
            # TensorFlow >= 2.16 depends on Keras 3 on every row: pinned. Keras 2 only as tf-keras of the same minor
            # version with TF_USE_LEGACY_KERAS=1 (LEGACY_KERAS=1); a Keras 3 row has no tf-keras at all.
            assert row["KERAS_VERSION"].split(".")[0] == "3", stack
            assert row["LEGACY_KERAS"] in ("0", "1"), stack
            if row["LEGACY_KERAS"] == "1":
                assert row["TF_KERAS_VERSION"].split(".")[:2] == row["TENSORFLOW_VERSION"].split(".")[:2], stack
            else:
                assert row["TF_KERAS_VERSION"] == "", stack
        else:
            # Keras 2 built in, its `keras` package pinned by TensorFlow itself.
            assert row["TF_KERAS_VERSION"] == "" and row["LEGACY_KERAS"] == "0", stack
            assert row["KERAS_VERSION"] == "", stack
        assert row["HOROVOD_NO_XLA"] in ("0", "1"), stack
        if stack != DEFAULT:
            assert any(f"STACK_{_suffix(stack)}_" in key for key in ENV), f"row {stack} has no pins of its own"


@pytest.mark.parametrize("stack", STACKS)
def test_stack_sh_resolves_rows_as_this_test_does(stack):
    printed = subprocess.run(["bash", str(ROOT / "scripts" / "stack.sh"), stack], capture_output=True, text=True,
                             check=True).stdout
    assert dict(line.split("=", 1) for line in printed.splitlines()) == _row(stack)
    venv = subprocess.run(["bash", str(ROOT / "scripts" / "stack.sh"), stack, "--venv"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert venv == (".venv" if stack == DEFAULT else f".venv-{stack}")


def test_the_keras3_row_is_keras_3_on_the_tf2_21_rows_horovod_wheel():
    keras3, tf2_21 = _row("keras3"), _row("tf2.21")
    assert keras3["LEGACY_KERAS"] == "0" and keras3["TF_KERAS_VERSION"] == "" and keras3["KERAS_VERSION"] == "3.15.1"
    # install.sh's wheel key is made of these and nothing row-specific, so the two rows share one built wheel
    # (horovod-0.28.1-noxla-tf2.21.0-py3.13-gloo-x86_64).
    for var in ("PYTHON_VERSION", "TENSORFLOW_VERSION", "HOROVOD_VERSION", "HOROVOD_NO_XLA", "KERAS_VERSION"):
        assert keras3[var] == tf2_21[var], var
    key_line = next(line for line in (ROOT / "scripts" / "install.sh").read_text().splitlines()
                    if line.startswith("key="))
    assert set(re.findall(r"\$(\w+)", key_line)) == {"HOROVOD_VERSION", "src_change", "TENSORFLOW_VERSION",
                                                     "PYTHON_VERSION", "hvd_ops"}, key_line


def test_pyproject_never_installs_tensorflow_tf_keras_or_horovod():
    """A user's tensorflow / tensorflow-cpu / tensorflow[and-cuda] is kept: naming any TensorFlow distribution (or
    tf-keras, which depends on `tensorflow`) would make pip add a second copy of the module; Horovod must be built
    against the installed TensorFlow. Ranges only, never ==."""
    for extra, requirement in _requirements():
        name = requirement.name.lower().replace("_", "-")
        assert not (name.startswith("tensorflow") or name in ("tf-keras", "tf-nightly", "horovod")), (extra, name)
        assert all(spec.operator not in ("==", "===") for spec in requirement.specifier), (extra, str(requirement))


def test_setup_py_is_three_lines_and_pyproject_keeps_the_metadata():
    """The top-level setup.py of the design: `setup()` with no argument (pips without PEP 660 `pip install -e .`
    through it), so pyproject.toml stays the one place of the name, version, dependencies and packages."""
    text = (ROOT / "setup.py").read_text()
    assert len(text.splitlines()) == 3, text
    tree = ast.parse(text)
    imports = [(n.module, [a.name for a in n.names]) for n in tree.body if isinstance(n, ast.ImportFrom)]
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert imports == [("setuptools", ["setup"])] and len(tree.body) == 2, ast.dump(tree)
    assert [c.func.id for c in calls] == ["setup"] and not calls[0].args and not calls[0].keywords
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    assert build["build-backend"] == "setuptools.build_meta"
    assert PYPROJECT["name"] == "hvd_sched" and PYPROJECT["dynamic"] == ["version"]


def test_setup_py_reads_name_and_version_from_pyproject(tmp_path):
    """`python setup.py --name --version` (setuptools reading pyproject.toml), in a copy: nothing written here."""
    pytest.importorskip("setuptools")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "hvd_sched", tmp_path / "hvd_sched", ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([sys.executable, "setup.py", "--name", "--version"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    version = re.search(r'__version__ = "([^"]+)"', (ROOT / "hvd_sched" / "_version.py").read_text()).group(1)
    assert out[-2:] == ["hvd_sched", version], out


@pytest.mark.parametrize("stack", STACKS)
def test_pyproject_admits_every_rows_pins(stack):
    """The pins scripts/install.sh installs for a row satisfy the package's own ranges, so pip keeps them."""
    row = _row(stack)
    requirements = {requirement.name: requirement for _, requirement in _requirements()}
    numpy_row = Requirement(row["NUMPY_SPEC"])
    # numpy 1.26 (TensorFlow 2.15's) and a numpy 2, where the row's own range takes them.
    for numpy in ("1.26.4", "2.3.5"):
        if numpy_row.specifier.contains(numpy):
            assert requirements["numpy"].specifier.contains(numpy), (stack, numpy)
    if row["KERAS_VERSION"] and row["LEGACY_KERAS"] == "0":
        [keras] = [Requirement(text) for text in PYPROJECT["optional-dependencies"]["keras3"]]
        assert keras.name == "keras" and keras.specifier.contains(row["KERAS_VERSION"]), stack


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
@pytest.mark.parametrize("stack", STACKS)
def test_dockerfile_rows_equal_versions_env(kind, stack):
    args = _dockerfile_args(DOCKERFILES[kind])
    text = DOCKERFILES[kind].read_text()
    assert args["STACK"] == DEFAULT
    assert re.search(rf"^FROM \S+ AS stack-{re.escape(stack)}$", text, re.MULTILINE), f"no stage for {stack}"
    for name in PINNED:
        arg = _row_name(DOCKER_ARG_PREFIX + name, stack)
        assert args.get(arg) == _row(stack)[name], f"{DOCKERFILES[kind].name}: ARG {arg}={args.get(arg)}, " \
                                                 f"versions.env {stack} {name}={_row(stack)[name]}"
    assert "FROM stack-${STACK}" in text


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_stage_args_are_named_so_no_base_image_env_shadows_them(kind):
    """Under podman/buildah a base image's ENV wins over a stage's ARG of the same name (the python images' ENV
    PYTHON_VERSION=3.11.x broke the Python check: AssertionError: ('3.11.2 (main, ...)', '3.11.2'))."""
    names = _stage_args(DOCKERFILES[kind])
    assert names and all(name == "STACK" or name.startswith(DOCKER_ARG_PREFIX) for name in names), names
    text = DOCKERFILES[kind].read_text()
    used = [name for name in BASE_IMAGE_ENV if re.search(rf"\$\{{?{name}\b", text)]
    assert not used, f"{DOCKERFILES[kind].name} reads the base image's {used}"


@pytest.mark.parametrize("stack", STACKS)
def test_gpu_base_image_is_the_rows_cuda_and_cudnn(stack):
    row = _row(stack)
    image = _dockerfile_args(DOCKERFILES["gpu"])[_row_name("CUDA_IMAGE", stack)]
    assert image == row["CUDA_IMAGE"]
    # nvidia/cuda tags: cudnn8 images name the major version; cuDNN 9 images are tagged plain `cudnn`.
    cudnn_tag = "cudnn8" if row["CUDNN_VERSION"].startswith("8.") else "cudnn"
    assert re.fullmatch(rf"nvidia/cuda:{re.escape(row['CUDA_VERSION'])}\.\d+-{cudnn_tag}-devel-ubuntu\d\d\.04", image)


@pytest.mark.parametrize("stack", STACKS)
def test_cpu_base_image_is_the_rows_python(stack):
    image = _dockerfile_args(DOCKERFILES["cpu"])[_row_name("PYTHON_IMAGE", stack)]
    assert re.fullmatch(rf"python:{re.escape(_row(stack)['PYTHON_VERSION'])}-slim(-\w+)?", image), image


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfiles_set_legacy_keras_only_on_newer_rows(kind):
    stages = re.split(r"^FROM ", DOCKERFILES[kind].read_text(), flags=re.MULTILINE)
    for stack in STACKS:
        stage = next(part for part in stages if re.match(rf"\S+ AS stack-{re.escape(stack)}\n", part))
        assert ("TF_USE_LEGACY_KERAS=1" in stage) == (_row(stack)["LEGACY_KERAS"] == "1"), (kind, stack)


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
@pytest.mark.parametrize("name", PINNED)
def test_dockerfile_arg_defaults_equal_versions_env(kind, name):
    args = _dockerfile_args(DOCKERFILES[kind])
    arg = DOCKER_ARG_PREFIX + name
    assert args.get(arg) == ENV[name], f"{DOCKERFILES[kind].name}: ARG {arg}={args.get(arg)}, " \
                                       f"versions.env {name}={ENV[name]}"


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfiles_install_with_the_one_install_script(kind):
    lines = _run_lines(DOCKERFILES[kind])
    installs = [line for line in lines if line.startswith("RUN") and "scripts/install.sh" in line]
    assert len(installs) == 1, f"{DOCKERFILES[kind].name} must run scripts/install.sh exactly once"
    assert "HVD_SCHED_SYSTEM=1" in installs[0]
    assert 'HVD_SCHED_STACK="${STACK}"' in installs[0]
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


@pytest.mark.parametrize("dist, key", [("tensorflow-cpu", "TENSORFLOW_CPU_VERSION"), ("horovod", "HOROVOD_VERSION"),
                                       ("tf-keras", "TF_KERAS_VERSION"), ("keras", "KERAS_VERSION")])
@pytest.mark.depends_on(*rows.STACK)  # each row's own installed packages
def test_installed_packages_match_the_pins(dist, key):
    row = _row(_running_stack())
    try:
        installed = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        if dist == "tf-keras" and not row[key]:
            return  # Keras 2 is built into this row's TensorFlow, or the row is Keras 3
        pytest.skip(f"{dist} is not installed here (e.g. a GPU image has tensorflow instead)")
    if dist == "keras" and not row[key]:
        # Not pinned by the row: TensorFlow 2.15 pins its own keras 2.15.
        assert installed.split(".")[:2] == row["TENSORFLOW_VERSION"].split(".")[:2], f"stack {_running_stack()}"
        return
    assert installed == row[key], f"stack {_running_stack()}"
    assert "%d.%d" % sys.version_info[:2] == row["PYTHON_VERSION"]
