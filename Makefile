# `make demo` and `make test` create the virtual environment on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# This machine serves these two from local disk; override for another platform or CUDA build.
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
STAMP := $(VENV)/.hookscope-installed

.PHONY: install demo docs-sandbox test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e '.[test,lint]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/hookscope stats resnet18 sample_images/cat.jpg

# The files the docs' examples name, in SANDBOX (a new folder): see docs/index.md.
SANDBOX ?= hookscope-docs
docs-sandbox: $(STAMP)
	$(PY) docs/sandbox.py $(SANDBOX)

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check hookscope tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/vulture

bench: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) benchmarks/bench_stats.py
	$(PY) benchmarks/bench_gradcam.py
	$(PY) benchmarks/bench_grads.py
	$(PY) benchmarks/bench_ablate.py
	$(PY) benchmarks/bench_dataset.py

clean:
	rm -rf $(VENV) hookscope-out hookscope-docs .pytest_cache
