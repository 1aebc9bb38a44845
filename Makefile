# agentd: `make run` starts the daemon, `make test` runs the tests. Both install what is missing.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ENGINE ?= vllm
MODEL_DIR ?= $(HOME)/.cache/agentd/models/SmolLM2-135M-Instruct
PYTEST_ARGS ?=

.PHONY: install install-vllm model run test test-fast lint bench bench-gateway bench-kv bench-slo bench-engine bench-agentic-real bench-contexts \
	bench-tools bench-runtime bench-policies bench-lineage bench-scale soak calibrate clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

install-vllm: $(STAMP)
	bash scripts/install-vllm.sh $(PY)

model: install-vllm
	$(VENV)/bin/agentd model fetch-smollm2 $(MODEL_DIR)

ifeq ($(ENGINE),vllm)
run: model
	$(VENV)/bin/agentd start --engine vllm --model $(MODEL_DIR) $(ARGS)
else
run: install
	$(VENV)/bin/agentd start --engine sim $(ARGS)
endif

# pytest exit code 5 (no tests collected) is a failure, not a pass.
test: model
	$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests ran" >&2; exit 1; fi; exit $$rc

# Under two minutes, no vLLM: the unit tests and the UI tests that start no daemon (the
# TUI's model, the web UI's layout). The other UI tests each start a daemon: `make test`.
FAST_TESTS := tests/unit tests/ui/test_tui_model.py tests/ui/test_webui_layout.py
test-fast: install
	$(PY) -m pytest $(FAST_TESTS) -m "not vllm and not browser" $(PYTEST_ARGS)

# mypy checks the packages listed in pyproject.toml, then each example bundle on its own;
# lint-imports holds the architecture's import rules (pyproject.toml's contracts). mypy
# checks the vLLM worker against vLLM's own types, so vLLM is installed first.
lint: install-vllm
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	for example in examples/*/; do $(VENV)/bin/mypy "$$example" || exit 1; done
	$(VENV)/bin/lint-imports

# bench-tools needs a Docker engine; soak runs 30 minutes. Neither is in `bench`.
bench: bench-gateway bench-kv bench-slo bench-runtime bench-policies bench-lineage

bench-gateway: install
	$(PY) -m bench.gateway

bench-kv: install
	$(PY) -m bench.kv

bench-lineage: install
	$(PY) -m bench.lineage

bench-slo: install
	$(PY) -m bench.slo

bench-tools: install
	$(PY) -m bench.tools

bench-runtime: install
	$(PY) -m bench.runtime

bench-policies: install
	$(PY) -m bench.policy_swap

soak: install
	$(PY) -m bench.soak $(ARGS)

bench-engine: model
	$(PY) -m bench.engine

# A real daemon on a real vLLM CPU worker: KV policies in alternating rounds, with the
# simulator's error beside each (bench/agentic_real.py); ARGS="--quick" for a smoke run.
bench-agentic-real: model
	$(PY) -m bench.agentic_real $(ARGS)

# One ReAct-shaped agent run as an in-server program with agentd.Context, as contexts from a
# client, and as chat-endpoint loops with and without program_id, on a sim daemon
# (bench/contexts.py); ARGS="--quick" for a smoke run.
bench-contexts: install
	$(PY) -m bench.contexts $(ARGS)

# One daemon driving 8, 16, 32 and 64 sim worker processes over TCP, then its capacity with
# zero-cost workers and a py-spy profile (bench/scale.py); ARGS="--quick" for a smoke run.
bench-scale: install
	$(PY) -m bench.scale $(ARGS)

calibrate: model
	$(VENV)/bin/agentd calibrate --engine vllm --model $(MODEL_DIR) --name smollm2-135m-cpu \
		--out daemon/engines/sim/cost_models/smollm2-135m-cpu.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
