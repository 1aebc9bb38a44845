"""The contract between the lifecycle manager and the backends that hold environments.

Ownership lives *on the resources themselves* (docker labels, a label file in a process
tool's directory), not only in daemon memory: after a crash, `resources()` still finds what
each daemon and program owns, so reconciliation needs nothing but the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from tools.errors import Reason
from tools.spec import ToolSpec

LABEL_DAEMON = "agentd.daemon_id"
LABEL_PROGRAM = "agentd.program_id"
LABEL_TOOL = "agentd.tool"
# Where a container runs (the engine's URL) and the pool it was placed from, so an operator
# reading labels, and a daemon after a crash, sees where each environment went.
LABEL_HOST = "agentd.tool_host"
LABEL_POOL = "agentd.tool_pool"

ResourceKind = Literal["container", "volume", "dir"]


@dataclass(frozen=True)
class Owner:
    daemon_id: str
    program_id: str
    tool: str

    def labels(self) -> dict[str, str]:
        return {LABEL_DAEMON: self.daemon_id, LABEL_PROGRAM: self.program_id, LABEL_TOOL: self.tool}

    @classmethod
    def from_labels(cls, labels: dict[str, str]) -> Owner:
        return cls(
            labels.get(LABEL_DAEMON, ""), labels.get(LABEL_PROGRAM, ""), labels.get(LABEL_TOOL, "")
        )


@dataclass(frozen=True)
class Environment:
    """A prepared tool environment. `id` is the container id or the directory path."""

    backend: str
    id: str
    owner: Owner
    spec: ToolSpec
    workdir: str
    host: str = ""  # the Docker engine holding it (its URL); "" for process tools


@dataclass(frozen=True)
class Resource:
    """One reclaimable thing (container, volume, directory) as the backend sees it now."""

    backend: str
    kind: ResourceKind
    id: str
    name: str
    owner: Owner
    state: str
    created_at: float  # unix seconds
    disk_bytes: int | None = None
    host: str = ""  # the Docker engine it was found on; "" for process tools

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "resource": self.kind,
            "id": self.id,
            "name": self.name,
            "daemon_id": self.owner.daemon_id,
            "program_id": self.owner.program_id,
            "tool": self.owner.tool,
            "state": self.state,
            "created_at": self.created_at,
            "disk_bytes": self.disk_bytes,
            "host": self.host,
        }


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    reason: Reason = Reason.OK
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.reason is Reason.OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "duration_s": self.duration_s,
            "reason": str(self.reason),
            "detail": self.detail,
        }


# Told each piece of a command's output as it arrives: ("stdout" | "stderr", the bytes).
OutputListener = Callable[[str, bytes], None]


@dataclass
class OutputBuffer:
    """Keeps the last `limit` bytes of a stream: a runaway command must not fill our memory,
    and the end of the output is where the answer or the error is. `listener`, when set,
    sees every piece as it arrives (a streamed exec)."""

    limit: int = 1 << 20
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    dropped: int = 0
    listener: Callable[[bytes], None] | None = None

    def add(self, data: bytes) -> None:
        if self.listener is not None:
            self.listener(data)
        self.chunks.append(data)
        self.size += len(data)
        if self.size > 2 * self.limit:
            joined = b"".join(self.chunks)
            self.dropped += len(joined) - self.limit
            self.chunks, self.size = [joined[-self.limit :]], self.limit

    def text(self) -> str:
        data = b"".join(self.chunks)[-self.limit :]
        return data.decode("utf-8", errors="replace")


def result_reason(exit_code: int, *, timed_out: bool, oom: bool) -> Reason:
    if timed_out:
        return Reason.TIMEOUT
    if oom:
        return Reason.OOM
    if exit_code == 0:
        return Reason.OK
    # 128+n is a shell's report of signal n; a negative code is asyncio's.
    return Reason.KILLED if exit_code < 0 or exit_code in (137, 143) else Reason.EXIT


def as_argv(command: str | Sequence[str], prefix: Sequence[str] = ()) -> list[str]:
    """A string is a shell line; a list is an argv, appended to the tool's command prefix."""
    if isinstance(command, str):
        return [*prefix, command] if prefix else ["/bin/sh", "-c", command]
    return [*prefix, *command]


class Backend(Protocol):
    """Every method may raise `ToolError`; none blocks the event loop."""

    kind: str

    async def create(self, owner: Owner, spec: ToolSpec) -> Environment:
        """Build and start an environment; its resources carry `owner`'s labels."""

    async def exec(self, env: Environment, argv: Sequence[str], timeout_s: float,
                   on_output: OutputListener | None = None) -> ExecResult:
        """Run argv to completion in `env`; on timeout kill it and everything it started.
        `on_output` is told each piece of output as it arrives, on the event loop."""

    async def put_file(self, env: Environment, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write a file; a relative path is taken from the environment's working dir."""

    async def get_file(self, env: Environment, path: str) -> bytes:
        """Read a file; a relative path is taken from the environment's working dir."""

    async def resources(
        self, daemon_id: str, program_id: str | None = None, *, sizes: bool = False
    ) -> list[Resource]:
        """Everything this backend holds for a daemon (and program). `sizes` may be slow."""

    async def reclaim(self, resource: Resource) -> None:
        """Remove one resource; stopping whatever runs in it. Gone already is success."""

    def hosts(self) -> list[str]:
        """The engines this backend places on (Docker engine URLs); empty for local ones."""

    def hosts_down(self) -> dict[str, str]:
        """Engines of this backend the last listing could not reach, with why (the others
        were listed and reclaimed regardless); empty when all answered."""
