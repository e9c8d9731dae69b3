#!/usr/bin/env bash
# The GPU build, made and checked on a machine with no GPU and no driver (issue 26; docs/how-to/gpu-build.md):
#
#   bash scripts/gpu_build_check.sh [STACK]        (make gpu-build-check STACK=tf2.21; default: the newest row)
#
# 1. a Debian trixie root (mmdebstrap, kept in $HVD_SCHED_CACHE/gpu/trixie-root): python3 3.13, CUDA 12.4
#    (nvidia-cuda-toolkit, nvidia-cuda-dev from non-free) and NCCL (libnccl-dev, contrib), all Debian packages. The
#    host stays as it is (a bookworm host has CUDA 11.8 only; no suites are mixed). Made once, ~4 minutes.
# 2. inside it, the project's own install: HVD_SCHED_GPU=1 scripts/install.sh, i.e. tensorflow[and-cuda] from
#    pip and Horovod built with HOROVOD_GPU_OPERATIONS=NCCL + Gloo, the wheel cached under its own key
#    (horovod-...-nccl-cuda12.4-...) in the same wheel cache as the CPU rows;
# 3. the checks: `horovodrun --check-build` lists NCCL; hvd.nccl_built() and hvd.cuda_built(); the NEEDED
#    entries and `ldd` of Horovod's TensorFlow library (libnccl.so.2 from nvidia-nccl-cu12, TensorFlow's own;
#    the CUDA runtime linked in statically; no libcuda needed to load it); the README's 2-rank demo on the CPU
#    with this build (Gloo carries CPU tensors), whose every rank must end at the CPU row's accuracy.
# Writes $HVD_SCHED_CACHE/gpu/check-STACK/summary.txt (and the logs beside it) and prints it. Needs root (chroot,
# bind mounts) and mmdebstrap (apt-get install mmdebstrap). Environment: HVD_SCHED_CACHE (default
# ~/.cache/hvd_sched), HVD_SCHED_GPU_WHEELHOUSE (a folder of wheels pip may take first), HVD_SCHED_DEMO_ACCURACY
# (default 0.9694, the README's figure).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
# shellcheck source=stack.sh
. "$here/stack.sh"
pin() { bash "$here/stack.sh" "$1" "$2"; }
# The default row: the first row of the newest TensorFlow (tf2.21; keras3 after it is the same build: TensorFlow,
# Python and Horovod wheel).
newest_tf="$(pin "${STACKS##* }" TENSORFLOW_VERSION)"
for row in $STACKS; do [ "$(pin "$row" TENSORFLOW_VERSION)" = "$newest_tf" ] && { newest="$row"; break; }; done
load_stack "${1:-${HVD_SCHED_STACK:-$newest}}" || exit 1

die() { echo "gpu_build_check.sh: ERROR: $*" >&2; exit 1; }
say() { echo "gpu_build_check.sh: $*"; }
[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap, chroot and bind mounts)"

cache="${HVD_SCHED_CACHE:-$HOME/.cache/hvd_sched}"
root="$cache/gpu/$GPU_DEBIAN_SUITE-root"
out="$cache/gpu/check-$STACK"
mkdir -p "$out" "$cache/wheels"
want_accuracy="${HVD_SCHED_DEMO_ACCURACY:-0.9694}"
start_all=$(date +%s)

# 1. The trixie root. The package list is what a CUDA build needs and nothing of a GPU driver's kernel side;
# nvidia-cuda-dev still pulls libcuda1 (the driver's user-space library, no kernel module: it finds no GPU).
packages="python3,python3-venv,python3-dev,build-essential,cmake,git,ca-certificates,patchelf,file"
packages+=",${GPU_DEBIAN_PACKAGES// /,}"
root_seconds=0
if [ ! -x "$root/usr/bin/nvcc" ]; then
  command -v mmdebstrap >/dev/null 2>&1 || die "mmdebstrap not found (apt-get install mmdebstrap)"
  say "making the Debian $GPU_DEBIAN_SUITE root in $root (main contrib non-free; 5.8 GB)"
  t0=$(date +%s)
  rm -rf "$root.tmp"
  mmdebstrap --variant=apt --components="main contrib non-free" --include="$packages" \
    "$GPU_DEBIAN_SUITE" "$root.tmp" http://deb.debian.org/debian > "$out/mmdebstrap.log" 2>&1 \
    || { tail -n 30 "$out/mmdebstrap.log" >&2; die "mmdebstrap failed; log in $out/mmdebstrap.log"; }
  mv "$root.tmp" "$root"
  root_seconds=$(( $(date +%s) - t0 ))
fi
root_python="$(chroot "$root" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[ "$root_python" = "$PYTHON_VERSION" ] || die "row $STACK needs Python $PYTHON_VERSION; Debian trixie's python3 is" \
  "$root_python (rows on it: $(for r in $STACKS; do [ "$(pin "$r" PYTHON_VERSION)" = "$root_python" ] \
  && printf '%s ' "$r"; done))"

# Runs a bash script inside the root, in a private mount namespace: the repository at /src, the wheel cache at
# /root/.cache/hvd_sched, the host's CA bundle (pip behind this network's proxy) and DNS; nothing is left mounted.
in_root() {
  local script="$1" wheelhouse="${HVD_SCHED_GPU_WHEELHOUSE:-}"
  unshare --mount --fork -- bash -euc '
    root="$1"; repo="$2"; cache="$3"; wheelhouse="$4"; script="$5"
    mount --make-rprivate /
    mkdir -p "$root/src" "$root/root/.cache/hvd_sched" "$root/wheelhouse"
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    mount --bind "$repo" "$root/src"
    mount --bind "$cache" "$root/root/.cache/hvd_sched"
    [ -z "$wheelhouse" ] || mount --bind "$wheelhouse" "$root/wheelhouse"
    cp -L /etc/resolv.conf "$root/etc/resolv.conf"
    # The host name must resolve inside the root, or Gloo segfaults in hvd.init (both ranks, exit 139).
    cp -L /etc/hosts "$root/etc/hosts"
    cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/host-ca-certificates.crt"
    exec chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
      PIP_CERT=/etc/ssl/certs/host-ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1 \
      ${wheelhouse:+PIP_FIND_LINKS=/wheelhouse} bash -euo pipefail -c "$script"
  ' in_root "$root" "$repo" "$cache" "$wheelhouse" "$script"
}

venv="/opt/venv-gpu-$STACK"
legacy=""; [ "$LEGACY_KERAS" = 1 ] && legacy="export TF_USE_LEGACY_KERAS=1"

# 2. The install (the build on a cold cache). MAKEFLAGS is install.sh's -j$(nproc); nice keeps a shared machine
# usable.
say "HVD_SCHED_GPU=1 scripts/install.sh $venv (row $STACK) inside the trixie root; log in $out/install.log"
t0=$(date +%s)
in_root "cd /src && HVD_SCHED_GPU=1 HVD_SCHED_STACK=$STACK nice -n 10 bash scripts/install.sh $venv" \
  > "$out/install.log" 2>&1 || { tail -n 40 "$out/install.log" >&2; die "install.sh failed; log in $out/install.log"; }
install_seconds=$(( $(date +%s) - t0 ))
grep '^install.sh: ' "$out/install.log" || true
# The toolkit install.sh chose must be the Debian packages' (scripts/versions.env GPU_DEBIAN_*), not another CUDA.
grep -q "^install.sh: CUDA toolkit: nvcc $GPU_DEBIAN_CUDA in /usr, NCCL $GPU_DEBIAN_NCCL " "$out/install.log" \
  || die "install.sh did not build with Debian's CUDA $GPU_DEBIAN_CUDA and NCCL $GPU_DEBIAN_NCCL (scripts/versions.env);" \
    "see $out/install.log"

# 3. The checks, in one pass inside the root; each writes its evidence into the log and fails loudly.
say "checks (check-build, nccl_built/cuda_built, the library's links, the 2-rank demo); log in $out/checks.log"
t0=$(date +%s)
in_root "
cd /src
$legacy
export HVD_SCHED_STACK=$STACK TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1 PATH=$venv/bin:\$PATH
echo '== horovodrun --check-build'
horovodrun --check-build | tee /tmp/check-build.txt
grep -q '\[X\] NCCL' /tmp/check-build.txt
echo '== horovod.tensorflow'
python - <<'EOF'
import importlib.metadata as md
import horovod, horovod.tensorflow as hvd, tensorflow as tf
built = {name: getattr(hvd, name)() for name in ('nccl_built', 'cuda_built', 'gloo_built', 'mpi_built', 'rocm_built')}
print('horovod', horovod.__version__, 'tensorflow', tf.__version__, 'built with CUDA', tf.test.is_built_with_cuda(),
      'GPUs visible', len(tf.config.list_physical_devices('GPU')))
print('TensorFlow build info: cuda', tf.sysconfig.get_build_info().get('cuda_version'),
      'cudnn', tf.sysconfig.get_build_info().get('cudnn_version'))
print('pip CUDA wheels:', ', '.join(f'{d} {md.version(d)}' for d in
      ('nvidia-cuda-runtime-cu12', 'nvidia-nccl-cu12', 'nvidia-cudnn-cu12')))
for name, value in built.items():
    print(f'hvd.{name}() = {value}')
assert built['nccl_built'] and built['cuda_built'] and built['gloo_built'], built
EOF
echo '== Horovod TensorFlow library'
lib=\$(python -c 'import glob, os, horovod; print(glob.glob(os.path.join(os.path.dirname(horovod.__file__), \"tensorflow\", \"mpi_lib*.so\"))[0])')
site=\$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')
echo \"library: \$lib\"
patchelf --print-needed \"\$lib\" | sed 's/^/NEEDED /'
echo \"RUNPATH \$(patchelf --print-rpath \"\$lib\")\"
tfdir=\$(python -c 'import os, tensorflow as tf; print(os.path.dirname(tf.__file__))')
LD_LIBRARY_PATH=\"\$tfdir\" ldd \"\$lib\" | tee /tmp/ldd.txt
nccl=\$(awk '/libnccl.so.2 =>/{print \$3}' /tmp/ldd.txt)
[ \"\$(realpath \"\$nccl\")\" = \"\$(realpath \"\$site/nvidia/nccl/lib/libnccl.so.2\")\" ] \
  || { echo \"libnccl.so.2 resolves to \$nccl, not \$site/nvidia/nccl/lib\"; exit 1; }
echo \"libnccl.so.2 -> \$(realpath \"\$nccl\") (nvidia-nccl-cu12, TensorFlow's NCCL)\"
! patchelf --print-needed \"\$lib\" | grep -q '^libcuda\.' || { echo 'the library needs libcuda (the driver)'; exit 1; }
# No libcudart among the NEEDED entries: the library's CUDA runtime calls (cuda*, __cuda*) are left undefined and
# bind, at load time, to the CUDA runtime that TensorFlow exports from libtensorflow_framework.so.2 (its stub over
# the pip libcudart.so.12); its NCCL calls bind there too. The dynamic linker says so (LD_DEBUG=bindings).
! patchelf --print-needed \"\$lib\" | grep -q libcudart || { echo 'libcudart is NEEDED (another copy)'; exit 1; }
LD_DEBUG=bindings LD_DEBUG_OUTPUT=/tmp/bindings python -c 'import horovod.tensorflow' > /dev/null 2>&1
cat /tmp/bindings.* | grep 'binding file [^ ]*/mpi_lib' | grep -E 'symbol .(__cuda|cuda|nccl)' \
  | sed -E 's/.* to ([^ ]+) .*symbol .(__cuda|cuda|nccl).*/\2 \1/' | sed 's#/[^ ]*/\.\./\.\./#tensorflow/#' \
  | sort | uniq -c | sed 's/^ */bindings: /' | tee /tmp/bindings.txt
rm -f /tmp/bindings.*
! grep -v 'libtensorflow_framework.so.2' /tmp/bindings.txt | grep -q . \
  || { echo 'a CUDA or NCCL call binds outside TensorFlow'; exit 1; }
echo \"TensorFlow's CUDA runtime: \$(python -c 'import importlib.metadata as m; print(m.version(\"nvidia-cuda-runtime-cu12\"))')\" \
  \"(\$(ls \"\$site\"/nvidia/cuda_runtime/lib/libcudart.so.*)); Debian's libcudart is not used\"
echo '== demo: horovodrun -np 2 -H localhost:2 --gloo, CPU, this GPU build'
rm -rf runs/gpu_build_check/$STACK
horovodrun -np 2 -H localhost:2 --gloo python examples/train_keras.py \
  --config examples/configs/digits_warmup_steps.yaml --epochs 8 --out runs/gpu_build_check/$STACK 2>&1 \
  | tee /tmp/demo.txt
ranks=\$(grep -c 'final val accuracy' /tmp/demo.txt)
good=\$(grep -c 'final val accuracy $want_accuracy' /tmp/demo.txt || true)
[ \"\$ranks\" = 2 ] && [ \"\$good\" = 2 ] || { echo \"expected 2 ranks at $want_accuracy, got \$good of \$ranks\"; exit 1; }
" > "$out/checks.log" 2>&1 || { tail -n 40 "$out/checks.log" >&2; die "a check failed; log in $out/checks.log"; }
check_seconds=$(( $(date +%s) - t0 ))

{
  echo "GPU build check, row $STACK ($(date -u +%FT%TZ), $(nproc) cores, no GPU): PASSED"
  echo "times: trixie root ${root_seconds}s (0 = existed), install ${install_seconds}s, checks ${check_seconds}s," \
    "all $(( $(date +%s) - start_all ))s"
  grep -E '^install.sh: (CUDA toolkit|building|using cached|OK)' "$out/install.log" || true
  grep -E '\[X\]|\[ \]' "$out/checks.log" | grep -E 'TensorFlow|NCCL|Gloo|MPI|DDL|CCL' || true
  grep -E '^(horovod |TensorFlow build info|pip CUDA wheels|hvd\.)' "$out/checks.log"
  grep -E '^(NEEDED|RUNPATH|libnccl.so.2 ->|bindings:|TensorFlow.s CUDA runtime:)' "$out/checks.log"
  grep -E 'libnccl|libcudart|libcuda\.|libtensorflow' "$out/checks.log" | grep '=>' || true
  grep -E 'epoch 8/8|final val accuracy' "$out/checks.log"
} | tee "$out/summary.txt"
