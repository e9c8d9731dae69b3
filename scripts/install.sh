#!/usr/bin/env bash
# One pinned, idempotent install path for hvd_sched: used by the Makefile, .ci/run and docker/.
#
#   scripts/install.sh [VENV]       (default VENV: .venv in the repository root)
#
# Environment:
#   HVD_SCHED_CACHE     wheel cache folder (default ~/.cache/hvd_sched); the Horovod wheel built here is kept
#                       in it, keyed by Horovod version, TensorFlow version, Python and build flags, so a
#                       second run skips the ~4 minute build.
#   HVD_SCHED_GPU=1     build Horovod with HOROVOD_GPU_OPERATIONS=NCCL against tensorflow[and-cuda] (Docker GPU).
#   HVD_SCHED_SYSTEM=1  install into the current Python instead of a virtual environment (Docker images).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
# shellcheck source=versions.env
. "$here/versions.env"

die() { echo "install.sh: ERROR: $*" >&2; exit 1; }
step() { echo "install.sh: $*"; }

venv="${1:-$root/.venv}"
cache="${HVD_SCHED_CACHE:-$HOME/.cache/hvd_sched}"
gpu="${HVD_SCHED_GPU:-0}"
mkdir -p "$cache/wheels"

if [ "${HVD_SCHED_SYSTEM:-0}" = 1 ]; then
  py="$(command -v python3)" || die "python3 not found"
else
  py_base="$(command -v "python$PYTHON_VERSION" || command -v python3)" || die "python$PYTHON_VERSION not found"
  "$py_base" -c "import sys; assert sys.version_info[:2] == (3, 11), sys.version" 2>/dev/null \
    || die "Python $PYTHON_VERSION is required (TensorFlow $TENSORFLOW_VERSION, Horovod $HOROVOD_VERSION); found $("$py_base" --version 2>&1)"
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

# Every pip call runs under this constraint so nothing upgrades numpy past what TensorFlow 2.15 needs.
constraints="$cache/constraints.txt"
printf '%s\n' "$NUMPY_SPEC" "tensorflow-cpu==$TENSORFLOW_CPU_VERSION" > "$constraints"
if [ "$gpu" = 1 ]; then
  printf '%s\n' "$NUMPY_SPEC" "tensorflow==$TENSORFLOW_VERSION" > "$constraints"
fi
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

# Horovod: built from source against the TensorFlow above, the wheel cached under a key of everything that
# changes the binary.
hvd_ops="gloo"; hvd_env=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
  HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1)
if [ "$gpu" = 1 ]; then
  hvd_ops="nccl"; hvd_env+=(HOROVOD_GPU_OPERATIONS=NCCL)
fi
key="horovod-$HOROVOD_VERSION-tf$TENSORFLOW_VERSION-py$PYTHON_VERSION-$hvd_ops-$(uname -m)"
wheel_dir="$cache/wheels/$key"
have_hvd() { "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('horovod') != '$HOROVOD_VERSION')" 2>/dev/null; }
if ! have_hvd; then
  if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
    step "building Horovod $HOROVOD_VERSION against TensorFlow $TENSORFLOW_VERSION ($hvd_ops); about 4 minutes on 2 cores"
    pip install -q cmake==3.27.9 2>/dev/null || true
    rm -rf "$wheel_dir.tmp" && mkdir -p "$wheel_dir.tmp"
    env "${hvd_env[@]}" MAKEFLAGS="-j$(nproc)" PIP_CONSTRAINT="$constraints" \
      "$py" -m pip --disable-pip-version-check wheel --no-build-isolation --no-deps --no-cache-dir \
      -w "$wheel_dir.tmp" "horovod==$HOROVOD_VERSION" > "$cache/horovod-build.log" 2>&1 \
      || { tail -n 40 "$cache/horovod-build.log" >&2; die "building Horovod failed; full log in $cache/horovod-build.log"; }
    rm -rf "$wheel_dir" && mv "$wheel_dir.tmp" "$wheel_dir"
  else
    step "using cached Horovod wheel from $wheel_dir"
  fi
  pip install -q "$wheel_dir"/horovod-*.whl || die "installing the cached Horovod wheel failed (delete $wheel_dir to rebuild)"
fi

# The check the foundation issue asks for: Horovod must have been built with TensorFlow and Gloo.
hvdrun="$(dirname "$py")/horovodrun"
[ -x "$hvdrun" ] || hvdrun="$(command -v horovodrun)" || die "horovodrun not found after install"
check="$("$hvdrun" --check-build 2>&1)" || { echo "$check" >&2; die "horovodrun --check-build failed"; }
echo "$check" | grep -q '\[X\] TensorFlow' \
  || { echo "$check" >&2; die "Horovod was built without TensorFlow support (delete $wheel_dir and rerun)"; }
echo "$check" | grep -q '\[X\] Gloo' \
  || { echo "$check" >&2; die "Horovod was built without Gloo (delete $wheel_dir and rerun)"; }
if [ "$gpu" = 1 ]; then
  echo "$check" | grep -q '\[X\] NCCL' || { echo "$check" >&2; die "Horovod was built without NCCL"; }
fi
"$py" -c "import horovod.tensorflow.keras as hvd" || die "horovod.tensorflow.keras does not import"

if [ -f "$root/setup.py" ]; then
  step "installing hvd_sched (editable) with test extras"
  pip install -q -e "$root[test]" || die "pip install -e .[test] failed"
fi
step "OK: TensorFlow $TENSORFLOW_VERSION, Horovod $HOROVOD_VERSION ($hvd_ops) in $py"
