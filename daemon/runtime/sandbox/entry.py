"""`python -m daemon.runtime.sandbox`: run one workflow entry inside a daemon-started sandbox.

The daemon starts this with a scrubbed environment (run id, program/session ids, daemon
URL, run token: see daemon/runtime/runs.py), in a private working directory that holds
only the bundle copy, writes {"entry", "args", "limits"} as JSON on stdin, and the
confinement it chose (daemon/runtime/confine.py) on the pipe named by --confine-fd.
Before any user code runs, this process:

1. keeps its stdout for the result only (user prints go to stderr, the run's log);
2. applies the kernel-level layers (daemon/runtime/sandbox/isolation.py: pids cgroup,
   user, mount and network namespaces, a uid of its own, RLIMIT_NPROC, Landlock), failing closed;
3. applies resource limits with setrlimit: address space, CPU seconds, open files,
   file size;
4. installs an audit hook (PEP 578) that refuses, for the rest of the process: opening
   or changing files outside the working directory (reads of the Python installation
   and of installed code are allowed), sqlite databases outside it, starting processes,
   loading native libraries through ctypes, signalling other processes, and network
   traffic to anything but the daemon.

The audit hook alone is a guard against accidents and casual misuse, not a boundary
(`_posixsubprocess.fork_exec` has no audit event, for one); the kernel layers are what
hold against code that gets past it. docs/threat-model.md says what each one stops.

`--probe` stops after step 3 and reports the layers in place (and, with a relay, that
the daemon answers through it): the daemon's way to learn what this machine allows.

The one line on stdout is the result: {"ok": true, "result": ...} or {"ok": false,
"kind": "user" | "system", "reason", "error": {type, message, traceback, agent, path}}.
A result line longer than the spec's `max_result_bytes` is replaced by a failure that says
so, and a failure's texts are cut (`REPORT_TEXT_CHARS`, the traceback's end kept), so the
line fits what the daemon reads (daemon/runtime/runs.py bounds its read as well: this
process runs user code and cannot be trusted to keep to the cap).
"""

from __future__ import annotations

import errno
import json
import os
import resource
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

from daemon.runtime.sandbox import isolation

MIB = 1024 * 1024
# How much of a failure's message, reason and other texts the result line carries; a
# traceback keeps its last TRACEBACK_CHARS (where the error was raised).
REPORT_TEXT_CHARS = 2000
TRACEBACK_CHARS = 8000
_PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                   "os.fork", "os.forkpty", "pty.spawn", "os.startfile")
_NATIVE_EVENTS = ("ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.addressof")
_PATH_WRITE_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
                      "os.truncate", "shutil.rmtree", "os.link", "os.symlink", "os.utime",
                      "shutil.copyfile", "shutil.move", "os.chflags")
_PATH_READ_EVENTS = ("os.listdir", "os.scandir", "glob.glob", "os.chdir")
_CODE_SUFFIXES = (".py", ".pyc", ".so", ".pyi", ".pth", ".typed")
_SEND_EVENTS = ("socket.connect", "socket.sendto", "socket.sendmsg")


class SandboxDenied(PermissionError):
    """An operation the run's sandbox does not allow."""


def apply_limits(limits: dict[str, Any]) -> None:
    """setrlimit for what the daemon asked; each limit is both soft and hard (cpu: see below)."""
    def set_limit(which: int, value: int) -> None:
        resource.setrlimit(which, (value, value))

    if limits.get("memory_mb"):
        set_limit(resource.RLIMIT_AS, int(limits["memory_mb"]) * MIB)
    if limits.get("cpu_s"):
        # soft < hard: the soft limit sends SIGXCPU, reported as the cpu limit; with
        # soft == hard the kernel sends a bare SIGKILL
        cpu = int(limits["cpu_s"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    if limits.get("open_files"):
        set_limit(resource.RLIMIT_NOFILE, int(limits["open_files"]))
    if limits.get("file_size_mb"):
        set_limit(resource.RLIMIT_FSIZE, int(limits["file_size_mb"]) * MIB)


class Guard:
    """The audit hook's policy: see the module docstring."""

    def __init__(self, workdir: Path, daemon_url: str, relay: str | None = None) -> None:
        self.workdir = str(workdir.resolve()) + os.sep
        self.read_roots = tuple(r + os.sep for r in isolation.install_roots())
        # installed-in-place (editable) packages: their code files only
        self.code_roots = tuple(r + os.sep for r in isolation.code_roots())
        self.system_read = tuple(s + os.sep for s in isolation.SYSTEM_READ)
        parts = urlsplit(daemon_url)
        self.daemon_port = parts.port or 80
        self.relay = relay  # the network namespace's way out: the daemon's unix socket
        self.local = threading.local()

    def _path(self, raw: Any) -> str | None:
        if isinstance(raw, int):
            return None  # an fd this process already holds
        if isinstance(raw, bytes):
            raw = os.fsdecode(raw)
        if not isinstance(raw, str | os.PathLike):
            return None
        return os.path.realpath(os.fspath(raw))

    def _inside(self, path: str, roots: tuple[str, ...]) -> bool:
        return any(path == r.rstrip(os.sep) or path.startswith(r) for r in roots)

    def may_read(self, path: str) -> bool:
        if self._inside(path, (self.workdir,)) or self._inside(path, self.read_roots):
            return True
        if self._inside(path, self.system_read):
            return True
        return self._inside(path, self.code_roots) and (
            path.endswith(_CODE_SUFFIXES) or os.path.isdir(path))

    def may_write(self, path: str) -> bool:
        return self._inside(path, (self.workdir,)) or path == "/dev/null"

    def deny(self, what: str, why: str = "a run may only use files in its working "
             "directory") -> None:
        raise SandboxDenied(f"agentd sandbox: {what} is not allowed; {why}")

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if getattr(self.local, "busy", False):
            return
        self.local.busy = True
        try:
            self._check(event, args)
        finally:
            self.local.busy = False

    def _check(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path = self._path(args[0])
            if path is None:
                return
            mode, flags = args[1], args[2] if len(args) > 2 else 0
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT
                                                    | os.O_TRUNC | os.O_APPEND))
            ok = self.may_write(path) if writing else self.may_read(path)
            if not ok:
                self.deny(f"opening {path} for {'writing' if writing else 'reading'}")
        elif event == "sqlite3.connect":
            path = self._path(args[0]) if args and args[0] != ":memory:" else None
            if path is not None and not self.may_write(path):
                self.deny(f"opening the database {path}")
        elif event in _PATH_WRITE_EVENTS:
            for raw in args[:2]:
                path = self._path(raw)
                if path is not None and not self.may_write(path):
                    self.deny(f"{event} on {path}")
        elif event in _PATH_READ_EVENTS:
            path = self._path(args[0]) if args else None
            if path is not None and not self.may_read(path):
                self.deny(f"{event} on {path}")
        elif event.startswith(_PROCESS_EVENTS):
            self.deny(f"starting a process ({event})", "a run is one process")
        elif event in _NATIVE_EVENTS:
            self.deny(f"native code through ctypes ({event})", "a run is Python code only")
        elif event in _SEND_EVENTS:
            address = args[-1] if event == "socket.sendmsg" else args[1]
            if event == "socket.sendmsg" and address is None:
                return  # on a connected socket, checked at connect
            if not self._to_daemon(address):
                self.deny(f"network traffic to {address!r}", "only the daemon is reachable")
        elif event == "socket.bind":
            self.deny(f"binding a socket to {args[1]!r}", "a run serves nothing")
        elif event in ("os.kill", "os.killpg"):
            own = (0, os.getpid()) if event == "os.kill" else (0, os.getpgid(0))
            if args[0] not in own:
                self.deny(f"signalling process {'group ' if event == 'os.killpg' else ''}"
                          f"{args[0]}", "a run may signal only itself")

    def _to_daemon(self, address: Any) -> bool:
        if isinstance(address, str | bytes) and self.relay is not None:
            return os.fsdecode(address) == self.relay
        return (isinstance(address, tuple) and len(address) >= 2
                and address[1] == self.daemon_port
                and address[0] in ("127.0.0.1", "::1", "localhost"))


def _agent_of(exc: BaseException) -> str | None:
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for note in getattr(e, "__notes__", []) or []:
            if isinstance(note, str) and note.startswith("agentd: raised in "):
                return note.removeprefix("agentd: raised in ")
        e = e.__cause__ or e.__context__
    return None


def _user_frame(exc: BaseException, workdir: str) -> str | None:
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if frame.filename.startswith(workdir):
            return f"{os.path.relpath(frame.filename, workdir)}:{frame.lineno}"
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and all(e is not s for s in seen):
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def _limit_reason(exc: BaseException, workdir: str, limits: dict[str, Any]) -> str | None:
    """The limit or confinement layer behind an exception, when one is."""
    for e in _chain(exc):
        if isinstance(e, MemoryError):
            return f"memory limit exceeded ({limits.get('memory_mb')} MiB address space)"
        if isinstance(e, SandboxDenied):
            return f"sandbox: {e}"
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"disk quota exceeded ({limits.get('disk_mb')} MiB working directory)"
        if (isinstance(e, OSError) and e.errno == errno.EAGAIN and _starts_process(e)) or (
                isinstance(e, RuntimeError) and "can't start new thread" in str(e)):
            return f"process limit reached ({limits.get('processes')} processes and threads)"
        if (isinstance(e, PermissionError) and e.filename
                and not os.fsdecode(e.filename).startswith(workdir)):
            return f"sandbox (kernel): {type(e).__name__}: {e}"
    return None


def _starts_process(exc: BaseException) -> bool:
    """EAGAIN from the line that forks (not from, say, a non-blocking socket)."""
    frames = traceback.extract_tb(exc.__traceback__)
    line = (frames[-1].line or "") if frames else ""
    return any(word in line for word in ("fork", "spawn", "Popen", "start"))


def _cut(text: str | None, keep: int = REPORT_TEXT_CHARS) -> str | None:
    if text is None or len(text) <= keep:
        return text
    return text[:keep] + f"... [{len(text) - keep} more characters]"


def failure(exc: BaseException, workdir: str, limits: dict[str, Any]) -> dict[str, Any]:
    trace = "".join(traceback.format_exception(exc))
    if len(trace) > TRACEBACK_CHARS:
        trace = f"[{len(trace) - TRACEBACK_CHARS} characters cut]\n" + trace[-TRACEBACK_CHARS:]
    error = {"type": _cut(type(exc).__name__), "message": _cut(str(exc)), "traceback": trace,
             "agent": _cut(_agent_of(exc)), "path": _cut(_user_frame(exc, workdir))}
    reason = _limit_reason(exc, workdir, limits)
    if reason is not None:
        return {"ok": False, "kind": "system", "reason": _cut(reason), "error": error}
    return {"ok": False, "kind": "user", "reason": _cut(f"{type(exc).__name__}: {exc}"),
            "error": error}


def _to_json(value: Any) -> str:
    try:
        return json.dumps({"ok": True, "result": value})
    except (TypeError, ValueError):
        return json.dumps({"ok": True, "result": repr(value), "result_is_repr": True})


def result_line(value: Any, max_bytes: int | None) -> str:
    """The result line, or a failure naming the cap when it is longer than `max_bytes`
    (JSON's default ASCII escaping makes its length its size in bytes)."""
    line = _to_json(value)
    if max_bytes is None or len(line) <= max_bytes:
        return line
    return json.dumps({"ok": False, "kind": "system",
                       "reason": f"result too large: {len(line)} bytes of JSON, over the "
                                 f"daemon's max_result_bytes ({max_bytes})"})


def _finish(out: Any, result: dict[str, Any] | str) -> NoReturn:
    out.write((result if isinstance(result, str) else json.dumps(result)) + "\n")
    out.flush()
    os._exit(0)  # do not wait for agent threads still running


def _confinement(argv: list[str]) -> dict[str, Any]:
    """The layers the daemon chose: a JSON object on the pipe named by --confine-fd."""
    if "--confine-fd" not in argv:
        return {}
    with os.fdopen(int(argv[argv.index("--confine-fd") + 1]), "rb") as f:
        conf: dict[str, Any] = json.loads(f.read() or b"{}")
    return conf


def _confine(conf: dict[str, Any], workdir: Path, limits: dict[str, Any],
             out: Any) -> isolation.Confined:
    try:
        confined = isolation.apply(conf, workdir)
    except isolation.ConfinementError as exc:
        _finish(out, {"ok": False, "kind": "system", "layer": exc.layer,
                      "reason": f"sandbox confinement failed at layer '{exc.layer}': {exc}"})
    apply_limits(limits)
    if conf.get("report_fd") is not None:
        _report(int(conf["report_fd"]), confined)
    return confined


def _report(fd: int, confined: isolation.Confined) -> None:
    """Tell the daemon, before any user code runs, which layers hold and which namespaces
    mark this run's processes (none can leave them, so the daemon can find every one)."""
    marks = {name: os.stat(f"/proc/self/ns/{name}").st_ino for name in ("user", "mnt", "net")}
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"layers": confined.layers, "ns": marks}) + "\n")


def _probe(confined: isolation.Confined, out: Any) -> NoReturn:
    if confined.relay is not None:
        import httpx

        confined.relay.start()
        try:
            httpx.get(os.environ["AGENTD_DAEMON_URL"] + "/healthz", timeout=10).raise_for_status()
        except Exception as exc:
            _finish(out, {"ok": False, "kind": "system", "layer": "netns",
                          "reason": f"the daemon does not answer through the relay: {exc!r}"})
    _finish(out, {"ok": True, "layers": confined.layers})


def main() -> int:
    out = os.fdopen(os.dup(1), "w")  # the result channel
    os.dup2(2, 1)  # everything the workflow prints goes to the run's log
    conf = _confinement(sys.argv[1:])
    spec = json.loads(sys.stdin.read())
    limits: dict[str, Any] = spec.get("limits", {})
    workdir = Path.cwd()
    sys.dont_write_bytecode = True
    confined = _confine(conf, workdir, limits, out)
    if "--probe" in sys.argv[1:]:
        _probe(confined, out)
    if confined.relay is not None:
        confined.relay.start()  # after Landlock: every thread is confined

    from agentd import runtime as rt
    from agentd.future import resolve

    runtime = rt.DaemonRuntime.from_env()
    rt.set_runtime(runtime)
    relay = confined.relay.target if confined.relay is not None else None
    if conf.get("audit_hook", True):
        sys.addaudithook(Guard(workdir, os.environ["AGENTD_DAEMON_URL"], relay))
    sys.path.insert(0, str(workdir))
    module_name, func_name = spec["entry"].split(":")
    line: str
    try:
        import asyncio
        import importlib
        module = importlib.import_module(module_name)
        fn: Callable[..., Any] = getattr(module, func_name)
        value = fn(**spec.get("args", {}))
        if asyncio.iscoroutine(value):
            value = asyncio.run(value)
        line = result_line(resolve(value), spec.get("max_result_bytes"))
    except BaseException as exc:
        line = json.dumps(failure(exc, str(workdir) + os.sep, limits))
    try:
        runtime.pool.shutdown(wait=False, cancel_futures=True)
        runtime.flush()
    finally:
        _finish(out, line)


if __name__ == "__main__":
    sys.exit(main())
