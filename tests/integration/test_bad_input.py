"""Bad input gets a 4xx naming the problem, in OpenAI's error shape, and writes nothing."""

from __future__ import annotations

import json

import pytest

from tests.daemon_process import DaemonProcess

MODEL = "sim-llama3-8b"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    d = DaemonProcess(data_dir=tmp_path_factory.mktemp("bad") / "data",
                      env={"AGENTD_MAX_BODY_BYTES": "20000"}).start()
    yield d
    d.stop()


def chat(d: DaemonProcess, body: object, raw: bytes | None = None):  # type: ignore[no-untyped-def]
    content = raw if raw is not None else json.dumps(body).encode()
    return d.post("/v1/chat/completions", content=content,
                  headers={"Content-Type": "application/json"})


def error_of(resp) -> dict:  # type: ignore[no-untyped-def,type-arg]
    body = resp.json()
    assert set(body) == {"error"}, body
    assert "Traceback" not in resp.text
    return body["error"]  # type: ignore[no-any-return]


def program_count(d: DaemonProcess) -> int:
    return int(d.get("/v1/programs").json()["total"])


GOOD = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.mark.parametrize(("body", "raw", "status", "needle", "param"), [
    (None, b"{not json", 400, "malformed JSON", None),
    (None, b"", 400, "empty", None),
    ({**GOOD, "model": "gpt-99"}, None, 404, "gpt-99", "model"),
    ({**GOOD, "max_tokens": -5}, None, 400, "max_tokens", "max_tokens"),
    ({**GOOD, "max_tokens": 10**9}, None, 400, "exceeds the limit", "max_tokens"),
    ({**GOOD, "max_tokens": "many"}, None, 400, "max_tokens", "max_tokens"),
    ({"model": MODEL}, None, 400, "messages", None),
    ({**GOOD, "messages": []}, None, 400, "at least one message", "messages"),
    ({**GOOD, "messages": [{"role": "wizard", "content": "x"}]}, None, 400, "role", None),
    ({**GOOD, "temperature": -1}, None, 400, "temperature", "temperature"),
    ({**GOOD, "n": 3}, None, 400, "n=1", "n"),
    ({**GOOD, "program_id": ""}, None, 400, "program_id", "program_id"),
])
def test_bad_chat_requests(daemon, body, raw, status, needle, param) -> None:  # type: ignore[no-untyped-def]
    before = program_count(daemon)
    resp = chat(daemon, body, raw)
    assert resp.status_code == status, resp.text
    err = error_of(resp)
    assert needle in err["message"]
    if param is not None:
        assert err["param"] == param
    assert program_count(daemon) == before


def test_oversized_body_is_413(daemon: DaemonProcess) -> None:
    before = program_count(daemon)
    big = {**GOOD, "messages": [{"role": "user", "content": "x" * 50000}]}
    resp = chat(daemon, big)
    assert resp.status_code == 413
    assert "limit" in error_of(resp)["message"]
    assert program_count(daemon) == before


def test_unknown_program_and_session_are_404(daemon: DaemonProcess) -> None:
    for path in ("/v1/programs/nope", "/v1/sessions/nope", "/v1/sessions/nope/trace"):
        resp = daemon.get(path)
        assert resp.status_code == 404
        assert "nope" in error_of(resp)["message"]
    resp = daemon.post("/v1/programs/nope/release")
    assert resp.status_code == 404 and "nope" in error_of(resp)["message"]


def test_releasing_twice_is_409(daemon: DaemonProcess) -> None:
    assert chat(daemon, {**GOOD, "program_id": "p-twice"}).status_code == 200
    assert daemon.post("/v1/programs/p-twice/release").status_code == 200
    resp = daemon.post("/v1/programs/p-twice/release")
    assert resp.status_code == 409 and "already released" in error_of(resp)["message"]


def test_bad_query_parameters(daemon: DaemonProcess) -> None:
    resp = daemon.get("/v1/programs", params={"status": "SLEEPING"})
    assert resp.status_code == 400 and "status" in error_of(resp)["message"]
    resp = daemon.get("/v1/programs", params={"limit": -1})
    assert resp.status_code == 400 and "limit" in error_of(resp)["message"]


def test_unknown_route_is_404_in_openai_shape(daemon: DaemonProcess) -> None:
    resp = daemon.get("/v1/nothing-here")
    assert resp.status_code == 404 and error_of(resp)["code"] == "not_found"


def test_completions_reject_batched_prompts(daemon: DaemonProcess) -> None:
    resp = daemon.post("/v1/completions", json={"model": MODEL, "prompt": ["a", "b"]})
    assert resp.status_code == 400 and error_of(resp)["param"] == "prompt"
