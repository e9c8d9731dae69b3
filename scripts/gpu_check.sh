#!/usr/bin/env bash
# The GPU check: one script for a machine with NVIDIA GPUs (driver and nvidia-smi installed). NOT RUN YET: no
# machine with a GPU has been available to this project; the README says so until it has run.
#
#   bash scripts/gpu_check.sh [VENV]        (default VENV: .venv-gpu for the default row, .venv-gpu-NAME else)
#
# Environment: HVD_SCHED_STACK (the row, default the first of STACKS in scripts/versions.env), HVD_SCHED_GPU_OUT
# (the output folder, default runs/gpu_check), HVD_SCHED_CACHE (as for install.sh).
#
# Steps, each of which stops the script with its log on failure (set -euo pipefail):
#   1. install the GPU row: HVD_SCHED_GPU=1 scripts/install.sh (tensorflow[and-cuda], Horovod with NCCL; it needs
#      a CUDA toolkit with NCCL headers: a CUDA devel image, or Debian trixie's packages, see docs/how-to/gpu-build.md);
#   2. `horovodrun --check-build` must list TensorFlow, Gloo and NCCL; hvd.nccl_built() and hvd.cuda_built();
#   3. TensorFlow must see every GPU that nvidia-smi lists;
#   4. the GPU-default tests on the GPU (tests/keras/test_gpu_defaults.py, tests/multirank/
#      test_gpu_defaults_ranks.py: Keras 2's per-variable XLA update, which Keras turns on by itself when a GPU
#      is visible, and mixed_float16), then all Keras and multi-rank tests (tests/keras, tests/multirank);
#   5. examples/train_keras.py with `horovodrun -np <GPUs>`, one GPU per rank, with a Horovod timeline: every
#      rank must end at the same accuracy, and the timeline must hold NCCL_ALLREDUCE activities (NCCL, not Gloo,
#      carried the gradients' allreduce; Gloo only coordinates);
#   6. bench/overhead.py --quick (1 and 2 ranks).
# Writes OUT/summary.json: machine, GPUs, versions, each step's status, seconds and log, and the pytest counts,
# the example's accuracies and NCCL evidence, and the benchmark's result. Exit status 0 only if every step passed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"
# shellcheck source=stack.sh
. "$here/stack.sh"
load_stack "${HVD_SCHED_STACK:-}"
if [ "$STACK" = "$DEFAULT_STACK" ]; then default_venv=.venv-gpu; else default_venv=".venv-gpu-$STACK"; fi
venv="${1:-$root/$default_venv}"
out="${HVD_SCHED_GPU_OUT:-$root/runs/gpu_check}"
summary="$out/summary.json"
mkdir -p "$out"
steps_file="$out/steps.jsonl"
: > "$steps_file"

die() { echo "gpu_check.sh: ERROR: $*" >&2; exit 1; }
command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: this check needs a machine with NVIDIA GPUs"
gpus="$(nvidia-smi --list-gpus | grep -c '^GPU ' || true)"
[ "$gpus" -ge 1 ] || die "nvidia-smi lists no GPU"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader > "$out/gpus.csv"

write_summary() {  # $1: overall status
  STATUS="$1" STACK="$STACK" GPUS="$gpus" OUT="$out" VENV="$venv" python3 - "$summary" <<'EOF'
import json, os, platform, sys
out = os.environ["OUT"]
steps = [json.loads(line) for line in open(os.path.join(out, "steps.jsonl")) if line.strip()]
extra = {}
for name in ("pytest", "gpu_defaults", "example", "bench", "versions", "built"):
    path = os.path.join(out, f"{name}.result")
    if os.path.exists(path):
        text = open(path).read().strip()
        try:
            extra[name] = json.loads(text)
        except ValueError:
            extra[name] = text
summary = {"status": os.environ["STATUS"], "stack": os.environ["STACK"], "venv": os.environ["VENV"],
           "host": platform.node(), "nproc": os.cpu_count(), "gpus": int(os.environ["GPUS"]),
           "gpu_list": open(os.path.join(out, "gpus.csv")).read().strip().splitlines(), "steps": steps, **extra}
with open(sys.argv[1], "w") as f:
    json.dump(summary, f, indent=2)
print(f"gpu_check.sh: {summary['status']}: summary in {sys.argv[1]}")
EOF
}

step() {  # step NAME COMMAND...: runs COMMAND with its output in OUT/NAME.log; any failure ends the script
  local name="$1" start rc=0; shift
  echo "gpu_check.sh: === $name: $*"
  start=$(date +%s)
  "$@" > "$out/$name.log" 2>&1 || rc=$?
  printf '{"step": "%s", "rc": %d, "seconds": %d, "log": "%s"}\n' "$name" "$rc" "$(( $(date +%s) - start ))" \
    "$out/$name.log" >> "$steps_file"
  if [ "$rc" != 0 ]; then
    tail -n 60 "$out/$name.log" >&2
    write_summary "failed at $name"
    die "step $name failed (exit $rc); full log in $out/$name.log"
  fi
}

step install env HVD_SCHED_GPU=1 HVD_SCHED_STACK="$STACK" bash scripts/install.sh "$venv"
py="$venv/bin/python"
hvdrun="$venv/bin/horovodrun"
# The row decides what tf.keras is (as in the Makefile): tf-keras under TF_USE_LEGACY_KERAS=1, Keras 3 on keras3.
if [ "$LEGACY_KERAS" = 1 ]; then export TF_USE_LEGACY_KERAS=1; else unset TF_USE_LEGACY_KERAS; fi
export HVD_SCHED_STACK="$STACK" TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}" PYTHONUNBUFFERED=1
# Several ranks share the GPUs in the multi-rank tests: no process may take all of a GPU's memory up front.
export TF_FORCE_GPU_ALLOW_GROWTH=true

check_build() {
  local report
  # Called as `step ... || rc=$?`, where set -e is off: every failure below returns explicitly.
  report="$("$hvdrun" --check-build)" || return 1
  echo "$report"
  for want in TensorFlow Gloo NCCL; do
    echo "$report" | grep -q "\[X\] $want" || { echo "horovodrun --check-build does not list $want"; return 1; }
  done
}
step check_build check_build

built() {
  "$py" -c "
import json, sys
import horovod.tensorflow as hvd
built = {name: getattr(hvd, name)() for name in ('nccl_built', 'cuda_built', 'gloo_built')}
print(json.dumps(built))
sys.exit(not all(built.values()))" | tee "$out/built.result"
}
step built built

tf_sees_gpus() {
  "$py" -c "
import json, sys
import hvd_sched._compat
import tensorflow as tf, horovod
seen = tf.config.list_physical_devices('GPU')
info = tf.sysconfig.get_build_info()
print(json.dumps({'tensorflow': tf.__version__, 'horovod': horovod.__version__, 'gpus_seen': len(seen),
                  'cuda': info.get('cuda_version'), 'cudnn': info.get('cudnn_version')}))
sys.exit(len(seen) != $gpus)" | tail -n 1 | tee "$out/versions.result"
}
step tensorflow_gpus tf_sees_gpus

junit_counts() {  # junit_counts XML: the pytest counts as one JSON line
  "$py" - "$1" <<'EOF'
import json, sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suite = root if root.tag == "testsuite" else root.find("testsuite")
print(json.dumps({key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}))
EOF
}

# The defaults a GPU turns on (issue 19), first and on their own: a failure here is the GPU's, not the suite's.
gpu_defaults() {
  local rc=0
  "$py" -m pytest tests/keras/test_gpu_defaults.py tests/multirank/test_gpu_defaults_ranks.py -q \
    -p no:cacheprovider --junitxml="$out/gpu_defaults.xml" || rc=$?
  junit_counts "$out/gpu_defaults.xml" > "$out/gpu_defaults.result"
  return $rc
}
step gpu_defaults gpu_defaults

keras_tests() {
  local rc=0
  "$py" -m pytest tests/keras tests/multirank -q -p no:cacheprovider --junitxml="$out/junit.xml" || rc=$?
  junit_counts "$out/junit.xml" > "$out/pytest.result"
  return $rc
}
step keras_tests keras_tests

# One GPU per rank; the timeline records which backend ran each allreduce.
example() {
  local rc=0
  rm -f "$out/timeline.json"
  "$hvdrun" -np "$gpus" -H "localhost:$gpus" --gloo --timeline-filename "$out/timeline.json" "$py" \
    examples/train_keras.py --config examples/configs/digits_warmup_steps.yaml --epochs 8 --out "$out/example" \
    || rc=$?
  "$py" - "$out/example.log" "$out/timeline.json" "$gpus" > "$out/example.result" <<'EOF' || rc=$?
import json, os, re, sys
log, timeline, gpus = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(log).read()
accuracy = {int(rank): value for rank, value in re.findall(r"rank (\d+): final val accuracy ([0-9.]+)", text)}
events = open(timeline).read() if os.path.exists(timeline) else ""
result = {"last_line": [line for line in text.splitlines() if line.strip()][-1:], "accuracy": accuracy,
          "ranks_identical": len(accuracy) == gpus and len(set(accuracy.values())) == 1,
          "nccl_allreduce_events": events.count('"NCCL_ALLREDUCE"'),
          "gloo_allreduce_events": events.count('"GLOO_ALLREDUCE"')}
print(json.dumps(result))
sys.exit(not (result["ranks_identical"] and result["nccl_allreduce_events"] > 0))
EOF
  return $rc
}
step example example

bench() {
  "$py" bench/overhead.py --quick --out "$out/overhead.json"
  local rc=$?
  [ -f "$out/overhead.json" ] && cp "$out/overhead.json" "$out/bench.result"
  return $rc
}
step bench bench

write_summary passed
