"""`python -m agentd.sandbox`: run one workflow entry inside a daemon-started sandbox.

The daemon starts this with a scrubbed environment (run id, program/session ids, daemon
URL, run token: see daemon/runtime/runs.py), in a private working directory that holds
only the bundle copy, and writes {"entry", "args", "limits"} as JSON on stdin. Before any
user code runs, this process:

1. keeps its stdout for the result only (user prints go to stderr, the run's log);
2. applies resource limits with setrlimit: address space, CPU seconds, open files,
   file size;
3. installs an audit hook (PEP 578) that refuses, for the rest of the process: opening
   or changing files outside the working directory (reads of the Python installation
   and of installed code are allowed), sqlite databases outside it, starting processes,
   loading native libraries through ctypes, and network connections to anything but the
   daemon.

The audit hook is a guard against accidents and casual misuse by workflow code, not a
kernel boundary: code that escapes the interpreter (a C extension already loaded, a
bug in CPython) is not contained by it. Kernel-level confinement (Landlock, namespaces,
a separate uid) is the next step, noted in daemon/runtime/README.md.

The one line on stdout is the result: {"ok": true, "result": ...} or {"ok": false,
"kind": "user" | "system", "reason", "error": {type, message, traceback, agent, path}}.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import sysconfig
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

MIB = 1024 * 1024
_PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                   "os.fork", "os.forkpty", "pty.spawn", "os.startfile")
_NATIVE_EVENTS = ("ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.addressof")
_PATH_WRITE_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
                      "os.truncate", "shutil.rmtree", "os.link", "os.symlink", "os.utime",
                      "shutil.copyfile", "shutil.move", "os.chflags")
_PATH_READ_EVENTS = ("os.listdir", "os.scandir", "glob.glob", "os.chdir")
_CODE_SUFFIXES = (".py", ".pyc", ".so", ".pyi", ".pth", ".typed")
_SYSTEM_READ = ("/usr/", "/lib/", "/lib64/", "/etc/ssl/", "/etc/localtime", "/etc/hosts",
                "/etc/resolv.conf", "/etc/nsswitch.conf", "/dev/null", "/dev/urandom",
                "/proc/self/")


class SandboxDenied(PermissionError):
    """An operation the run's sandbox does not allow."""


def apply_limits(limits: dict[str, Any]) -> None:
    """setrlimit for what the daemon asked; each limit is both soft and hard."""
    def set_limit(which: int, value: int) -> None:
        resource.setrlimit(which, (value, value))

    if limits.get("memory_mb"):
        set_limit(resource.RLIMIT_AS, int(limits["memory_mb"]) * MIB)
    if limits.get("cpu_s"):
        set_limit(resource.RLIMIT_CPU, int(limits["cpu_s"]))
    if limits.get("open_files"):
        set_limit(resource.RLIMIT_NOFILE, int(limits["open_files"]))
    if limits.get("file_size_mb"):
        set_limit(resource.RLIMIT_FSIZE, int(limits["file_size_mb"]) * MIB)


class Guard:
    """The audit hook's policy: see the module docstring."""

    def __init__(self, workdir: Path, daemon_url: str) -> None:
        self.workdir = str(workdir.resolve()) + os.sep
        code_roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib",
                                                          "platlib")}
        code_roots |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
        self.read_roots = tuple(str(Path(p).resolve()) + os.sep for p in code_roots if p)
        # installed-in-place (editable) packages: their code files only
        self.code_roots = tuple(str(Path(p).resolve()) + os.sep
                                for p in sys.path if p and Path(p).is_dir())
        parts = urlsplit(daemon_url)
        self.daemon_port = parts.port or 80
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
        if any(path == s.rstrip("/") or path.startswith(s) for s in _SYSTEM_READ):
            return True
        return self._inside(path, self.code_roots) and (
            path.endswith(_CODE_SUFFIXES) or os.path.isdir(path))

    def may_write(self, path: str) -> bool:
        return self._inside(path, (self.workdir,)) or path == "/dev/null"

    def deny(self, what: str) -> None:
        raise SandboxDenied(f"agentd sandbox: {what} is not allowed; a run may only use "
                            "files in its working directory")

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
            self.deny(f"starting a process ({event})")
        elif event in _NATIVE_EVENTS:
            self.deny(f"native code through ctypes ({event})")
        elif event == "socket.connect":
            address = args[1]
            if not (isinstance(address, tuple) and address[1] == self.daemon_port
                    and address[0] in ("127.0.0.1", "::1", "localhost")):
                self.deny(f"a network connection to {address!r} (only the daemon is reachable)")


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


def _is_memory(exc: BaseException) -> bool:
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, MemoryError):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def failure(exc: BaseException, workdir: str, limits: dict[str, Any]) -> dict[str, Any]:
    error = {"type": type(exc).__name__, "message": str(exc),
             "traceback": "".join(traceback.format_exception(exc)),
             "agent": _agent_of(exc), "path": _user_frame(exc, workdir)}
    if _is_memory(exc):
        return {"ok": False, "kind": "system",
                "reason": f"memory limit exceeded ({limits.get('memory_mb')} MiB address space)",
                "error": error}
    if isinstance(exc, SandboxDenied):
        return {"ok": False, "kind": "system", "reason": f"sandbox: {exc}", "error": error}
    return {"ok": False, "kind": "user", "reason": f"{type(exc).__name__}: {exc}",
            "error": error}


def _to_json(value: Any) -> str:
    try:
        return json.dumps({"ok": True, "result": value})
    except (TypeError, ValueError):
        return json.dumps({"ok": True, "result": repr(value), "result_is_repr": True})


def main() -> int:
    out = os.fdopen(os.dup(1), "w")  # the result channel
    os.dup2(2, 1)  # everything the workflow prints goes to the run's log
    spec = json.loads(sys.stdin.read())
    limits: dict[str, Any] = spec.get("limits", {})
    workdir = Path.cwd()
    sys.dont_write_bytecode = True
    apply_limits(limits)

    from agentd import runtime as rt
    from agentd.future import resolve

    runtime = rt.DaemonRuntime.from_env()
    rt.set_runtime(runtime)
    sys.addaudithook(Guard(workdir, os.environ["AGENTD_DAEMON_URL"]))
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
        line = _to_json(resolve(value))
    except BaseException as exc:
        line = json.dumps(failure(exc, str(workdir) + os.sep, limits))
    try:
        runtime.pool.shutdown(wait=False, cancel_futures=True)
        runtime.flush()
    finally:
        out.write(line + "\n")
        out.flush()
    os._exit(0)  # do not wait for agent threads still running


if __name__ == "__main__":
    sys.exit(main())
