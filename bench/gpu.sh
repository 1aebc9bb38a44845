#!/usr/bin/env bash
# Real-engine tests and benchmarks on a machine with an NVIDIA GPU.
# Usage (from the repository root): bash bench/gpu.sh [RESULTS_DIR]
# Installs plain vLLM (scripts/install-vllm.sh picks it when nvidia-smi works), converts
# SmolLM2, runs the vLLM test files with the real parts required, then the engine benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/gpu}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt"
make install
bash scripts/install-vllm.sh .venv/bin/python
.venv/bin/agentd model fetch-smollm2
export AGENTD_REQUIRE_VLLM=1 PYTHONUNBUFFERED=1
set +e
.venv/bin/python -m pytest -ra tests/integration/test_vllm_engine.py \
    tests/integration/test_vllm_daemon.py 2>&1 | tee "$out/tests.log"
tests_rc=${PIPESTATUS[0]}
if [ -f bench/engine.py ]; then
    .venv/bin/python -m bench.engine 2>&1 | tee "$out/bench-engine.log"
    cp bench/results/engine.json bench/results/engine.png "$out/" 2>/dev/null
fi
exit "$tests_rc"
