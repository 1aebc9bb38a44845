"""A workflow that tries to get out of its sandbox (uploaded by test_sandbox_escape.py).

`main(attempt, target)` makes one attempt. It returns what it got when the attempt
worked (the test then fails: an escape) and raises what stopped it otherwise, so the
run's status and reason say which layer held. Attempts that write or fork cap
themselves, so that a sandbox without the layer under test cannot hurt the machine.

`spawn` forks and execs through `_posixsubprocess.fork_exec`, which raises no audit
event (subprocess.Popen does): it is how code gets past the Python-level audit hook,
so only the kernel layers stand in its way.
"""

import _posixsubprocess
import os
import socket
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import httpx

FORK_FANOUT = 8
MAIN_FORKS = 50  # without a limit: 50 children + 400 grandchildren, all asleep 20 s
DISK_CAP = 1 << 30


def _fork_exec(argv: list[str], out_w: int, err_pipe: tuple[int, int],
               preexec: Callable[[], None] | None = None, setsid: bool = False) -> int:
    args = [os.fsencode(a) for a in argv]
    # typeshed types cwd as str and preexec_fn as a callable; CPython takes None for both
    # (subprocess.Popen passes None when it has neither)
    return _posixsubprocess.fork_exec(
        args, args[:1], True, (err_pipe[1],), None, None, -1, -1, -1, out_w,  # type: ignore[arg-type]
        -1, out_w, err_pipe[0], err_pipe[1], False, setsid, -1, None, None, None, -1,
        preexec, False)  # type: ignore[arg-type]


def spawn(argv: list[str]) -> tuple[int, str]:
    """Run argv; (exit status, output). An exec failure raises its OSError."""
    out_r, out_w = os.pipe()
    err = os.pipe()
    pid = _fork_exec(argv, out_w, err)
    os.close(out_w)
    os.close(err[1])
    failed = b""  # the child writes "OSError:", the errno and the rest in separate writes
    while chunk := os.read(err[0], 4096):
        failed += chunk
    os.close(err[0])
    output = b""
    while chunk := os.read(out_r, 65536):
        output += chunk
    os.close(out_r)
    _, status = os.waitpid(pid, 0)
    if failed:  # b"OSError:<hex errno>:<what>"
        _, code, _ = failed.decode().split(":", 2)
        raise OSError(int(code, 16), os.strerror(int(code, 16)), argv[0])
    return os.waitstatus_to_exitcode(status), output.decode(errors="replace")


def _sleeping_child(depth: int) -> Callable[[], None]:
    def run() -> None:
        if depth > 0:
            for _ in range(FORK_FANOUT):
                try:
                    _fork_nowait(_sleeping_child(depth - 1))
                except OSError:
                    break
        time.sleep(20)  # the attack: a process that outlives its run unless it is reaped
        os._exit(0)
    return run


def _fork_nowait(preexec: Callable[[], None]) -> int:
    """A child in a session of its own: killing the run's process group misses it."""
    err = os.pipe()
    try:
        return _fork_exec(["/bin/true"], -1, err, preexec, setsid=True)
    finally:
        os.close(err[0])
        os.close(err[1])


def fork_bomb() -> dict[str, str]:
    """Children that fork grandchildren that sleep; stops at the first refused fork."""
    started = 0
    for _ in range(MAIN_FORKS):
        _fork_nowait(_sleeping_child(1))
        started += 1
        time.sleep(0.01)  # the attack's own pace: forks spread out, not a wait on anything
    return {"escaped": f"started {started} processes, none refused"}


def fill(directory: str) -> dict[str, str]:
    """Write 1 MiB chunks into new 4 MiB files until something refuses."""
    chunk = b"x" * (1 << 20)
    written, n = 0, 0
    while written < DISK_CAP:
        with open(os.path.join(directory, f"fill-{os.getpid()}-{n}"), "wb") as f:
            for _ in range(4):
                f.write(chunk)
                f.flush()
                written += len(chunk)
        n += 1
    return {"escaped": f"wrote {written >> 20} MiB"}


def _api(target: str) -> dict[str, Any]:
    """target: "PATH" (a GET) or "METHOD PATH [JSON body]", called with the run's token;
    `{program}` in PATH is the run's own program."""
    parts = target.split(" ", 2) if " " in target else ["GET", target]
    method, path, body = parts[0], parts[1], parts[2] if len(parts) > 2 else None
    path = path.replace("{program}", os.environ["AGENTD_PROGRAM_ID"])
    headers = {"Authorization": f"Bearer {os.environ['AGENTD_RUN_TOKEN']}",
               "Content-Type": "application/json"}
    r = httpx.request(method, os.environ["AGENTD_DAEMON_URL"] + path, headers=headers,
                      content=body, timeout=30)
    if r.status_code < 300:
        return {"escaped": r.json()}
    raise PermissionError(f"the daemon refused {method} {path}: {r.status_code} {r.text[:200]}")


def chat_as(target: str) -> dict[str, str]:
    """A chat completion as another program: target is "PROGRAM [SESSION]"."""
    program, _, session = target.partition(" ")
    base = os.environ["AGENTD_DAEMON_URL"] + "/v1"
    headers = {"Authorization": f"Bearer {os.environ['AGENTD_RUN_TOKEN']}"}
    model = httpx.get(f"{base}/models", headers=headers, timeout=30).json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "program_id": program}
    if session:
        body["session_id"] = session
    r = httpx.post(f"{base}/chat/completions", json=body, headers=headers, timeout=60)
    if r.status_code < 300:
        return {"escaped": f"chatted as {program}: {r.json()['choices'][0]['message']}"}
    raise PermissionError(f"the daemon refused a chat as {program}: {r.status_code} "
                          f"{r.text[:300]}")


def main(attempt: str, target: str = "") -> dict[str, Any]:
    if attempt == "open":
        with open(target, "rb") as f:
            return {"escaped": f.read(64).hex()}
    if attempt == "sqlite":
        return {"escaped": sqlite3.connect(target).execute("select 1").fetchall()}
    if attempt == "exec":
        status, out = spawn(["/bin/sh", "-c", target])
        if status != 0:
            raise RuntimeError(f"the command failed ({status}): {out[-300:]}")
        return {"escaped": out[-300:]}
    if attempt == "fork":
        return {"escaped": os.fork()}
    if attempt == "fork_bomb":
        return fork_bomb()
    if attempt == "fill":
        return fill(target or os.getcwd())
    if attempt in ("tcp", "udp"):
        host, port = target.rsplit(":", 1)
        kind = socket.SOCK_STREAM if attempt == "tcp" else socket.SOCK_DGRAM
        with socket.socket(socket.AF_INET, kind) as s:
            s.settimeout(3)
            if attempt == "tcp":
                s.connect((host, int(port)))
                s.sendall(b"escaped")
            else:  # the test's listener echoes: a reply is the proof it arrived
                s.sendto(b"escaped", (host, int(port)))
                s.recvfrom(64)
        return {"escaped": f"reached {target}"}
    if attempt == "signal":
        os.kill(os.getppid(), 0)  # 0 checks the permission and delivers nothing
        return {"escaped": f"may signal the daemon (pid {os.getppid()})"}
    if attempt == "api":
        return _api(target)
    if attempt == "chat":
        return chat_as(target)
    raise ValueError(f"unknown attempt {attempt}")
