#!/usr/bin/env bash
# The package as users get it (CI runs this; seconds per Python, plus the first downloads):
#
#   bash scripts/package_check.sh                  build, check, and install on PYTHONS without TensorFlow
#   bash scripts/package_check.sh --row NAME ...   then, for each row, install the wheel (not editable) into the
#                                                  row's venv, check that no other package moved, run the demo
#                                                  from outside the repository, and put the editable install back
#
# 1. builds the wheel and the sdist from pyproject.toml (python -m build, in a tool venv), checks their metadata
#    (twine check --strict) and their contents (the package and its metadata; no tests, no scripts);
# 2. for each Python of PYTHONS (3.11 and 3.13 are also the rows' own, tested whole by `make test`): a fresh venv
#    with no TensorFlow, `pip install` of the wheel (numpy and PyYAML
#    come with it), then from a folder outside the repository: `hvd-sched show` / `check` on the demo's config,
#    hvd_sched imported from that venv's site-packages, and the pure tests (tests/unit, tests/test_cli.py;
#    those that need TensorFlow skip themselves, by their own importorskip);
# 3. (--row) into the row's venv: `pip install` of the wheel with its dependencies; `pip freeze` must be the same
#    before and after but for hvd_sched itself (TensorFlow, numpy, Keras untouched); the README's demo runs under
#    horovodrun from a temporary folder with copies of examples/train_keras.py and its config, and both ranks
#    must print the same final accuracy.
# Exits non-zero at the first failure (set -euo pipefail), naming the step.
set -euo pipefail

PYTHONS="3.10 3.12 3.13"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
# shellcheck source=stack.sh
. "$here/stack.sh"
die() { echo "package_check.sh: ERROR: $*" >&2; exit 1; }
step() { echo "package_check.sh: $*"; }

rows=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    # Checked in a subshell: load_stack leaves a row's pins set, and the default row's are the unprefixed ones.
    --row) [ -n "${2:-}" ] || die "--row needs a row name"; (load_stack "$2") || exit 1; rows+=("$2"); shift 2 ;;
    *) die "unknown argument '$1' (usage: package_check.sh [--row NAME ...])" ;;
  esac
done

find_python() {  # python3.X on PATH that runs, else pyenv's build of it (as scripts/install.sh looks)
  local version="$1" cand
  for cand in "$(command -v "python$version" || true)" \
      "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version".*/bin/"python$version"; do
    [ -n "$cand" ] && [ -x "$cand" ] || continue
    if "$cand" -c "import sys; sys.exit('%d.%d' % sys.version_info[:2] != '$version')" 2>/dev/null; then
      echo "$cand"; return 0
    fi
  done
  return 1
}

work="$(mktemp -d "${TMPDIR:-/tmp}/hvd_sched-package.XXXXXX")"
trap 'rm -rf "$work"' EXIT
dist="$work/dist"
pipq() { local py="$1"; shift; "$py" -m pip --disable-pip-version-check -q "$@"; }

# 1. Build and check.
tool_py="$(find_python 3.11 || find_python 3.12 || command -v python3)" || die "no python3 to build with"
step "building the wheel and the sdist (python -m build, $("$tool_py" --version))"
"$tool_py" -m venv "$work/tools"
PIP_CONSTRAINT= "$work/tools/bin/python" -m pip --disable-pip-version-check -q install build twine \
  || die "pip install build twine failed"
(cd "$root" && "$work/tools/bin/python" -m build --sdist --wheel --outdir "$dist" . > "$work/build.log" 2>&1) \
  || { tail -n 30 "$work/build.log" >&2; die "python -m build failed"; }
wheel="$(ls "$dist"/hvd_sched-*-py3-none-any.whl)" || die "no pure-Python wheel was built"
sdist="$(ls "$dist"/hvd_sched-*.tar.gz)" || die "no sdist was built"
"$work/tools/bin/python" -m twine check --strict "$wheel" "$sdist" || die "twine check failed"
"$work/tools/bin/python" - "$wheel" "$sdist" <<'EOF' || die "the wheel or the sdist holds the wrong files"
import sys, tarfile, zipfile
wheel, sdist = sys.argv[1:]
names = zipfile.ZipFile(wheel).namelist()
outside = [n for n in names if not n.startswith(("hvd_sched/", "hvd_sched-"))]
assert not outside, f"the wheel holds files outside the package: {outside}"
assert "hvd_sched/keras/__init__.py" in names and "hvd_sched/cli.py" in names, names
metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
assert not [r for r in requires if "tensorflow" in r.lower() or "tf-keras" in r.lower() or "horovod" in r.lower()], requires
assert "Requires-Python: <3.14,>=3.10" in metadata or "Requires-Python: >=3.10,<3.14" in metadata
members = tarfile.open(sdist).getnames()
top = members[0].split("/")[0]
for needed in ("pyproject.toml", "README.md", "hvd_sched/__init__.py", "hvd_sched/keras/_keras3.py"):
    assert f"{top}/{needed}" in members, needed
print(f"package_check.sh: {wheel.rsplit('/', 1)[-1]}: {len(names)} files; {', '.join(requires)}")
EOF

demo_config="$root/examples/configs/digits_warmup_steps.yaml"
outside="$work/outside"
mkdir -p "$outside"

# 2. Fresh venvs with no TensorFlow, one per Python, side by side (each is one process at a time: its pip, then its
#    pytest; three of them on 2 cores take about half the time of one after another).
check_python() {
  local version="$1" py venv="$work/py$1" start
  py="$(find_python "$version")" || die "Python $version not found (python$version on PATH or pyenv)"
  start=$(date +%s)
  "$py" -m venv "$venv"
  pipq "$venv/bin/python" install "$wheel" || die "pip install of the wheel failed on Python $version"
  # What the pure tests import besides the package (the test extra's TensorFlow-side tools are not needed).
  # pytest-timeout: pytest.ini bounds every test (tests/guard.py).
  pipq "$venv/bin/python" install pytest pytest-timeout hypothesis matplotlib \
    || die "pip install of the test tools failed"
  ! "$venv/bin/python" -c "import tensorflow" 2>/dev/null || die "Python $version: TensorFlow was installed"
  cd "$outside"
  "$venv/bin/hvd-sched" show "$demo_config" --world-size 2 --steps-per-epoch 22 > "$work/show-$version.txt" \
    || die "Python $version: hvd-sched show failed"
  "$venv/bin/hvd-sched" check "$demo_config" > /dev/null || die "Python $version: hvd-sched check failed"
  "$venv/bin/python" -c "import hvd_sched, sys; assert hvd_sched.__file__.startswith(sys.prefix), hvd_sched.__file__" \
    || die "Python $version: hvd_sched was not imported from the installed wheel"
  "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/unit" "$root/tests/test_cli.py" \
    > "$work/pytest-$version.txt" 2>&1 \
    || { tail -n 40 "$work/pytest-$version.txt" >&2; die "Python $version: the pure tests failed"; }
  step "Python $version: wheel installed, hvd-sched show/check, $(tail -n 1 "$work/pytest-$version.txt") ($(( $(date +%s) - start )) s)"
}
pids=()
for version in $PYTHONS; do
  (check_python "$version") > "$work/python-$version.log" 2>&1 &
  pids+=("$!")
done
failed_pythons=()
i=0
for version in $PYTHONS; do
  wait "${pids[$i]}" || failed_pythons+=("$version")
  cat "$work/python-$version.log"
  i=$((i + 1))
done
[ "${#failed_pythons[@]}" = 0 ] || die "Python ${failed_pythons[*]}: the checks above failed"
cmp -s "$work/show-${PYTHONS%% *}.txt" "$work/show-${PYTHONS##* }.txt" \
  || die "hvd-sched show prints different schedules on Python ${PYTHONS%% *} and ${PYTHONS##* }"

# 3. The wheel in a row's training environment (a subshell per row: its pins, its TF_USE_LEGACY_KERAS).
check_row() {
  local row="$1"
  load_stack "$row"
  local venv="$root/$(stack_venv "$row")"
  local py="$venv/bin/python" demo_dir="$work/demo-$row" finals
  [ -x "$py" ] || die "row $row has no venv at $venv (make install STACK=$row)"
  if [ "$LEGACY_KERAS" = 1 ]; then export TF_USE_LEGACY_KERAS=1; else unset TF_USE_LEGACY_KERAS; fi
  pipq "$py" freeze --exclude-editable | grep -iv '^hvd.sched' | sort > "$work/freeze-before-$row.txt"
  pipq "$py" uninstall -y hvd_sched
  # Whatever happens next, the row's venv gets its editable install back (make test runs from it).
  # (Expanded now: the trap runs after this function has returned, when its locals are gone.)
  trap "pipq '$py' install --no-deps -e '$root' > /dev/null 2>&1 || echo 'package_check.sh: WARNING: could not restore the editable install in $venv' >&2" EXIT
  pipq "$py" install "$wheel" || die "row $row: pip install of the wheel failed"
  pipq "$py" freeze | grep -iv '^hvd.sched' | sort > "$work/freeze-after-$row.txt"
  diff "$work/freeze-before-$row.txt" "$work/freeze-after-$row.txt" >&2 \
    || die "row $row: installing the wheel changed other packages (above)"
  mkdir -p "$demo_dir"
  cp "$root/examples/train_keras.py" "$demo_config" "$demo_dir/"
  cd "$demo_dir"
  "$py" -c "import hvd_sched, sys; assert hvd_sched.__file__.startswith(sys.prefix), hvd_sched.__file__" \
    || die "row $row: hvd_sched was not imported from the installed wheel"
  OMP_NUM_THREADS=1 TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 TF_CPP_MIN_LOG_LEVEL=2 \
    "$venv/bin/horovodrun" -np 2 -H localhost:2 --gloo "$py" train_keras.py \
    --config digits_warmup_steps.yaml --epochs 8 --out "$demo_dir/out" > "$demo_dir/demo.txt" 2>&1 \
    || { tail -n 40 "$demo_dir/demo.txt" >&2; die "row $row: the demo failed with the installed wheel"; }
  finals="$(grep -o 'rank [01]: final val accuracy [0-9.]*' "$demo_dir/demo.txt" | sort)"
  [ "$(echo "$finals" | wc -l)" = 2 ] && [ "$(echo "$finals" | awk '{print $NF}' | sort -u | wc -l)" = 1 ] \
    || { cat "$demo_dir/demo.txt" >&2; die "row $row: the two ranks did not end with the same accuracy"; }
  step "row $row: the wheel installed beside TensorFlow $TENSORFLOW_VERSION, no other package changed; the demo" \
    "from $demo_dir: $(echo "$finals" | tr '\n' ' ')"
}
for row in "${rows[@]}"; do
  start=$(date +%s)
  (check_row "$row") || exit 1
  step "row $row: $(( $(date +%s) - start )) s"
done
step "OK"
