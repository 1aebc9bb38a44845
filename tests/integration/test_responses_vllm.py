"""The Responses API on the real engine: openai client → agentd → vLLM worker (CPU) →
SmolLM2. A chain of two responses, the second streamed. Skipped when vLLM or the model is
missing, unless AGENTD_REQUIRE_VLLM=1."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.integration.test_vllm_daemon import vllm_daemon

pytestmark = pytest.mark.vllm


def test_a_chain_of_responses_on_vllm(tmp_path: Path) -> None:
    d = vllm_daemon(tmp_path / "data", 64 << 20, 1024)
    try:
        client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0,
                               timeout=120)
        model = client.models.list().data[0].id
        first = client.responses.create(model=model, input="What is the capital of France?",
                                        instructions="Answer in one short sentence.",
                                        temperature=0, max_output_tokens=24)
        assert "Paris" in first.output_text
        events = list(client.responses.create(
            model=model, input="And of Italy?", previous_response_id=first.id, temperature=0,
            max_output_tokens=24, stream=True))
        completed = events[-1]
        assert completed.type == "response.completed"
        second = completed.response
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert second.output_text == deltas and deltas
        # One program, and the second prompt holds the first exchange (the instructions do
        # not carry over): more than the first reply and the new question.
        assert (second.model_extra or {})["program_id"] == (first.model_extra or {})["program_id"]
        assert second.usage is not None and first.usage is not None
        assert second.usage.input_tokens > first.usage.output_tokens + 5
        assert client.responses.retrieve(second.id).output_text == deltas
    finally:
        d.stop()
