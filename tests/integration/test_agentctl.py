"""`agentctl` as a user runs it: a subprocess against a real daemon with a sim worker."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from console.client import AgentdClient, AsyncAgentdClient, ClientError, api, resolve_token
from console.client import trace_pages as client_trace_pages
from tests.daemon_process import DaemonProcess, free_port

MODEL = "sim-llama3-8b"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Result:
    rc: int
    out: str
    err: str


@pytest.fixture(scope="module")
def xdg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("xdg")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, xdg: Path) -> Iterator[DaemonProcess]:
    # One daemon for the module: every test uses its own program and session ids. Auth is
    # on and the daemon writes its first operator token under $XDG_CONFIG_HOME, where
    # agentctl looks by default, so every passing command proves the token was sent.
    d = DaemonProcess(data_dir=tmp_path_factory.mktemp("agentctl") / "data",
                      env={"XDG_CONFIG_HOME": str(xdg), "AGENTD_AUTH": "true",
                           "AGENTD_CONFIG_DIR": ""})
    yield d.start()
    d.stop()


@pytest.fixture(scope="module")
def clean_env(xdg: Path) -> dict[str, str]:
    """The environment minus the user's own agentd settings, with the daemon's token file."""
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTD_URL", "AGENTD_TOKEN")}
    env["XDG_CONFIG_HOME"] = str(xdg)
    return env


def _token(xdg: Path) -> str:
    return resolve_token(None, {"XDG_CONFIG_HOME": str(xdg)}) or ""


def agentctl(*args: str, url: str | None = None, env: dict[str, str] | None = None) -> Result:
    cmd = [sys.executable, "-m", "console.agentctl", *args]
    if url is not None:
        cmd[3:3] = ["--url", url]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO,
                          env=env)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def ok(*args: str, daemon: DaemonProcess, env: dict[str, str]) -> Result:
    res = agentctl(*args, url=daemon.url, env=env)
    assert res.rc == 0, f"agentctl {args} exited {res.rc}: {res.err}"
    return res


def row_of(table: str, first_cell: str) -> str:
    [row] = [line for line in table.splitlines() if line.split()[:1] == [first_cell]]
    return row


def test_status_labels_the_sim_worker(daemon: DaemonProcess, clean_env: dict[str, str]) -> None:
    out = ok("status", daemon=daemon, env=clean_env).out
    assert f"agentd at {daemon.url}: ok" in out
    assert "workers: 1 healthy of 1" in out
    assert re.search(r"local-sim-0\s+engine: sim \(simulated\)\s+model: sim-llama3-8b\s+healthy",
                     out), out
    assert re.search(r"programs: QUEUED \d+ +REASONING \d+ +ACTING \d+", out), out
    data = json.loads(ok("status", "--json", daemon=daemon, env=clean_env).out)
    assert data["health"]["status"] == "ok"
    assert [w["engine"] for w in data["workers"]] == ["sim"]
    assert set(data["programs_by_status"]) == {
        "QUEUED", "REASONING", "ACTING", "PAUSED", "STOPPED", "FAILED"}


def test_workers_table(daemon: DaemonProcess, clean_env: dict[str, str]) -> None:
    # the URL comes from $AGENTD_URL here, and --json is accepted before the command
    env = {**clean_env, "AGENTD_URL": daemon.url}
    out = agentctl("workers", env=env).out
    header = out.splitlines()[0].split()
    assert header[:4] == ["ID", "ENGINE", "MODEL", "STATUS"]
    row = row_of(out, "local-sim-0")
    assert "sim (simulated)" in row and MODEL in row and "healthy" in row
    # NODE, then HOST:PID: a local worker names no node of its own, so its host's name
    assert "NODE" in header
    assert re.search(rf"\s{re.escape(socket.gethostname())}\s+\S+:\d+\s", row), row
    raw = json.loads(agentctl("--json", "workers", env=env).out)
    assert raw["data"][0]["id"] == "local-sim-0"


def test_chat_creates_a_listed_program(daemon: DaemonProcess, clean_env: dict[str, str]) -> None:
    res = ok("chat", "fix the failing test", "--max-tokens", "6", "--program", "ctl-chat",
             "--session", "ctl-chat-s", daemon=daemon, env=clean_env)
    assert res.out.split() == [f"sim{i}" for i in range(6)]
    assert "[program ctl-chat  session ctl-chat-s  model sim-llama3-8b" in res.err
    assert "+ 6 output" in res.err and "finish length" in res.err

    row = row_of(ok("programs", "--session", "ctl-chat-s", daemon=daemon, env=clean_env).out,
                 "ctl-chat")
    assert row.split()[1:3] == ["ctl-chat-s", "ACTING"]
    listed = json.loads(ok("programs", "--json", "--status", "acting", daemon=daemon,
                           env=clean_env).out)
    assert "ctl-chat" in [p["id"] for p in listed["data"]]

    detail = ok("program", "ctl-chat", daemon=daemon, env=clean_env).out
    assert re.search(r"^session:\s+ctl-chat-s$", detail, re.M)
    req = json.loads(ok("program", "ctl-chat", "--json", daemon=daemon,
                        env=clean_env).out)["requests"][0]
    assert req["output_tokens"] == 6
    assert row_of(detail, req["id"]).split()[1:3] == ["chat", "finished"]


def test_chat_json_and_stream(daemon: DaemonProcess, clean_env: dict[str, str]) -> None:
    answer = json.loads(ok("chat", "hi", "--max-tokens", "3", "--json", "--model", MODEL,
                           daemon=daemon, env=clean_env).out)
    assert answer["choices"][0]["message"]["content"].split() == ["sim0", "sim1", "sim2"]
    # a chat without --program is a program of its own, kept (lineage inference) for a
    # continuation of its conversation until lineage_idle_s ends it, and listed
    program = json.loads(ok("program", answer["program_id"], "--json", daemon=daemon,
                            env=clean_env).out)
    assert program["status"] == "ACTING"

    streamed = ok("chat", "stream it", "--stream", "--max-tokens", "4", daemon=daemon,
                  env=clean_env)
    assert streamed.out.split() == ["sim0", "sim1", "sim2", "sim3"]
    assert "+ 4 output" in streamed.err and "finish length" in streamed.err


def test_trace_timeline_in_order(daemon: DaemonProcess, clean_env: dict[str, str]) -> None:
    ok("chat", "trace me", "--max-tokens", "5", "--program", "ctl-trace", "--session",
       "ctl-trace-s", daemon=daemon, env=clean_env)
    lines = ok("trace", "ctl-trace-s", daemon=daemon, env=clean_env).out.splitlines()
    assert lines[0].split()[:3] == ["TIME", "KIND", "PROGRAM"]
    events = [line.split() for line in lines[1:]]
    kinds = [e[1] for e in events]
    wanted = ["request.queued", "request.dispatched", "request.first_token",
              "request.finished"]
    positions = [kinds.index(k) for k in wanted]
    assert positions == sorted(positions), kinds
    times = [float(e[0].lstrip("+").rstrip("s")) for e in events]
    assert times[0] == 0.0 and times == sorted(times)
    assert all(e[2] == "ctl-trace" for e in events)
    finished = lines[1 + kinds.index("request.finished")]
    assert "worker=local-sim-0" in finished and "output_tokens=5" in finished
    assert "reason=length" in finished and "e2e=" in finished
    assert "ttft=" in lines[1 + kinds.index("request.first_token")]
    assert "QUEUED -> REASONING" in lines[1 + kinds.index("program.status")]


def test_trace_follows_pages(daemon: DaemonProcess, xdg: Path) -> None:
    with AgentdClient(daemon.url, token=_token(xdg)) as client:
        for i in range(2):
            client.call(api.chat(MODEL, [{"role": "user", "content": f"step {i}"}], 2,
                                 "ctl-pages", "ctl-pages-s"))
        whole = client.call(api.trace("ctl-pages-s"))["data"]
        pages = list(client_trace_pages(client, "ctl-pages-s", page=3))
    assert len(whole) > 6 and all(len(p) == 3 for p in pages[:-1])
    assert [e["id"] for p in pages for e in p] == [e["id"] for e in whole]


def test_release_then_release_again(daemon: DaemonProcess, clean_env: dict[str, str]) -> None:
    ok("chat", "x", "--max-tokens", "1", "--program", "ctl-rel", daemon=daemon, env=clean_env)
    assert ok("release", "ctl-rel", daemon=daemon, env=clean_env).out.strip() == \
        "released ctl-rel (now STOPPED)"
    again = agentctl("release", "ctl-rel", url=daemon.url, env=clean_env)
    assert again.rc == 1 and again.out == ""
    assert again.err == "agentctl: program 'ctl-rel' is already released\n"
    missing = agentctl("program", "no-such-program", url=daemon.url, env=clean_env)
    assert missing.rc == 1 and missing.err == "agentctl: unknown program 'no-such-program'\n"


def test_unreachable_daemon_is_one_line(clean_env: dict[str, str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for args in (["status"], ["chat", "hi"], ["trace", "s", "--json"]):
        res = agentctl(*args, url=url, env=clean_env)
        assert res.rc == 1 and res.out == ""
        assert res.err == (f"agentctl: cannot reach the agentd daemon at {url} "
                           "(is it running? start it with `agentd start`)\n")


def test_missing_or_wrong_token(daemon: DaemonProcess, clean_env: dict[str, str],
                                tmp_path: Path) -> None:
    no_token = {**clean_env, "XDG_CONFIG_HOME": str(tmp_path)}
    res = agentctl("workers", url=daemon.url, env=no_token)
    assert res.rc == 1 and res.err.count("\n") == 1
    assert res.err.startswith("agentctl: missing API token") and "AGENTD_TOKEN" in res.err
    wrong = agentctl("workers", "--token", "agd_not-a-token", url=daemon.url, env=clean_env)
    assert wrong.rc == 1 and wrong.err.count("\n") == 1 and "Traceback" not in wrong.err
    # the public liveness probe needs no token, so status can still say why it stops
    status = agentctl("status", url=daemon.url, env=no_token)
    assert status.rc == 1 and "missing API token" in status.err


def test_usage_errors_exit_2(clean_env: dict[str, str]) -> None:
    for args in ([], ["programs", "--status", "sleeping"], ["chat"], ["programs", "--limit", "0"]):
        res = agentctl(*args, env=clean_env)
        assert res.rc == 2 and "usage: agentctl" in res.err and "Traceback" not in res.err


def test_token_sources_in_order(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert resolve_token(None, env) is None
    token_file = tmp_path / "xdg" / "agentd" / "token"
    token_file.parent.mkdir(parents=True)
    token_file.write_text("from-file\n")
    assert resolve_token(None, env) == "from-file"
    assert resolve_token(None, {**env, "AGENTD_TOKEN": "from-env"}) == "from-env"
    assert resolve_token("from-flag", {**env, "AGENTD_TOKEN": "from-env"}) == "from-flag"
    home_file = tmp_path / "home" / ".config" / "agentd" / "token"
    home_file.parent.mkdir(parents=True)
    home_file.write_text("from-home")
    assert resolve_token(None, {"HOME": env["HOME"]}) == "from-home"


async def test_async_client_shares_the_calls(daemon: DaemonProcess, xdg: Path) -> None:
    async with AsyncAgentdClient(daemon.url, token=_token(xdg)) as client:
        health = await client.call(api.healthz())
        assert health["workers_healthy"] == 1
        body = api.chat(MODEL, [{"role": "user", "content": "async"}], 3, stream=True)
        async with client.stream(body) as stream:
            events = [e async for e in stream.events()]
            program_id = stream.headers["x-program-id"]
        text = "".join(c["delta"].get("content", "") for e in events for c in e["choices"])
        assert text.split() == ["sim0", "sim1", "sim2"]
        # the one-request program is released just after [DONE], so only its existence is
        # certain here, not yet its final status
        assert (await client.call(api.program(program_id)))["id"] == program_id
        with pytest.raises(ClientError, match="unknown program 'nope'") as err:
            await client.call(api.program("nope"))
        assert err.value.status == 404 and err.value.code == "not_found"


def test_operator_commands_act_on_the_daemon(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import openai

    from tests.daemon_process import DaemonProcess

    d = DaemonProcess(data_dir=tmp_path / "ops", workers=2).start()
    try:
        openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token,
                      max_retries=0).chat.completions.create(
            model="sim-llama3-8b", messages=[{"role": "user", "content": "x"}], max_tokens=2,
            extra_body={"program_id": "p-ops", "session_id": "s-ops"})
        env = {**os.environ, "AGENTD_URL": d.url, "AGENTD_TOKEN": d.token}

        def ctl(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "console.agentctl", *args], env=env,
                                  capture_output=True, text=True, timeout=30)

        assert "PAUSED" in ctl("pause", "p-ops").stdout
        assert d.get("/v1/programs/p-ops").json()["held"] is True
        assert ctl("resume", "p-ops").returncode == 0
        source = d.get("/v1/programs/p-ops").json()["worker_id"]
        [target] = [w["id"] for w in d.get("/v1/workers").json()["data"] if w["id"] != source]
        out = ctl("migrate", "s-ops", target, "--session")
        assert out.returncode == 0 and f"-> {target}" in out.stdout, out.stderr
        assert d.get("/v1/programs/p-ops").json()["worker_id"] == target
        assert "would reclaim 0" in ctl("tools", "gc", "--dry-run").stdout
        assert "FAILED" in ctl("kill", "p-ops").stdout
        bad = ctl("migrate", "p-ops", target)
        assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "ended" in bad.stderr
    finally:
        d.stop()
