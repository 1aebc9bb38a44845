"""The daemon's end of the sandbox fork server (daemon/runtime/sandbox/zygote.py).

`ForkServer.spawn` starts a sandbox as a fork of a process that already imported what a
sandbox needs, instead of a fresh `python -I -m daemon.runtime.sandbox`: about 0.2 s of CPU
less per run. It answers a `Forked`, which has what `Jail` and `RunController` use of an
`asyncio.subprocess.Process`: `pid`, `returncode`, `wait()`, `stdin`, `stdout`.

The server is started on first use and again after it died. Its children are its own, so
their exit codes come from it; if it dies, those of its children still running are killed
(their codes would be lost) and report -SIGKILL. `runtime_fork_server = false` in the
config turns it off (each sandbox exec'd, as before).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections import deque
from pathlib import Path

log = logging.getLogger("agentd.zygote")

# The sandboxes' fixed environment (daemon/runtime/runs.py adds each run's own).
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
            "MALLOC_ARENA_MAX": "2", "PYTHONUNBUFFERED": "1"}
REPORT_FD = 4  # where the child finds its report pipe: daemon/runtime/sandbox/zygote.py


class ForkServerError(RuntimeError):
    """The fork server could not start a sandbox."""


class Forked:
    """A sandbox the fork server started: its pid, its pipes, its exit code once known."""

    def __init__(self, pid: int, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader,
                 exited: asyncio.Future[int]) -> None:
        self.pid, self.stdin, self.stdout, self._exited = pid, stdin, stdout, exited

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


class _ReadToEnd(asyncio.StreamReaderProtocol):
    """A child's stdout: its transport closes at the end (a socket's would stay half open)."""

    def eof_received(self) -> bool:
        super().eof_received()
        return False


class ForkServer:
    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._sock: socket.socket | None = None
        self._pending: deque[asyncio.Future[int]] = deque()  # spawns awaiting their pid
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._early: dict[int, int] = {}  # exit codes that came before their pid was taken
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: asyncio.Task[None] | None = None  # held, or the loop may collect it

    def _on(self, loop: asyncio.AbstractEventLoop) -> asyncio.Lock:
        """This loop's lock; a server started on another loop (an earlier one, in tests
        that run several) is left to end with its socket."""
        if self._loop is not loop or self._lock is None:
            if self._sock is not None:
                self._sock.close()
            self._sock, self._proc, self._reader = None, None, None
            self._pending.clear()
            self._exits.clear()
            self._early.clear()
            self._loop, self._lock = loop, asyncio.Lock()
        return self._lock

    async def _ensure(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-m", "daemon.runtime.sandbox.zygote",
                str(theirs.fileno()), pass_fds=(theirs.fileno(),), env=dict(BASE_ENV),
                cwd="/", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        self._reader = asyncio.create_task(self._read(ours), name="agentd-fork-server")
        log.info("sandbox fork server started (pid %d)", self._proc.pid)
        return ours

    async def _read(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        stopping = False
        try:
            while message := await loop.sock_recv(sock, 256):
                kind, _, rest = message.decode().partition(" ")
                if kind == "pid":
                    waiting = self._pending.popleft()
                    if waiting.done():  # its spawn was cancelled: nobody will run it
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(int(rest), signal.SIGKILL)
                    else:
                        waiting.set_result(int(rest))
                elif kind == "exit":
                    pid, code = (int(x) for x in rest.split())
                    fut = self._exits.pop(pid, None)
                    if fut is None:
                        self._early[pid] = code
                    elif not fut.done():
                        fut.set_result(code)
                elif kind == "error" and self._pending:
                    waiting = self._pending.popleft()
                    if not waiting.done():
                        waiting.set_exception(ForkServerError(rest))
        except OSError:
            pass
        except asyncio.CancelledError:  # the daemon is stopping: nothing was lost
            stopping = True
            raise
        finally:
            self._lost(sock, warn=not stopping)

    def _lost(self, sock: socket.socket, warn: bool = True) -> None:
        """The server ended: fail what waits on it; kill the children it can no longer
        report on (their ends would never be known), so that each run ends."""
        if self._sock is sock:
            self._sock = None
        sock.close()
        while self._pending:
            waiting = self._pending.popleft()
            if not waiting.done():
                waiting.set_exception(ForkServerError("the fork server ended"))
        for pid, fut in list(self._exits.items()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            if not fut.done():
                fut.set_result(-signal.SIGKILL)
        self._exits.clear()
        if warn:
            log.warning("sandbox fork server lost; the next run starts another")

    async def spawn(self, work: Path, env: dict[str, str], stderr: int, confine_fd: int,
                    report_fd: int) -> Forked:
        """A sandbox in `work` with `env`; `stderr`, `confine_fd` and `report_fd` are the
        daemon's descriptors for the child's fds 2, 3 and 4 (the caller closes them)."""
        loop = asyncio.get_running_loop()
        # Socket pairs, not pipes: uvloop (which the daemon's server runs on) closes a pipe's
        # fd and then the file object holding it, a second close() of a number another
        # thread may have opened meanwhile (seen as EBADF on /proc and SQLite I/O errors);
        # a socket it detaches instead.
        stdin, child_stdin = socket.socketpair()
        stdout, child_stdout = socket.socketpair()
        try:
            async with self._on(loop):  # one request in flight: answers come in order
                sock = await self._ensure()
                pid_fut: asyncio.Future[int] = loop.create_future()
                self._pending.append(pid_fut)
                socket.send_fds(sock, [b"spawn"], [child_stdin.fileno(), child_stdout.fileno(),
                                                   stderr, confine_fd, report_fd])
                pid = await pid_fut
        except BaseException:
            stdin.close()
            stdout.close()
            raise
        finally:
            child_stdin.close()  # the child holds them now
            child_stdout.close()
        exited: asyncio.Future[int] = loop.create_future()
        if pid in self._early:
            exited.set_result(self._early.pop(pid))
        else:
            self._exits[pid] = exited
        reader = asyncio.StreamReader()
        await loop.connect_accepted_socket(lambda: _ReadToEnd(reader), stdout)
        transport, protocol = await loop.connect_accepted_socket(
            asyncio.streams.FlowControlMixin, stdin)
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
        # The run's own place and environment, first on its stdin (see the server's module).
        writer.write(json.dumps({"cwd": str(work), "env": env}).encode() + b"\n")
        return Forked(pid, writer, reader, exited)
