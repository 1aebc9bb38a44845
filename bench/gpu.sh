#!/usr/bin/env bash
# Real-engine tests and benchmarks on a machine with an NVIDIA GPU.
# Usage (from the repository root): bash bench/gpu.sh [--bench-only] [RESULTS_DIR]
# Installs plain vLLM (scripts/install-vllm.sh picks it when nvidia-smi works) unless
# .venv/bin/python already imports it (a machine without internet: bench/gpu_offline_install.sh),
# converts SmolLM2, runs every vLLM test file with the real parts required, fits the sim's cost
# model to this GPU (bf16, CUDA graphs), runs the engine benchmark on the same settings and
# the KV policies on the real engine with and without CPU offloading.
set -euo pipefail
cd "$(dirname "$0")/.."
tests=1
if [ "${1:-}" = "--bench-only" ]; then tests=0; shift; fi
out=${1:-bench/results/gpu}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
if ! .venv/bin/python -c 'import daemon, vllm' 2>/dev/null; then
    make install
    bash scripts/install-vllm.sh .venv/bin/python
fi
# Without flashinfer installed, vLLM's sampler still imports its flashinfer backend unless told
# not to use it; the PyTorch sampler it falls back to is vLLM's own.
if ! .venv/bin/python -c 'import flashinfer' 2>/dev/null; then
    export VLLM_USE_FLASHINFER_SAMPLER=0
fi
.venv/bin/python -m daemon.commands.cli model fetch-smollm2
export AGENTD_REQUIRE_VLLM=1 PYTHONUNBUFFERED=1
tests_rc=0
if [ "$tests" = 1 ]; then
    set +e
    .venv/bin/python -m pytest -ra -p no:cacheprovider tests/integration/test_vllm_engine.py \
        tests/integration/test_vllm_daemon.py tests/integration/test_vllm_kv.py \
        tests/integration/test_slo_llm_vllm.py 2>&1 | tee "$out/tests.log"
    tests_rc=${PIPESTATUS[0]}
    set -e
fi
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-' | tr 'A-Z' 'a-z')
cost="$out/smollm2-135m-$gpu.json"
.venv/bin/python -m daemon.commands.cli calibrate --dtype bfloat16 --cuda-graphs \
    --name "smollm2-135m-$gpu" --out "$cost" 2>&1 | tee "$out/calibrate.log"
.venv/bin/python -m bench.engine --dtype bfloat16 --cuda-graphs --cost-model "$cost" 2>&1 \
    | tee "$out/bench-engine.log"
cp bench/results/engine.json bench/results/engine.png "$out/"
# KV policies on the real engine (bench/agentic_real.py), without and with vLLM's CPU
# offloading of evicted blocks (vllm_kv_offload_bytes: 1 GiB of host memory).
for offload in 0 $((1 << 30)); do
    .venv/bin/python -m bench.agentic_real --dtype bfloat16 --offload-bytes "$offload" \
        --suffix "_gpu_offload$offload" 2>&1 | tee "$out/bench-agentic-real-$offload.log"
    cp "bench/results/agentic_real_gpu_offload$offload".{json,png} "$out/"
done
exit "$tests_rc"
