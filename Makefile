# The README's two commands: `make demo` and `make test`. Both install first (once; later runs reuse the virtual
# environment and the cached Horovod wheel in $(HVD_SCHED_CACHE), default ~/.cache/hvd_sched).
#
# STACK picks a row of the support matrix (scripts/versions.env; default: its first row, in .venv):
#   make test STACK=tf2.21        (Python 3.13, TensorFlow 2.21 + tf-keras as tf.keras, in .venv-tf2.21)
#   make test STACK=keras3        (Python 3.13, TensorFlow 2.21 with Keras 3 as tf.keras, in .venv-keras3)
STACKS := $(shell bash scripts/stack.sh --list)
STACK ?= $(firstword $(STACKS))
ifeq ($(filter $(STACK),$(STACKS)),)
$(error unknown STACK=$(STACK); scripts/versions.env has: $(STACKS))
endif
VENV ?= $(shell bash scripts/stack.sh $(STACK) --venv)
PY := $(VENV)/bin/python
HOROVODRUN := $(VENV)/bin/horovodrun
STAMP := $(VENV)/.hvd_sched-installed
NP ?= 2
PYTEST_ARGS ?=
# The row's pytest -m expression (scripts/versions.env TEST_MARKS); `make test TEST_MARKS=` runs every test.
TEST_MARKS ?= $(shell bash scripts/stack.sh $(STACK) TEST_MARKS)

export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONUNBUFFERED = 1
export HVD_SCHED_STACK := $(STACK)
# The row, not the caller's shell, decides what tf.keras is on TensorFlow >= 2.16: tf-keras (Keras 2) on rows with
# LEGACY_KERAS=1; on the others TF_USE_LEGACY_KERAS is removed from every recipe's environment, so a value left
# over from a tf-keras row cannot turn the keras3 row into a Keras 2 run.
ifeq ($(shell bash scripts/stack.sh $(STACK) LEGACY_KERAS),1)
export TF_USE_LEGACY_KERAS = 1
else
unexport TF_USE_LEGACY_KERAS
endif

.PHONY: install demo test bench clean gpu-build-check docs ci

install: $(STAMP)

$(STAMP): scripts/install.sh scripts/mpi.sh scripts/stack.sh scripts/versions.env pyproject.toml
	bash scripts/install.sh $(VENV)
	@touch $@

demo: install
	$(HOROVODRUN) -np $(NP) -H localhost:$(NP) --gloo \
	  $(PY) examples/train_keras.py --config examples/configs/digits_warmup_steps.yaml --epochs 8 --out runs/demo

# Two phases (scripts/test.sh): the in-process tests under pytest-xdist (TEST_WORKERS, default 2), then the
# multi-rank ones one at a time; the rows each test runs on are tests/rows.py's rule (HVD_SCHED_ALL_ROWS=1: all).
test: install
	TEST_MARKS='$(TEST_MARKS)' bash scripts/test.sh $(PY) $(PYTEST_ARGS)

bench: install
	$(PY) bench/overhead.py --quick
	$(PY) bench/lr_at_speed.py

# The GPU build (Horovod with NCCL against tensorflow[and-cuda]) made and checked on this machine, with no GPU, in
# a Debian trixie root with Debian's CUDA 12.4 and NCCL (docs/how-to/gpu-build.md). Needs root and mmdebstrap. Without
# STACK= on the command line: the newest row (tf2.21), not the default row, whose Python is not trixie's (so the
# HVD_SCHED_STACK exported above for the default row is taken out of the recipe's environment).
gpu-build-check:
	env -u HVD_SCHED_STACK bash scripts/gpu_build_check.sh $(if $(filter file default,$(origin STACK)),,$(STACK))

# The documentation site (mkdocs.yml): a virtual environment of its own (.venv-docs, made by python3 >= 3.11, the
# tools pinned in scripts/docs-requirements.txt, hvd_sched itself without TensorFlow), then an offline build in strict mode into
# build/site (ignored by git): a warning, a broken link or anchor, a page left out of the navigation or a public
# name without a docstring fails it. Open build/site/index.html through a web server (`python -m http.server -d
# build/site`): the search runs in a web worker, which browsers refuse to start from file:// pages.
DOCS_VENV ?= .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.hvd_sched-docs-installed
DOCS_PYTHON ?= python3

$(DOCS_STAMP): scripts/docs-requirements.txt pyproject.toml
	$(DOCS_PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install -q -r scripts/docs-requirements.txt
	$(DOCS_VENV)/bin/pip install -q --no-deps -e .
	@touch $@

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --clean

clean:
	rm -rf $(VENV) runs .pytest_cache build/site

# What CI runs, rehearsed: a clean clone of HEAD (committed work only) in a temporary folder, `CI=true bash .ci/run`
# there (its summary is CI's), the clone removed after. The Horovod wheels, the GPU root and pip's cache are shared
# with this checkout (HVD_SCHED_CACHE, ~/.cache/pip); the variables this Makefile exports are taken out, as CI has
# none of them.
ci:
	@git diff --quiet HEAD -- || echo "make ci: WARNING: uncommitted changes are not in the rehearsal (it clones HEAD)"
	@d=$$(mktemp -d "$${TMPDIR:-/tmp}/hvd_sched-ci.XXXXXX") && git clone -q . "$$d/clone" && cd "$$d/clone" && \
	  { env -u HVD_SCHED_STACK -u TF_USE_LEGACY_KERAS -u PYTHONUNBUFFERED -u TF_CPP_MIN_LOG_LEVEL CI=true \
	    bash .ci/run; rc=$$?; cd /; rm -rf "$$d"; exit $$rc; }
