"""Tool environments as plain subprocesses in a private working directory.

Weaker isolation than a container, on purpose and stated plainly: same kernel, same user
as the daemon, the host's filesystem and network (no network isolation at all: the spec's
`network` is not enforced), and limits are only rlimits: CPU seconds, address space (virtual
memory, so runtimes that reserve large mappings need headroom), open files, and processes
(RLIMIT_NPROC counts the whole user and is ignored for root). Use it where Docker is not
available or the tool is trusted; use the docker backend for untrusted code.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import resource
import secrets
import shutil
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from tools.base import (
    Environment,
    ExecResult,
    OutputBuffer,
    OutputListener,
    Owner,
    Resource,
    result_reason,
)
from tools.errors import Reason, ToolError
from tools.spec import ToolSpec

LABELS_FILE = "labels.json"
KILL_GRACE_S = 5.0
MIB = 1 << 20


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text)[:20].strip("-.") or "x"


def _rlimits(spec: ToolSpec) -> list[tuple[int, int]]:
    wanted = (
        (resource.RLIMIT_CPU, spec.cpu_seconds),
        (resource.RLIMIT_AS, spec.memory_mb * MIB if spec.memory_mb else None),
        (resource.RLIMIT_NOFILE, spec.open_files),
        (resource.RLIMIT_NPROC, spec.pids),
    )
    return [(which, value) for which, value in wanted if value]


def _preexec(limits: list[tuple[int, int]]) -> None:
    # Runs in the child between fork and exec: only async-signal-safe-ish work, no imports.
    for which, value in limits:
        resource.setrlimit(which, (value, value))


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, just not ours to signal
        pass
    return True


def _inside(root: Path, path: str) -> Path:
    full = (root / path).resolve()
    if not full.is_relative_to(root.resolve()):
        raise ToolError(Reason.BAD_PATH, f"{path} is outside the tool's working directory")
    return full


def _disk_bytes(path: Path) -> int:
    total = 0
    for base, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_blocks * 512
            except OSError:
                continue
    return total


async def _drain(stream: asyncio.StreamReader | None, buffer: OutputBuffer) -> None:
    while stream is not None and (chunk := await stream.read(65536)):
        buffer.add(chunk)


class ProcessBackend:
    kind = "process"

    def __init__(self, root: str | os.PathLike[str]) -> None:
        """`root` holds one directory per daemon id, one per environment beneath it."""
        self._root = Path(root)
        # Process groups started per environment, so reclaiming one ends what it left running.
        self._groups: dict[str, set[int]] = {}

    def _daemon_dir(self, daemon_id: str) -> Path:
        return self._root / _slug(daemon_id)

    async def create(self, owner: Owner, spec: ToolSpec) -> Environment:
        path = self._daemon_dir(owner.daemon_id) / "-".join(
            [_slug(owner.program_id), _slug(owner.tool), secrets.token_hex(4)]
        )
        labels = {"labels": owner.labels(), "created_at": time.time()}
        await asyncio.to_thread(_make_dir, path, json.dumps(labels))
        return Environment("process", str(path), owner, spec, str(path / "work"))

    async def exec(self, env: Environment, argv: Sequence[str], timeout_s: float,
                   on_output: OutputListener | None = None) -> ExecResult:
        if not await asyncio.to_thread(os.path.isdir, env.workdir):
            raise ToolError(Reason.DEAD, f"working directory {env.workdir} is gone")
        limits = _rlimits(env.spec)
        start = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=env.workdir,
                env=_environ(env),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                preexec_fn=lambda: _preexec(limits),
            )
        except OSError as exc:  # what a shell reports as 126/127
            return ExecResult(127, "", f"{argv[0]}: {exc.strerror}", 0.0, Reason.EXIT)
        self._groups.setdefault(env.id, set()).add(proc.pid)
        out, err = OutputBuffer(), OutputBuffer()
        if on_output is not None:
            out.listener = functools.partial(on_output, "stdout")
            err.listener = functools.partial(on_output, "stderr")
        try:
            code, timed_out = await self._wait(proc, out, err, timeout_s)
        finally:
            self._prune(env.id)
        reason = result_reason(code, timed_out=timed_out, oom=False)
        detail = f"killed after {timeout_s:g} s timeout" if timed_out else ""
        return ExecResult(code, out.text(), err.text(), time.monotonic() - start, reason, detail)

    async def _wait(
        self,
        proc: asyncio.subprocess.Process,
        out: OutputBuffer,
        err: OutputBuffer,
        timeout_s: float,
    ) -> tuple[int, bool]:
        # Like a docker exec, the command is done when its output closes, so a background
        # child still holding stdout counts against the timeout too.
        readers = asyncio.gather(_drain(proc.stdout, out), _drain(proc.stderr, err))
        waiting = asyncio.gather(proc.wait(), readers)
        try:
            await asyncio.wait_for(asyncio.shield(waiting), timeout_s)
            return proc.returncode or 0, False
        except TimeoutError:
            _kill_group(proc.pid)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiting, KILL_GRACE_S)
            return proc.returncode if proc.returncode is not None else -signal.SIGKILL, True
        except asyncio.CancelledError:
            _kill_group(proc.pid)
            raise

    def _prune(self, env_id: str) -> None:
        """Forget process groups with no member left; those still alive ran in background."""
        groups = self._groups.get(env_id, set())
        groups.difference_update({pgid for pgid in groups if not _group_alive(pgid)})

    async def put_file(self, env: Environment, path: str, data: bytes, mode: int = 0o644) -> None:
        full = _inside(Path(env.workdir), path)
        await asyncio.to_thread(_write, full, data, mode)

    async def get_file(self, env: Environment, path: str) -> bytes:
        full = _inside(Path(env.workdir), path)
        try:
            return await asyncio.to_thread(full.read_bytes)
        except OSError as exc:
            raise ToolError(Reason.BAD_PATH, f"{path}: {exc.strerror}") from exc

    async def resources(
        self, daemon_id: str, program_id: str | None = None, *, sizes: bool = False
    ) -> list[Resource]:
        return await asyncio.to_thread(self._scan, daemon_id, program_id, sizes)

    def _scan(self, daemon_id: str, program_id: str | None, sizes: bool) -> list[Resource]:
        found = []
        for labels_path in sorted(self._daemon_dir(daemon_id).glob(f"*/{LABELS_FILE}")):
            try:
                meta = json.loads(labels_path.read_text())
            except (OSError, ValueError):
                continue
            owner = Owner.from_labels(meta.get("labels", {}))
            if owner.daemon_id != daemon_id or program_id not in (None, owner.program_id):
                continue
            path = labels_path.parent
            state = "running" if self._groups.get(str(path)) else "idle"
            found.append(
                Resource(
                    "process",
                    "dir",
                    str(path),
                    path.name,
                    owner,
                    state,
                    float(meta.get("created_at", 0.0)),
                    _disk_bytes(path) if sizes else None,
                )
            )
        return found

    async def reclaim(self, resource: Resource) -> None:
        for pgid in self._groups.pop(resource.id, set()):
            _kill_group(pgid)
        await asyncio.to_thread(shutil.rmtree, resource.id, True)

    def hosts(self) -> list[str]:
        return []

    def hosts_down(self) -> dict[str, str]:
        return {}  # one local directory: it is never unreachable


def _make_dir(path: Path, labels: str) -> None:
    (path / "work").mkdir(parents=True, mode=0o700)
    (path / LABELS_FILE).write_text(labels)


def _write(full: Path, data: bytes, mode: int) -> None:
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_bytes(data)
    full.chmod(mode)


def _environ(env: Environment) -> dict[str, str]:
    # A fresh environment, not the daemon's: the daemon's variables may hold credentials.
    base = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": env.workdir,
        "TMPDIR": env.workdir,
        "LANG": "C.UTF-8",
    }
    return base | dict(env.spec.env)
