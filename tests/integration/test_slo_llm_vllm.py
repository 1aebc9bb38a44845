"""The LLM meta selector asking a real model: SmolLM2 on a vLLM worker, its reply held to
the decision's JSON schema by vLLM's structured output. Kept to the first decisions that
rest on a reply. Skipped when vLLM or the model is missing, unless AGENTD_REQUIRE_VLLM=1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from daemon.slo.llm import INTERNAL_SESSION
from scheduling.slo.ordering import default_registry
from tests.daemon_process import DaemonProcess
from tests.vllm_support import MODEL_DIR, _require_vllm
from tests.waiting import wait_for

pytestmark = pytest.mark.vllm
# A CPU step of the 135M model under a loaded test machine can take a while: the
# interval leaves room for an answer before the next decision, the timeout for a slow one.
CONFIG = """\
meta_policy = "meta-llm"
meta_interval_s = 5.0

[slo.llm]
timeout_s = 60
"""


def decisions(d: DaemonProcess) -> list[dict[str, Any]]:
    """Decisions after a call reached the model: not before the first answer came in, nor
    while the worker was still starting."""
    resp = d.get("/v1/scheduling/trace", params={"kind": "meta.llm"})
    return [e for e in resp.json()["data"]
            if e["data"]["outcome"] not in ("pending", "no_worker")]


def test_a_served_model_is_asked_and_its_answer_checked(tmp_path: Path) -> None:
    _require_vllm()
    config = tmp_path / "agentd.toml"
    config.write_text(CONFIG)
    d = DaemonProcess(data_dir=tmp_path / "data", engine="vllm",
                      extra_args=["--model", str(MODEL_DIR), "--config", str(config)],
                      env={"AGENTD_VLLM_KV_CACHE_BYTES": str(64 << 20),
                           "AGENTD_VLLM_MAX_MODEL_LEN": "1024",
                           "AGENTD_HEARTBEAT_TIMEOUT_S": "5"})
    try:
        d.start(timeout=240)
        answered = wait_for(lambda: decisions(d), 180,
                            lambda: f"a decision that rests on a reply\n{d.log()}", interval=0.5)
        first = answered[0]
        data = first["data"]
        # Structured output keeps the reply to the schema: a policy of the pool, a reason.
        assert data["outcome"] == "accepted", data
        assert data["policy"] in default_registry().names()
        assert data["reason"].startswith("LLM: ") and len(data["reason"]) > len("LLM: ")
        assert data["model"] == d.get("/v1/models").json()["data"][0]["id"]
        session = d.get(f"/v1/sessions/{INTERNAL_SESSION}").json()
        requests = d.get(f"/v1/programs/{session['programs'][0]['id']}").json()["requests"]
        [asked] = [r for r in requests if r["id"] == first["request_id"]]
        assert asked["status"] == "finished" and asked["worker_id"].startswith("local-vllm")
    finally:
        d.stop()
