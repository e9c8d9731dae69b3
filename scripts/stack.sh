#!/usr/bin/env bash
# Picks one row of the support matrix in scripts/versions.env.
#
#   . scripts/stack.sh; load_stack NAME     (in a script: sets PYTHON_VERSION, TENSORFLOW_VERSION, ... for NAME)
#   bash scripts/stack.sh NAME VAR          (prints one pin of row NAME, e.g. for the Makefile)
#   bash scripts/stack.sh NAME --venv       (prints the row's default virtual environment: .venv, .venv-NAME)
#   bash scripts/stack.sh --list            (prints the row names, the default first)
#
# NAME empty means the default row (the first of STACKS).

_stack_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
. "$_stack_here/versions.env"

STACK_VARS="PYTHON_VERSION TENSORFLOW_CPU_VERSION TENSORFLOW_VERSION TF_KERAS_VERSION KERAS_VERSION HOROVOD_VERSION TEST_MARKS
NUMPY_SPEC HOROVOD_NO_XLA LEGACY_KERAS CUDA_VERSION CUDNN_VERSION CUDA_IMAGE"
DEFAULT_STACK="${STACKS%% *}"

load_stack() {
  local name="${1:-$DEFAULT_STACK}" var prefixed known=0 row
  for row in $STACKS; do [ "$row" = "$name" ] && known=1; done
  if [ "$known" != 1 ]; then
    echo "stack.sh: ERROR: unknown stack '$name'; scripts/versions.env has: $STACKS" >&2
    return 1
  fi
  STACK="$name"
  [ "$name" = "$DEFAULT_STACK" ] && return 0
  for var in $STACK_VARS; do
    prefixed="STACK_${name//[.-]/_}_$var"
    if [ -n "${!prefixed+x}" ]; then
      printf -v "$var" '%s' "${!prefixed}"
    fi
  done
}

stack_venv() {  # the row's virtual environment, relative to the repository root
  if [ "${1:-$DEFAULT_STACK}" = "$DEFAULT_STACK" ]; then echo .venv; else echo ".venv-$1"; fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case "${1:-}" in
    --list) echo "$STACKS"; exit 0 ;;
  esac
  load_stack "${1:-}"
  case "${2:-}" in
    --venv) stack_venv "$STACK" ;;
    "") for var in $STACK_VARS; do echo "$var=${!var}"; done ;;
    *) echo "${!2}" ;;
  esac
fi
