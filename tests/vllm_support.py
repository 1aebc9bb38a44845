"""Shared by the real-vLLM tests: where the model is, and skip-or-fail when it is missing."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from daemon.models.smollm2 import DEFAULT_SMOLLM2_DIR, is_complete

MODEL_DIR = Path(os.environ.get("AGENTD_TEST_MODEL_DIR") or DEFAULT_SMOLLM2_DIR)


def _missing(need_model: bool) -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (make install-vllm)"
    if need_model and not is_complete(MODEL_DIR):
        return f"no converted SmolLM2 in {MODEL_DIR} (make model)"
    return None


def _require_vllm(need_model: bool = True) -> None:
    """Skip when vLLM or the model is missing; fail instead under AGENTD_REQUIRE_VLLM=1."""
    reason = _missing(need_model)
    if reason is None:
        return
    if os.environ.get("AGENTD_REQUIRE_VLLM") == "1":
        pytest.fail(f"{reason}; AGENTD_REQUIRE_VLLM=1 requires it", pytrace=False)
    pytest.skip(reason)
