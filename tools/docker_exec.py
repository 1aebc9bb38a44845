"""Commands and files inside a running container.

Docker has no API to kill an exec. So every command is started through a tiny shell
wrapper that reports its PID on stderr before `exec`ing the real argv; runc starts each
exec as a session and process-group leader, so on timeout one `kill -KILL -- -PID` ends the
command and everything it spawned, wherever the daemon runs relative to the engine.
"""

from __future__ import annotations

import asyncio
import io
import posixpath
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tools.base import Environment, ExecResult, OutputBuffer, OutputListener, result_reason
from tools.docker_errors import call
from tools.errors import Reason, ToolError

_MARK = b"agentd-exec-pid:"
_WRAPPER = 'echo "agentd-exec-pid:$$" >&2; exec "$@"'
KILL_GRACE_S = 5.0
MAX_FILE_BYTES = 64 << 20


@dataclass
class _Stream:
    """Filled by the thread that reads the exec's multiplexed output."""

    stdout: OutputBuffer = field(default_factory=OutputBuffer)
    stderr: OutputBuffer = field(default_factory=OutputBuffer)
    pid: int | None = None
    head: bytes = b""

    def feed_stderr(self, data: bytes) -> None:
        if self.pid is not None:
            self.stderr.add(data)
            return
        self.head += data
        line, sep, rest = self.head.partition(b"\n")
        if not sep:
            return
        self.pid = int(line.removeprefix(_MARK)) if line.startswith(_MARK) else -1
        self.stderr.add(rest if self.pid > 0 else self.head)


def _pump(api: Any, exec_id: str, stream: _Stream) -> int:
    for out, err in api.exec_start(exec_id, stream=True, demux=True):
        if out:
            stream.stdout.add(out)
        if err:
            stream.feed_stderr(err)
    return int(api.exec_inspect(exec_id)["ExitCode"] or 0)


async def _run_quiet(api: Any, container_id: str, script: str) -> str:
    exec_id = (await call(api.exec_create, container_id, ["/bin/sh", "-c", script]))["Id"]
    out = await call(api.exec_start, exec_id)
    return bytes(out).decode(errors="replace")


async def _kill_group(api: Any, container_id: str, stream: _Stream) -> None:
    for _ in range(20):  # the PID line can trail the timeout by a moment on a busy host
        if stream.pid is not None:
            break
        await asyncio.sleep(0.05)
    if stream.pid is None or stream.pid <= 0:
        return
    pid = stream.pid
    await _run_quiet(api, container_id, f"kill -KILL -- -{pid} 2>/dev/null || kill -KILL {pid}")


async def oom_kills(api: Any, container_id: str) -> int:
    """The cgroup's OOM-kill counter (cgroup v2 file, then v1). Docker's own OOMKilled flag
    only covers the container's main process, never an exec."""
    text = await _run_quiet(
        api,
        container_id,
        "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null",
    )
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


async def run_exec(
    api: Any, env: Environment, argv: Sequence[str], timeout_s: float,
    on_output: OutputListener | None = None,
) -> tuple[int, _Stream, bool]:
    """Returns (exit code, output, timed out). `on_output` hears the output as it arrives,
    on this event loop (the stream is read in a thread)."""
    wrapped = ["/bin/sh", "-c", _WRAPPER, "agentd-exec", *argv]
    exec_id = (await call(api.exec_create, env.id, wrapped, workdir=env.workdir))["Id"]
    stream = _Stream()
    if on_output is not None:
        loop = asyncio.get_running_loop()

        def hand_over(name: str) -> Callable[[bytes], None]:
            def heard(data: bytes) -> None:
                loop.call_soon_threadsafe(on_output, name, data)
            return heard

        stream.stdout.listener, stream.stderr.listener = hand_over("stdout"), hand_over("stderr")
    pump = asyncio.ensure_future(call(_pump, api, exec_id, stream))
    try:
        return await asyncio.wait_for(asyncio.shield(pump), timeout_s), stream, False
    except TimeoutError:
        await _kill_group(api, env.id, stream)
        try:
            code = await asyncio.wait_for(asyncio.shield(pump), KILL_GRACE_S)
        except TimeoutError:
            code = 137
        return code, stream, True
    except asyncio.CancelledError:
        # The caller went away: the command must not run on unobserved.
        await asyncio.shield(_kill_group(api, env.id, stream))
        raise


async def exec_result(
    api: Any, env: Environment, argv: Sequence[str], timeout_s: float, oom_seen: dict[str, int],
    on_output: OutputListener | None = None,
) -> ExecResult:
    start = time.monotonic()
    code, stream, timed_out = await run_exec(api, env, argv, timeout_s, on_output)
    duration = time.monotonic() - start
    oom = False
    if code == 137 and not timed_out and env.spec.memory_mb:
        kills = await oom_kills(api, env.id)
        oom, oom_seen[env.id] = kills > oom_seen.get(env.id, 0), kills
    reason = result_reason(code, timed_out=timed_out, oom=oom)
    detail = {
        Reason.TIMEOUT: f"killed after {timeout_s:g} s timeout",
        Reason.OOM: f"killed by the out-of-memory killer (limit {env.spec.memory_mb} MiB)",
    }.get(reason, "")
    return ExecResult(code, stream.stdout.text(), stream.stderr.text(), duration, reason, detail)


def container_path(env: Environment, path: str) -> str:
    return posixpath.normpath(posixpath.join(env.workdir, path))


async def put_file(api: Any, env: Environment, path: str, data: bytes, mode: int) -> None:
    full = container_path(env, path)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(full.lstrip("/"))
        info.size, info.mode, info.mtime = len(data), mode, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    # Docker creates missing parent directories when it unpacks at "/".
    if not await call(api.put_archive, env.id, "/", buf.getvalue()):
        raise ToolError(Reason.BAD_PATH, f"could not write {full}")


def _read_archive(api: Any, container_id: str, full: str) -> bytes:
    chunks, stat = api.get_archive(container_id, full)
    if int(stat.get("size", 0)) > MAX_FILE_BYTES:
        raise ToolError(Reason.BAD_PATH, f"{full} is larger than {MAX_FILE_BYTES} bytes")
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        member = tar.next()
        extracted = tar.extractfile(member) if member and member.isfile() else None
        if extracted is None:
            raise ToolError(Reason.BAD_PATH, f"{full} is not a regular file")
        return extracted.read()


async def get_file(api: Any, env: Environment, path: str) -> bytes:
    return await call(_read_archive, api, env.id, container_path(env, path))
