"""Tool environments as Docker containers, through the `docker` SDK.

Every SDK call runs in a worker thread (`tools.docker_errors.call`). Images are never
pulled: an unknown image is the operator's to build, and a silent multi-minute pull in
the middle of a program is worse than a clear `unknown_image`.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import docker
from docker.types import Mount, Ulimit

from tools import docker_exec
from tools.base import (
    LABEL_DAEMON,
    LABEL_HOST,
    LABEL_POOL,
    LABEL_PROGRAM,
    Environment,
    ExecResult,
    OutputListener,
    Owner,
    Resource,
)
from tools.docker_errors import call
from tools.errors import Reason, ToolError
from tools.spec import DEFAULT_POOL, ToolSpec

# PID 1 in a container ignores SIGTERM unless it installs a handler; this one does, so a
# plain `docker stop` by an operator takes milliseconds, not the 10 s kill timeout.
KEEPALIVE = ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"]
DEFAULT_WORKDIR = "/work"
MIB = 1 << 20
DF_RETRIES = 50
DF_RETRY_S = 0.2
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"


def _slug(text: str, limit: int = 20) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text)[:limit].strip("-.") or "x"


def _limits(spec: ToolSpec) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if spec.memory_mb:
        # No swap beyond the limit, so an overrun is killed rather than slowed to a crawl.
        limits["mem_limit"] = limits["memswap_limit"] = spec.memory_mb * MIB
    if spec.cpus:
        limits["nano_cpus"] = int(spec.cpus * 1e9)
    if spec.pids:
        limits["pids_limit"] = spec.pids
    ulimits = [
        Ulimit(name=name, soft=value, hard=value)
        for name, value in (("cpu", spec.cpu_seconds), ("nofile", spec.open_files))
        if value
    ]
    if ulimits:
        limits["ulimits"] = ulimits
    return limits


def _create(client: Any, owner: Owner, spec: ToolSpec, name: str, host: str) -> str:
    labels = owner.labels() | {LABEL_HOST: host, LABEL_POOL: spec.pool or DEFAULT_POOL}
    mounts = []
    for index, m in enumerate(spec.mounts):
        if m.type == "volume":
            # Created explicitly so the volume carries our labels; auto-created ones do not.
            volume = client.volumes.create(name=f"{name}-v{index}", labels=labels)
            mounts.append(Mount(m.target, volume.name, type="volume", read_only=m.read_only))
        elif m.type == "bind":
            mounts.append(Mount(m.target, m.source, type="bind", read_only=m.read_only))
        else:
            size = m.size_mb * MIB if m.size_mb else None
            mounts.append(Mount(m.target, None, type="tmpfs", tmpfs_size=size))
    container = client.containers.create(
        spec.image,
        command=KEEPALIVE,
        name=name,
        labels=labels,
        environment=dict(spec.env),
        working_dir=spec.workdir or DEFAULT_WORKDIR,
        network_mode=spec.network,
        mounts=mounts,
        detach=True,
        **_limits(spec),
    )
    container.start()
    return str(container.id)


def _created_at(value: Any) -> float:
    if isinstance(value, int | float):
        return float(value)
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return 0.0


def _container(entry: dict[str, Any], sized: bool, host: str) -> Resource:
    names = entry.get("Names") or [entry["Id"]]
    return Resource(
        "docker",
        "container",
        entry["Id"],
        names[0].lstrip("/"),
        Owner.from_labels(entry.get("Labels") or {}),
        entry.get("State", ""),
        _created_at(entry.get("Created")),
        # The engine omits SizeRw when the writable layer is empty.
        int(entry.get("SizeRw") or 0) if sized else None,
        host,
    )


def _volume(entry: dict[str, Any], host: str) -> Resource:
    usage = entry.get("UsageData") or {}
    size = usage.get("Size")
    return Resource(
        "docker",
        "volume",
        entry["Name"],
        entry["Name"],
        Owner.from_labels(entry.get("Labels") or {}),
        "in use" if usage.get("RefCount") else "",
        _created_at(entry.get("CreatedAt")),
        size if size is not None and size >= 0 else None,
        host,
    )


async def _df(api: Any) -> dict[str, Any]:
    # Engines before 23.0 refuse a `df` while another one (any client's) runs, instead
    # of sharing its answer; it is worth waiting for, sizes are what was asked.
    for _ in range(DF_RETRIES):
        try:
            usage: dict[str, Any] = await call(api.df)
            return usage
        except ToolError as exc:
            if "already running" not in exc.message:
                raise
        await asyncio.sleep(DF_RETRY_S)
    last: dict[str, Any] = await call(api.df)
    return last


def _owned(entry: dict[str, Any], wanted: dict[str, str]) -> bool:
    labels = entry.get("Labels") or {}
    return all(labels.get(k) == v for k, v in wanted.items())


class DockerBackend:
    kind = "docker"

    def __init__(self, base_url: str | None = None) -> None:
        """`base_url` like unix:///run/docker.sock; by default DOCKER_HOST or the system socket."""
        self._base_url = base_url
        # What labels and listings name this engine by: its URL.
        self.host = base_url or os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
        self._client: Any = None
        self._oom_seen: dict[str, int] = {}

    def _connect(self) -> Any:
        # Built lazily in a worker thread: the SDK asks the engine its API version on
        # construction, which blocks and fails when the engine is down.
        if self._client is None:
            kwargs: dict[str, Any] = {"max_pool_size": 32}
            self._client = (
                docker.DockerClient(base_url=self._base_url, **kwargs)
                if self._base_url
                else docker.from_env(**kwargs)
            )
        return self._client

    async def client(self) -> Any:
        return await call(self._connect)

    async def create(self, owner: Owner, spec: ToolSpec) -> Environment:
        client = await self.client()
        name = "-".join(
            [
                "agentd",
                _slug(owner.daemon_id, 12),
                _slug(owner.program_id),
                _slug(owner.tool),
                secrets.token_hex(3),
            ]
        )
        try:
            container_id = await call(_create, client, owner, spec, name, self.host)
        except ToolError as exc:
            if exc.reason is Reason.ENGINE_ERROR:
                raise ToolError(Reason.START_FAILED, exc.message) from exc
            raise
        return Environment("docker", container_id, owner, spec, spec.workdir or DEFAULT_WORKDIR,
                           self.host)

    async def exec(self, env: Environment, argv: Sequence[str], timeout_s: float,
                   on_output: OutputListener | None = None) -> ExecResult:
        client = await self.client()
        return await docker_exec.exec_result(client.api, env, argv, timeout_s, self._oom_seen,
                                             on_output)

    async def put_file(self, env: Environment, path: str, data: bytes, mode: int = 0o644) -> None:
        await docker_exec.put_file((await self.client()).api, env, path, data, mode)

    async def get_file(self, env: Environment, path: str) -> bytes:
        return await docker_exec.get_file((await self.client()).api, env, path)

    async def resources(
        self, daemon_id: str, program_id: str | None = None, *, sizes: bool = False
    ) -> list[Resource]:
        api = (await self.client()).api
        wanted = {LABEL_DAEMON: daemon_id} | ({LABEL_PROGRAM: program_id} if program_id else {})
        if sizes:
            # One `df` gives writable-layer and volume sizes together; it walks the disk.
            usage = await _df(api)
            containers = usage.get("Containers") or []
            volumes = usage.get("Volumes") or []
        else:
            filters = {"label": [f"{k}={v}" for k, v in wanted.items()]}
            containers = await call(api.containers, all=True, filters=filters)
            volumes = (await call(api.volumes, filters=filters)).get("Volumes") or []
        return [_container(c, sizes, self.host) for c in containers if _owned(c, wanted)] + [
            _volume(v, self.host) for v in volumes if _owned(v, wanted)
        ]

    async def reclaim(self, resource: Resource) -> None:
        api = (await self.client()).api
        try:
            if resource.kind == "container":
                await call(api.remove_container, resource.id, force=True, v=True)
                self._oom_seen.pop(resource.id, None)
            else:
                await call(api.remove_volume, resource.id, force=True)
        except ToolError as exc:
            if exc.reason is not Reason.DEAD:
                raise

    async def live_containers(self, pool: str, owner: Owner) -> tuple[int, bool]:
        """This engine's load for placement: its containers of `pool` that are not exited
        (any daemon's: they all take its CPU), and whether `owner`'s program holds one."""
        api = (await self.client()).api
        found = await call(api.containers, all=True, filters={
            "label": [f"{LABEL_POOL}={pool}"], "status": ["created", "running"]})
        mine = {LABEL_DAEMON: owner.daemon_id, LABEL_PROGRAM: owner.program_id}
        return len(found), any(_owned(c, mine) for c in found)

    def hosts(self) -> list[str]:
        return [self.host]

    def hosts_down(self) -> dict[str, str]:
        return {}  # one engine: being down is the whole backend's error, raised
