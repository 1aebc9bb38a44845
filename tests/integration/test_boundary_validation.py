"""Validation at the boundary: what the worker protocol, a URL path or a response header
cannot carry is a 400 naming the field before anything runs, and the worker stays healthy.

Integers are bounded to the protocol's ranges, ids to one alphabet (daemon/api/ids.py),
JSON nesting to a depth (daemon/api/errors.py); invalid UTF-8 and empty prompts are 400s.
"""

from __future__ import annotations

from typing import Any

import pytest

from daemon.api.errors import MAX_JSON_DEPTH
from tests.daemon_process import DaemonProcess
from tests.integration.test_bad_input import GOOD, MODEL, error_of, program_count

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    d = DaemonProcess(data_dir=tmp_path_factory.mktemp("boundary") / "data").start()
    yield d
    d.stop()


def queued_programs(d: DaemonProcess) -> int:
    return int(d.get("/v1/programs", params={"status": "QUEUED"}).json()["total"])


def assert_refused(d: DaemonProcess, path: str, body: Any = None, param: str | None = None,
                   needle: str = "", **kw: Any) -> dict[str, Any]:
    """A 400 in OpenAI's shape naming `param`, and no program made."""
    before = program_count(d)
    resp = d.post(path, json=body, **kw) if body is not None else d.post(path, **kw)
    assert resp.status_code == 400, resp.text
    err = error_of(resp)
    assert err["param"] == param, err
    assert needle in err["message"], err
    assert program_count(d) == before
    return err


@pytest.mark.parametrize(("field", "value"), [
    ("seed", 2**64),
    ("seed", INT64_MAX + 1),
    ("seed", -(2**63) - 1),
    ("top_k", 2**64),
    ("top_k", INT32_MAX + 1),
    ("top_k", -2),
    ("priority", 2**64),
    ("priority", -(2**31) - 1),
    ("max_tokens", 2**64),
    ("max_completion_tokens", 0),
])
def test_integers_outside_the_protocol_ranges_are_400(daemon: DaemonProcess, field: str,
                                                      value: int) -> None:
    assert_refused(daemon, "/v1/chat/completions", {**GOOD, field: value}, field, field)


def test_a_seed_beyond_64_bits_fails_alone(daemon: DaemonProcess) -> None:
    """The request that once raised OverflowError while its worker message was encoded
    (500, its program QUEUED for ever, the only worker marked suspect)."""
    for path, body in (("/v1/chat/completions", {**GOOD, "program_id": "p-seed"}),
                       ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2})):
        assert_refused(daemon, path, {**body, "seed": 18446744073709551616}, "seed")
    assert queued_programs(daemon) == 0
    workers = daemon.get("/v1/workers").json()["data"]
    assert workers and all(w["status"] == "healthy" for w in workers), workers
    ok = daemon.post("/v1/chat/completions", json={**GOOD, "seed": INT64_MAX})
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] == 2
    assert queued_programs(daemon) == 0


@pytest.mark.parametrize("value", [
    "a/b", "..", ".", "../x", "日本", "é", "has space", "x" * 129, "tab\there", "a%2Fb",
])
def test_program_ids_outside_the_alphabet_are_400(daemon: DaemonProcess, value: str) -> None:
    assert_refused(daemon, "/v1/chat/completions", {**GOOD, "program_id": value},
                   "program_id", "program_id")
    assert_refused(daemon, "/v1/chat/completions", {**GOOD, "session_id": value},
                   "session_id", "session_id")


@pytest.mark.parametrize("value", ["has%20space", "%C3%A9", "a%09b"])
def test_a_tool_declaration_names_a_program_in_the_alphabet(daemon: DaemonProcess,
                                                            value: str) -> None:
    r = daemon.post(f"/v1/programs/{value}/tools", json={"tools": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "program_id", r.text


@pytest.mark.parametrize(("header", "value"), [
    ("X-Program-Id", b"a/b"),
    ("X-Program-Id", b".."),
    # UTF-8 on the wire: a header is read as Latin-1, so this arrives as "Ã©".
    ("X-Program-Id", "é".encode()),
    ("X-Session-Id", "日本".encode()),
    ("X-Session-Id", b"s/../t"),
])
def test_id_headers_outside_the_alphabet_are_400(daemon: DaemonProcess, header: str,
                                                 value: bytes) -> None:
    assert_refused(daemon, "/v1/chat/completions", GOOD, header, header,
                   headers={header: value})


def test_ids_in_the_alphabet_are_served_and_released(daemon: DaemonProcess) -> None:
    """What the SDK and the examples send (`<run program>.<Agent>.<n>`, `s:1`, emails)."""
    program, session = "prog-1f.Keeper_0.2", "user@example.com:s1"
    resp = daemon.post("/v1/chat/completions",
                       json={**GOOD, "program_id": program, "session_id": session})
    assert resp.status_code == 200, resp.text
    assert (resp.headers["X-Program-Id"], resp.headers["X-Session-Id"]) == (program, session)
    assert daemon.post(f"/v1/programs/{program}/release").status_code == 200
    longest = "p" * 128
    resp = daemon.post("/v1/chat/completions", json=GOOD, headers={"X-Program-Id": longest})
    assert resp.status_code == 200, resp.text
    assert daemon.post(f"/v1/programs/{longest}/release").status_code == 200


def test_run_session_ids_outside_the_alphabet_are_400(daemon: DaemonProcess) -> None:
    for value in ("a/b", "..", "日本", ""):
        resp = daemon.post("/v1/runs", json={"workflow": "any", "session_id": value})
        assert resp.status_code == 400, resp.text
        assert error_of(resp)["param"] == "session_id"


def nested(depth: int) -> str:
    """JSON text of `depth` nested arrays."""
    return "[" * depth + "]" * depth


def raw_json(template: str, depth: int) -> bytes:
    return template.replace("DEEP", nested(depth)).encode()


GOOD_CHAT = '{"model": "' + MODEL + '", "messages": [{"role": "user", "content": "hi"}], ' \
    '"max_tokens": 2'


@pytest.mark.parametrize(("path", "template"), [
    ("/v1/chat/completions", GOOD_CHAT + ', "unknown": DEEP}'),
    ("/v1/chat/completions", GOOD_CHAT + ', "response_format": {"type": "json_schema", '
                             '"json_schema": {"name": "x", "schema": {"items": DEEP}}}}'),
    ("/v1/completions", '{"model": "' + MODEL + '", "prompt": "hi", "stop": DEEP}'),
    ("/v1/runs", '{"workflow": "any", "args": {"x": DEEP}}'),
    ("/v1/workflows", '{"name": "w", "files": {}, "entry": "m:m", "tools": {"t": DEEP}}'),
    ("/v1/policies/fcfs/validate", '{"version": 1, "extra": DEEP}'),
])
def test_json_nested_deeper_than_the_limit_is_400(daemon: DaemonProcess, path: str,
                                                  template: str) -> None:
    err = assert_refused(daemon, path, None, None, str(MAX_JSON_DEPTH),
                         content=raw_json(template, 10_000),
                         headers={"Content-Type": "application/json"})
    assert err["code"] == "invalid_json"


def chat_with_schema(levels: int) -> bytes:
    """A chat body whose response_format schema nests `levels` objects below its own:
    the body, response_format, json_schema and the schema are four levels above them."""
    schema = '{"type": "array", "items": ' * levels + "{}" + "}" * levels
    return (GOOD_CHAT + ', "response_format": {"type": "json_schema", "json_schema": '
            '{"name": "x", "schema": ' + schema + "}}}").encode()


def test_json_nested_to_the_limit_is_served(daemon: DaemonProcess) -> None:
    headers = {"Content-Type": "application/json"}
    at_limit = chat_with_schema(MAX_JSON_DEPTH - 4)
    resp = daemon.post("/v1/chat/completions", content=at_limit, headers=headers)
    assert resp.status_code == 200, resp.text
    resp = daemon.post("/v1/chat/completions", content=chat_with_schema(MAX_JSON_DEPTH - 3),
                       headers=headers)
    assert resp.status_code == 400 and str(MAX_JSON_DEPTH) in error_of(resp)["message"]


def test_brackets_inside_strings_do_not_count_as_nesting(daemon: DaemonProcess) -> None:
    content = "[{" * 5000 + ' \\" ' + "}]" * 5000
    body = GOOD_CHAT.replace('"hi"', f'"{content}"') + "}"
    resp = daemon.post("/v1/chat/completions", content=body.encode(),
                       headers={"Content-Type": "application/json"})
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("raw", [
    b'{"model": "\xff", "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "\xc3("}]}',
])
def test_invalid_utf8_is_400(daemon: DaemonProcess, raw: bytes) -> None:
    err = assert_refused(daemon, "/v1/chat/completions", None, None, "UTF-8", content=raw,
                         headers={"Content-Type": "application/json"})
    assert err["code"] == "invalid_json"


@pytest.mark.parametrize("prompt", ["", [""]])
def test_an_empty_prompt_is_400(daemon: DaemonProcess, prompt: object) -> None:
    assert_refused(daemon, "/v1/completions", {"model": MODEL, "prompt": prompt,
                                               "max_tokens": 2}, "prompt", "prompt")
