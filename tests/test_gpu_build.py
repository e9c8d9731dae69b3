"""The GPU build's recipe, read and dry-run without a GPU, a CUDA toolkit or the network (issue 26).

What `make gpu-build-check` proves by building (docs/how-to/gpu-build.md) is not repeated here; these checks keep the
pieces of that recipe consistent with each other and with scripts/versions.env in a second: the toolkit search of
scripts/gpu_toolkit.sh against fake toolkits, the Debian pins against docker/Dockerfile's trixie stages, and the
scripts' wiring (Makefile target, install.sh's wheel key, gpu_check.sh's NCCL evidence).
"""

import os
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def _versions_env():
    env = {}
    for line in (SCRIPTS / "versions.env").read_text().splitlines():
        match = re.match(r"^(\w+)=(.*)$", line)
        if match:
            env[match.group(1)] = match.group(2).strip('"')
    return env


ENV = _versions_env()
STACKS = ENV["STACKS"].split()


def _pin(stack, name):
    return ENV.get(f"STACK_{stack.replace('.', '_').replace('-', '_')}_{name}", ENV[name])


def _stages(text):
    """{stage name: its text} of a Dockerfile."""
    parts = re.split(r"^FROM ", text, flags=re.MULTILINE)[1:]
    return {m.group(1): part for part in parts if (m := re.match(r"\S+ AS (\S+)\n", part))}


def _run_lines(text):
    return re.sub(r"\\\n", " ", text).splitlines()


# --- scripts/gpu_toolkit.sh: which toolkit and compiler, with fake ones ---------------------------------------

FAKE_NVCC = """#!/bin/sh
# A stand-in nvcc: --version prints the release; a compile succeeds only with the host compiler named in ACCEPT.
if [ "$1" = --version ]; then echo "Cuda compilation tools, release {release}, V{release}.131"; exit 0; fi
case "$2" in */{accept}) exit 0 ;; *) echo "unsupported GNU version" >&2; exit 1 ;; esac
"""


def _fake_toolkit(folder, release, accept="g++-13", nccl=(2, 22, 3)):
    (folder / "bin").mkdir(parents=True)
    nvcc = folder / "bin" / "nvcc"
    nvcc.write_text(FAKE_NVCC.format(release=release, accept=accept))
    nvcc.chmod(0o755)
    if nccl:
        (folder / "include").mkdir()
        (folder / "include" / "nccl.h").write_text(
            "#define NCCL_MAJOR {}\n#define NCCL_MINOR {}\n#define NCCL_PATCH {}\n".format(*nccl))
    return folder


def _find(tmp_path, **env):
    """find_cuda_toolkit 12 in bash with fake compilers on PATH; returns (exit status, variables or error)."""
    bin_dir = tmp_path / "compilers"
    bin_dir.mkdir(exist_ok=True)
    for name in ("c++", "g++", "g++-13", "gcc", "gcc-13", "cc"):
        tool = bin_dir / name
        tool.write_text("#!/bin/sh\nexit 0\n")
        tool.chmod(0o755)
    script = (f". {SCRIPTS / 'gpu_toolkit.sh'}; find_cuda_toolkit 12 || {{ echo \"$cuda_error\"; exit 1; }}; "
              'echo "$cuda_home|$cuda_release|$nccl_version|$cuda_cxx|$cuda_cc"')
    full_env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HVD_SCHED_CUDA_SEARCH": "", **env}
    done = subprocess.run(["bash", "-c", script], env=full_env, capture_output=True, text=True, timeout=30)
    return done.returncode, done.stdout.strip()


def test_the_toolkit_of_the_rows_cuda_major_is_chosen_and_another_major_skipped(tmp_path):
    cuda13 = _fake_toolkit(tmp_path / "cuda13", "13.0")
    cuda12 = _fake_toolkit(tmp_path / "cuda12", "12.4")
    rc, out = _find(tmp_path, HVD_SCHED_CUDA_HOME=str(cuda13), CUDA_HOME=str(cuda12))
    assert rc == 0, out
    home, release, nccl, cxx, cc = out.split("|")
    assert (home, release, nccl) == (str(cuda12), "12.4", "2.22.3")
    # nvcc 12.4 refuses GCC 14: the first compiler it accepts builds all of Horovod, its gcc the C parts.
    assert (pathlib.Path(cxx).name, pathlib.Path(cc).name) == ("g++-13", "gcc-13")


def test_only_another_cuda_major_is_an_error_that_names_what_was_skipped(tmp_path):
    cuda13 = _fake_toolkit(tmp_path / "cuda13", "13.0")
    rc, out = _find(tmp_path, HVD_SCHED_CUDA_HOME=str(cuda13))
    assert rc == 1
    assert "no CUDA 12 toolkit" in out and f"{cuda13} (nvcc 13.0)" in out and "nvidia-cuda-toolkit" in out


def test_a_toolkit_without_nccl_h_is_an_error_that_says_which_package(tmp_path):
    cuda12 = _fake_toolkit(tmp_path / "cuda12", "12.4", nccl=None)
    rc, out = _find(tmp_path, CUDA_HOME=str(cuda12), HOROVOD_NCCL_INCLUDE=str(tmp_path / "none"))
    if rc == 0:  # this machine has an nccl.h in /usr/include or /usr/local/include
        pytest.skip(f"a system nccl.h was found: {out}")
    assert "nccl.h is not" in out and "libnccl-dev" in out


def test_no_compiler_nvcc_accepts_is_an_error(tmp_path):
    cuda12 = _fake_toolkit(tmp_path / "cuda12", "12.4", accept="clang++-99")
    rc, out = _find(tmp_path, CUDA_HOME=str(cuda12))
    assert rc == 1 and "accepts none of the C++ compilers" in out


# --- scripts/versions.env's Debian pins against the rows and docker/Dockerfile ---------------------------------

def test_debian_cuda_has_the_cuda_major_of_the_rows_built_on_trixie():
    trixie_rows = [name[len("stack-"):-len("-trixie")] for name in _stages(DOCKERFILE.read_text())
                   if name.endswith("-trixie")]
    assert trixie_rows, "docker/Dockerfile has no stack-<row>-trixie stage"
    for row in trixie_rows:
        assert row in STACKS
        assert _pin(row, "CUDA_VERSION").split(".")[0] == ENV["GPU_DEBIAN_CUDA"].split(".")[0], row
        # trixie's python3 is 3.13: the stage installs python3.13 from Debian, no PPA.
        assert _pin(row, "PYTHON_VERSION") == "3.13", row


def test_the_newest_tensorflow_has_a_trixie_stage():
    newest = _pin(STACKS[-1], "TENSORFLOW_VERSION")
    rows = [row for row in STACKS if _pin(row, "TENSORFLOW_VERSION") == newest]
    assert set(f"stack-{row}-trixie" for row in rows) <= set(_stages(DOCKERFILE.read_text()))


def test_trixie_stages_pin_what_versions_env_pins():
    text = DOCKERFILE.read_text()
    assert re.search(rf"^ARG DEBIAN_IMAGE={re.escape(ENV['GPU_DEBIAN_IMAGE'])}$", text, re.MULTILINE)
    for name, stage in _stages(text).items():
        if not name.endswith("-trixie"):
            continue
        row = name[len("stack-"):-len("-trixie")]
        assert stage.startswith("${DEBIAN_IMAGE} AS ")
        suffix = row.replace(".", "_").replace("-", "_")
        for var in ("PYTHON_VERSION", "TENSORFLOW_VERSION", "HOROVOD_VERSION"):
            match = re.search(rf"^ARG HVD_SCHED_{var}_{suffix}=(\S+)$", stage, re.MULTILINE)
            assert match and match.group(1) == _pin(row, var), (name, var)
        assert ("TF_USE_LEGACY_KERAS=1" in stage) == (_pin(row, "LEGACY_KERAS") == "1"), name
        build_apt = re.search(r'HVD_SCHED_BUILD_APT="([^"]*)"', stage).group(1).split()
        assert set(ENV["GPU_DEBIAN_PACKAGES"].split()) <= set(build_apt), name
    # Every pinned row's NVIDIA stage stays (users who pull NVIDIA's images).
    assert all(f"stack-{row}" in _stages(text) for row in STACKS)
    assert "FROM stack-${STACK}${BASE}" in text


def test_one_install_run_installs_and_removes_the_build_only_cuda():
    """The trixie image keeps no Debian CUDA and no driver library (libcuda1 would shadow the host's)."""
    runs = [line for line in _run_lines(DOCKERFILE.read_text()) if line.startswith("RUN") and "install.sh" in line]
    assert len(runs) == 1
    run = runs[0]
    install = run.index("scripts/install.sh")
    assert run.index("apt-get install -y --no-install-recommends ${HVD_SCHED_BUILD_APT}") < install
    assert run.index('ldconfig "${HVD_SCHED_CUDA_STUBS}"') < install
    purge = run.index("apt-get purge -y --auto-remove ${HVD_SCHED_BUILD_APT} libcuda1")
    assert install < purge < run.rindex("ldconfig")
    assert "contrib non-free" in run


# --- the scripts' wiring -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("script", ["install.sh", "gpu_toolkit.sh", "gpu_build_check.sh", "gpu_check.sh", "mpi.sh"])
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", str(SCRIPTS / script)], check=True, timeout=30)


def test_install_sh_keys_the_nccl_wheel_by_its_toolkit_and_keeps_the_cpu_key():
    text = (SCRIPTS / "install.sh").read_text()
    assert 'hvd_ops="nccl-cuda$cuda_release"' in text
    assert 'hvd_ops="gloo"' in text
    assert 'key="horovod-$HOROVOD_VERSION$src_change-tf$TENSORFLOW_VERSION-py$PYTHON_VERSION-$hvd_ops-$(uname -m)"' \
        in text
    # The GPU half is sourced only on the GPU path.
    gpu_block = text[text.index('if [ "$gpu" = 1 ]; then\n  # shellcheck source=gpu_toolkit.sh'):]
    assert '. "$here/gpu_toolkit.sh"' in gpu_block.split("\nfi\n")[0]
    assert "HOROVOD_NCCL_LINK=SHARED" in text and 'set_wheel_runpath "$py" "$wheel_dir.tmp" "$gpu"' in text
    assert "hvd.nccl_built() and hvd.cuda_built()" in text
    assert "tf_lacks_as_gpu_stream_value" in text and "patch_stream_handle" in text


def test_makefile_has_the_gpu_build_check_target():
    text = (ROOT / "Makefile").read_text()
    assert re.search(r"^\.PHONY:.*\bgpu-build-check\b", text, re.MULTILINE)
    # Without the default row's HVD_SCHED_STACK (exported by the Makefile), which the script would take first.
    assert re.search(r"^gpu-build-check:\n\tenv -u HVD_SCHED_STACK bash scripts/gpu_build_check\.sh ", text,
                     re.MULTILINE)


def test_gpu_build_check_checks_what_the_issue_lists():
    text = (SCRIPTS / "gpu_build_check.sh").read_text()
    for needle in ("HVD_SCHED_GPU=1", "horovodrun --check-build", r"\[X\] NCCL", "nccl_built", "cuda_built",
                   "ldd", "nvidia/nccl/lib/libnccl.so.2", "--gloo python examples/train_keras.py",
                   "digits_warmup_steps.yaml --epochs 8", "GPU_DEBIAN_PACKAGES", "GPU_DEBIAN_CUDA"):
        assert needle in text, needle


def test_gpu_check_runs_the_gpu_default_tests_and_looks_for_nccl_in_the_timeline():
    text = (SCRIPTS / "gpu_check.sh").read_text()
    for test in ("tests/keras/test_gpu_defaults.py", "tests/multirank/test_gpu_defaults_ranks.py"):
        assert test in text and (ROOT / test).exists(), test
    assert "--timeline-filename" in text and "NCCL_ALLREDUCE" in text and "ranks_identical" in text


def test_set_wheel_runpath_points_at_tensorflows_nccl_relative_to_the_library():
    # scripts/mpi.sh: one RUNPATH step for NCCL and the bundled Open MPI (tests/test_mpi_build.py: the MPI half).
    text = (SCRIPTS / "mpi.sh").read_text()
    assert r'paths+=("\$ORIGIN/$rel/nvidia/nccl/lib")' in text and '--set-rpath "$(IFS=:; echo "${paths[*]}")"' in text
    assert os.access(SCRIPTS / "gpu_build_check.sh", os.R_OK)


MPI_OPS_EXCERPT = """#if HAVE_GPU
using GpuStreamHandle = cudaStream_t;
// Forward declaration of AsGpuStreamValue
namespace stream_executor {
namespace gpu {
GpuStreamHandle AsGpuStreamValue(Stream* stream);
} // namespace stream_executor
} // namespace gpu
#if TENSORFLOW_VERSION >= 2011000000
#include "tensorflow/compiler/xla/stream_executor/stream.h"
#else
#include "tensorflow/stream_executor/stream.h"
#endif // TENSORFLOW_VERSION >= 2011000000
#endif // HAVE_GPU
"""


def _patch(tmp_path, text):
    source = tmp_path / "horovod" / "tensorflow" / "mpi_ops.cc"
    source.parent.mkdir(parents=True)
    source.write_text(text)
    done = subprocess.run(["bash", "-c", f". {SCRIPTS / 'gpu_toolkit.sh'}; patch_stream_handle python3 {tmp_path}"],
                          capture_output=True, text=True, timeout=30)
    return done, source.read_text()


def test_patch_stream_handle_defines_the_function_after_the_stream_header(tmp_path):
    done, text = _patch(tmp_path, MPI_OPS_EXCERPT)
    assert done.returncode == 0, done.stderr
    assert "GpuStreamHandle AsGpuStreamValue(Stream* stream);" not in text
    definition = text.index("inline GpuStreamHandle AsGpuStreamValue(Stream* stream) {")
    assert text.index('#include "tensorflow/compiler/xla/stream_executor/stream.h"') < definition
    assert "stream->platform_specific_handle().stream" in text
    assert definition < text.index("#endif // HAVE_GPU")


def test_patch_stream_handle_refuses_a_source_it_does_not_know(tmp_path):
    done, text = _patch(tmp_path, MPI_OPS_EXCERPT.replace("Forward declaration", "Declaration"))
    assert done.returncode != 0 and "is not where Horovod 0.28.1 has it" in done.stderr
    assert text == MPI_OPS_EXCERPT.replace("Forward declaration", "Declaration")
