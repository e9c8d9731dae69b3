#!/usr/bin/env bash
# The GPU half of scripts/install.sh (sourced by it when HVD_SCHED_GPU=1): which CUDA toolkit, NCCL and host
# compiler build Horovod's NCCL ops, and where the built library finds NCCL at run time. Nothing here needs a GPU
# or a driver: nvcc compiles for every architecture it knows, and the library is only linked, never run on a GPU.
#
#   find_cuda_toolkit MAJOR     sets cuda_home, cuda_release (e.g. 12.4), nccl_header, nccl_version, cuda_cc,
#                               cuda_cxx; returns 1 with cuda_error set when no usable toolkit is found
#   (where the built library finds NCCL at run time: set_wheel_runpath in scripts/mpi.sh, with the MPI's RUNPATH)

# The toolkit: the first candidate whose nvcc has the CUDA major version of the row's TensorFlow (CUDA_VERSION in
# scripts/versions.env). Code built by nvcc 12.x runs with any CUDA 12 runtime and driver of that version or later
# (CUDA's minor-version compatibility); a toolkit of another major version (e.g. a CUDA 13 in /usr/local/cuda next
# to TensorFlow's CUDA 12 wheels) is skipped, never used. /usr is Debian's nvidia-cuda-toolkit (/usr/bin/nvcc).
find_cuda_toolkit() {
  local major="$1" cand nvcc release skipped="" inc cxx tmp
  cuda_home=""; cuda_error=""
  # HVD_SCHED_CUDA_SEARCH replaces the two system places (tests/test_gpu_build.py runs this with fake toolkits).
  for cand in "${HVD_SCHED_CUDA_HOME:-}" "${CUDA_HOME:-}" ${HVD_SCHED_CUDA_SEARCH-/usr/local/cuda /usr}; do
    [ -n "$cand" ] && [ -x "$cand/bin/nvcc" ] || continue
    release="$("$cand/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')"
    if [ "${release%%.*}" != "$major" ]; then
      skipped+=" $cand (nvcc ${release:-?})"
      continue
    fi
    cuda_home="$cand"; cuda_release="$release"; break
  done
  if [ -z "$cuda_home" ]; then
    cuda_error="no CUDA $major toolkit (nvcc) found in HVD_SCHED_CUDA_HOME, CUDA_HOME, /usr/local/cuda or /usr"
    cuda_error+="${skipped:+; skipped:$skipped}. Use a CUDA $major devel image, or Debian trixie's"
    cuda_error+=" nvidia-cuda-toolkit + nvidia-cuda-dev (non-free) and libnccl-dev (contrib); see docs/how-to/gpu-build.md"
    return 1
  fi

  nccl_header=""
  for inc in "${HOROVOD_NCCL_INCLUDE:-}" "${HOROVOD_NCCL_HOME:+$HOROVOD_NCCL_HOME/include}" "$cuda_home/include" \
      /usr/include /usr/local/include; do
    [ -n "$inc" ] && [ -f "$inc/nccl.h" ] && { nccl_header="$inc/nccl.h"; break; }
  done
  if [ -z "$nccl_header" ]; then
    cuda_error="nvcc $cuda_release is in $cuda_home but nccl.h is not (install libnccl-dev, or set HOROVOD_NCCL_HOME)"
    return 1
  fi
  nccl_version="$(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) /{v = v (v ? "." : "") $3} END{print v}' "$nccl_header")"

  # Horovod compiles its CUDA kernels with the C++ compiler as nvcc's host compiler (-ccbin), and nvcc refuses a
  # GCC newer than it knows (nvcc 12.4: GCC <= 13; Debian trixie's default g++ is 14): the first compiler that
  # nvcc accepts builds all of Horovod, so the C++ and CUDA objects share one compiler and one libstdc++ ABI.
  tmp="$(mktemp -d)"
  echo '__global__ void hvd_sched_probe() {}' > "$tmp/probe.cu"
  cuda_cxx=""
  for cxx in "${CXX:-}" c++ g++ g++-13 g++-12 g++-11; do
    [ -n "$cxx" ] && command -v "$cxx" >/dev/null 2>&1 || continue
    if "$cuda_home/bin/nvcc" -ccbin "$(command -v "$cxx")" -c "$tmp/probe.cu" -o "$tmp/probe.o" >/dev/null 2>&1; then
      cuda_cxx="$(command -v "$cxx")"; break
    fi
  done
  rm -rf "$tmp"
  if [ -z "$cuda_cxx" ]; then
    cuda_error="nvcc $cuda_release in $cuda_home accepts none of the C++ compilers here (tried \$CXX, c++, g++,"
    cuda_error+=" g++-13, g++-12, g++-11); install one it supports (Debian trixie: g++-13)"
    return 1
  fi
  # The C compiler of the same GCC: g++-13 -> gcc-13, g++ -> gcc, c++ -> cc.
  case "$(basename "$cuda_cxx")" in
    g++*) cuda_cc="$(dirname "$cuda_cxx")/gcc$(basename "$cuda_cxx" | cut -c4-)" ;;
    *) cuda_cc="$(dirname "$cuda_cxx")/cc" ;;
  esac
  [ -x "$cuda_cc" ] || cuda_cc="$(command -v gcc)"
  return 0
}

# Horovod 0.28.1's TensorFlow ops get an op's CUDA stream from stream_executor::gpu::AsGpuStreamValue, a function
# newer TensorFlow no longer exports (TF 2.21: its library then fails to load with `undefined symbol:
# _ZN15stream_executor3gpu16AsGpuStreamValueEPNS_6StreamE`, and --check-build lists no TensorFlow).
# tf_lacks_as_gpu_stream_value PY: true when the installed TensorFlow's framework library does not export it.
tf_lacks_as_gpu_stream_value() {
  local lib
  lib="$("$1" -c 'import os, tensorflow as tf; print(os.path.join(tf.sysconfig.get_lib(), "libtensorflow_framework.so.2"))')" \
    || return 1
  ! nm -D --defined-only "$lib" | grep -q ' _ZN15stream_executor3gpu16AsGpuStreamValueEPNS_6StreamE$'
}

# patch_stream_handle PY SRC: in the unpacked sdist SRC, Horovod's forward declaration of AsGpuStreamValue becomes
# an inline definition over the Stream's own accessor (`platform_specific_handle().stream`, the same CUstream).
patch_stream_handle() {
  "$1" - "$2/horovod/tensorflow/mpi_ops.cc" <<'PYEOF'
import sys
path = sys.argv[1]
text = open(path).read()
declaration = """// Forward declaration of AsGpuStreamValue
namespace stream_executor {
namespace gpu {
GpuStreamHandle AsGpuStreamValue(Stream* stream);
} // namespace stream_executor
} // namespace gpu
"""
includes_end = "#endif // TENSORFLOW_VERSION >= 2011000000\n#endif // HAVE_GPU\n"
definition = """#endif // TENSORFLOW_VERSION >= 2011000000
// hvd_sched (scripts/gpu_toolkit.sh): this TensorFlow no longer exports AsGpuStreamValue.
namespace stream_executor {
namespace gpu {
inline GpuStreamHandle AsGpuStreamValue(Stream* stream) {
  return static_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);
}
} // namespace gpu
} // namespace stream_executor
#endif // HAVE_GPU
"""
if text.count(declaration) != 1 or text.count(includes_end) != 1:
    sys.exit(f"{path}: the AsGpuStreamValue declaration is not where Horovod 0.28.1 has it")
open(path, "w").write(text.replace(declaration, "").replace(includes_end, definition))
print(f"patch_stream_handle: {path}: AsGpuStreamValue defined inline")
PYEOF
}
