#!/usr/bin/env bash
# `make test`: one row's tests, in two phases, with one closing line.
#
#   bash scripts/test.sh PYTHON [pytest arguments...]
#
# 1. the in-process tests (not marked multirank) under pytest-xdist, TEST_WORKERS workers (default 2; 0 or 1:
#    serial), each TensorFlow with one intra-op and one inter-op thread (TF would size its pools to every core in
#    each worker);
# 2. the multi-rank tests (marked multirank: tests/multirank, the benchmarks' 2-rank quick runs, the docs' horovodrun
#    sessions), one at a time: a 2-rank job takes both cores, and xdist's groups cannot keep two jobs apart.
# Which tests a row runs is tests/rows.py's rule (tests/conftest.py applies it); TEST_MARKS (a pytest -m
# expression) narrows both phases. A phase that selects nothing (pytest's exit 5) is not a failure. The last line
# sums both phases: "tests: N passed, N failed, N skipped" (also written to $HVD_SCHED_TEST_COUNTS, where set, as
# "N N N" for .ci/run's closing line).
set -uo pipefail
py="$1"; shift
workers="${TEST_WORKERS:-2}"
marks="${TEST_MARKS:-}"
work="$(mktemp -d "${TMPDIR:-/tmp}/hvd_sched-test.XXXXXX")"
trap 'rm -rf "$work"' EXIT
status=0
phase() {  # phase NAME MARK-EXPRESSION [pytest arguments...]
  local name="$1" expr="$2"; shift 2
  [ -z "$marks" ] || expr="($expr) and ($marks)"
  echo "test.sh: === $name: pytest -m \"$expr\" $* ==="
  "$py" -m pytest tests -m "$expr" --durations=20 --junitxml="$work/$name.xml" "$@"
  local rc=$?
  if [ "$rc" = 5 ]; then
    echo "test.sh: $name: no test selected on this row"
  elif [ "$rc" != 0 ]; then
    echo "test.sh: $name: FAILED (pytest exit $rc)"; status=1
  fi
}
parallel=()
if [ "$workers" -gt 1 ]; then
  parallel=(-n "$workers")
  export TF_NUM_INTRAOP_THREADS="${TF_NUM_INTRAOP_THREADS:-1}" TF_NUM_INTEROP_THREADS="${TF_NUM_INTEROP_THREADS:-1}"
fi
(phase in-process "not multirank" "${parallel[@]}" "$@"; exit $status) || status=1
(unset TF_NUM_INTRAOP_THREADS TF_NUM_INTEROP_THREADS; export HVD_SCHED_CPU_LOG="$work/multirank-cpu.jsonl"
 phase multi-rank "multirank" "$@"; exit $status) || status=1
# How busy the cores were in the serial multi-rank phase (tests/conftest.py logs each test): what running two of its
# tests side by side could gain.
[ ! -s "$work/multirank-cpu.jsonl" ] || "$py" - "$work/multirank-cpu.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
rows = [r for r in rows if r["busy"] is not None]
wall = sum(r["seconds"] for r in rows)
if wall:
    busy = sum(r["seconds"] * r["busy"] for r in rows) / wall
    print(f"test.sh: multi-rank phase: {len(rows)} tests, {wall:.0f} s, the cores {100 * busy:.0f}% busy on average; "
          "the 10 with the most idle core time (s idle of s, % busy):")
    for r in sorted(rows, key=lambda r: -r["seconds"] * (1 - r["busy"]))[:10]:
        print(f"test.sh:   {r['seconds'] * (1 - r['busy']):6.1f} of {r['seconds']:6.1f} s ({100 * r['busy']:3.0f}%) {r['test']}")
PY
"$py" - "$work" "${HVD_SCHED_TEST_COUNTS:-}" <<'PY'
import pathlib, sys, xml.etree.ElementTree as ET
counts = dict(tests=0, failures=0, errors=0, skipped=0)
for path in pathlib.Path(sys.argv[1]).glob("*.xml"):
    for suite in ET.parse(path).getroot().iter("testsuite"):
        for key in counts:
            counts[key] += int(suite.get(key, 0))
failed = counts["failures"] + counts["errors"]
passed = counts["tests"] - failed - counts["skipped"]
print(f"tests: {passed} passed, {failed} failed, {counts['skipped']} skipped")
if len(sys.argv) > 2 and sys.argv[2]:
    pathlib.Path(sys.argv[2]).write_text(f"{passed} {failed} {counts['skipped']}\n")
PY
exit $status
