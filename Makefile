# The README's two commands: `make demo` and `make test`. Both install first (once; later runs reuse .venv and
# the cached Horovod wheel in $(HVD_SCHED_CACHE), default ~/.cache/hvd_sched).
VENV ?= .venv
PY := $(VENV)/bin/python
HOROVODRUN := $(VENV)/bin/horovodrun
STAMP := $(VENV)/.hvd_sched-installed
NP ?= 2
PYTEST_ARGS ?=

export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONUNBUFFERED = 1

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): scripts/install.sh scripts/versions.env setup.py
	bash scripts/install.sh $(VENV)
	@touch $@

demo: install
	$(HOROVODRUN) -np $(NP) -H localhost:$(NP) --gloo \
	  $(PY) examples/train_keras.py --config examples/configs/digits_warmup_steps.yaml --epochs 8 --out runs/demo

test: install
	$(PY) -m pytest tests $(PYTEST_ARGS)

bench: install
	$(PY) bench/overhead.py --quick
	$(PY) bench/lr_at_speed.py

clean:
	rm -rf $(VENV) runs .pytest_cache
