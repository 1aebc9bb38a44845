"""What a tool environment is: parsed once from config, a manifest or a request.

Specs are frozen msgspec structs so one configured value can be shared by every program
using a tool without anyone mutating it under the others. `parse_spec` is the only way in
from untrusted data; it turns every problem into a `SpecError` that names the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

from tools.errors import Reason, ToolError

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"

Name = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN)]
Positive = Annotated[int, msgspec.Meta(gt=0)]
Seconds = Annotated[float, msgspec.Meta(gt=0)]
DEFAULT_POOL = "default"  # the pool of a docker tool that names none


class Mount(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """`volume`: a fresh volume owned by the program, removed at release.
    `bind`: a host path (trusted specs only: it escapes the sandbox).
    `tmpfs`: memory-backed scratch space of `size_mb`."""

    target: str
    type: Literal["volume", "bind", "tmpfs"] = "volume"
    source: str | None = None
    read_only: bool = False
    size_mb: Positive | None = None

    def __post_init__(self) -> None:
        if not self.target.startswith("/"):
            raise ValueError("mounts.target must be an absolute path")
        if (self.type == "bind") != (self.source is not None):
            raise ValueError("mounts.source is required for bind mounts and only for them")


class ToolSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    name: Name
    backend: Literal["docker", "process"] = "docker"
    image: str | None = None
    # An argv prefix for every exec (e.g. ["python3", "-c"]); empty runs the exec argv as is.
    command: tuple[str, ...] = ()
    env: dict[str, str] = {}
    mounts: tuple[Mount, ...] = ()
    network: Literal["none", "bridge", "host"] = "none"
    cpus: Annotated[float, msgspec.Meta(gt=0)] | None = None
    memory_mb: Positive | None = None
    pids: Positive | None = None
    cpu_seconds: Positive | None = None
    open_files: Positive | None = None
    workdir: str | None = None
    setup: tuple[str, ...] = ()
    exec_timeout_s: Seconds = 60.0
    setup_timeout_s: Seconds = 600.0
    # The `[tool_pools.NAME]` of Docker engines its containers go to; None = "default"
    # (the configured default pool, else the engine of DOCKER_HOST).
    pool: Name | None = None

    def __post_init__(self) -> None:
        if self.backend == "docker":
            _check_docker(self)
        else:
            _check_process(self)


def _check_docker(spec: ToolSpec) -> None:
    if not spec.image:
        raise ValueError("image is required for the docker backend")
    if spec.workdir is not None and not spec.workdir.startswith("/"):
        raise ValueError("workdir must be an absolute path in the container")


def _check_process(spec: ToolSpec) -> None:
    # Fields the process backend cannot honour are refused rather than silently ignored,
    # so nobody believes a process tool has a filesystem or CPU-share sandbox.
    for field, value in (("image", spec.image), ("workdir", spec.workdir), ("cpus", spec.cpus),
                         ("pool", spec.pool)):
        if value is not None:
            raise ValueError(f"{field} is not supported by the process backend")
    if spec.mounts:
        raise ValueError("mounts is not supported by the process backend")
    if spec.network == "bridge":
        raise ValueError("network 'bridge' is not supported by the process backend")


HOST_SCHEMES = ("unix://", "tcp://", "ssh://")


class ToolPool(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A `[tool_pools.NAME]` table: the Docker engines a pool's containers may go to."""

    hosts: Annotated[tuple[str, ...], msgspec.Meta(min_length=1)]

    def __post_init__(self) -> None:
        for index, url in enumerate(self.hosts):
            if not url.startswith(HOST_SCHEMES):
                raise ValueError(f"hosts[{index}] must be a Docker engine URL starting with "
                                 f"{' or '.join(HOST_SCHEMES)}, got {url!r}")
        if len(set(self.hosts)) != len(self.hosts):
            raise ValueError("hosts names an engine twice")


def parse_pools(raw: Any) -> dict[str, tuple[str, ...]]:
    """Config's `tool_pools`: host URLs by pool name; the error names `NAME.FIELD`."""
    if not isinstance(raw, Mapping):
        raise SpecError("must be [tool_pools.NAME] tables, each with `hosts = [URL, ...]`")
    pools = {}
    for name, table in raw.items():
        if not re.match(NAME_PATTERN, str(name)):
            raise SpecError(f"{name}: a pool name must match {NAME_PATTERN}", field=str(name))
        try:
            pools[name] = msgspec.convert(table, ToolPool).hosts
        except msgspec.ValidationError as exc:
            raise SpecError(f"{name}: {exc}", field=f"{name}.hosts") from exc
    return pools


_PATH = re.compile(r"at `\$\.([^`]+)`|unknown field `([^`]+)`")


class SpecError(ToolError):
    """`field` is the spec field at fault when known ("memory_mb", "mounts[0].target"), so
    an API can point at it inside whatever holds the spec (a manifest, a config table)."""

    def __init__(self, message: str, *, tool: str = "", field: str | None = None) -> None:
        super().__init__(Reason.BAD_SPEC, message, tool=tool)
        self.field = field


def _field_of(message: str) -> str | None:
    found = _PATH.search(message)
    if found:
        return found.group(1) or found.group(2)
    # Our own checks start with the field's name ("image is required ...").
    first = message.split(" ", 1)[0].split(".", 1)[0]
    return first if first in ToolSpec.__struct_fields__ else None


def parse_spec(data: Mapping[str, Any], *, trusted: bool = False) -> ToolSpec:
    """`trusted` is for operator config: only it may bind host paths into a container or
    share the host's network; specs from requests and bundles are not trusted."""
    try:
        spec = msgspec.convert(dict(data), ToolSpec)
    except msgspec.ValidationError as exc:
        raise SpecError(f"invalid tool spec: {exc}", tool=str(data.get("name", "")),
                        field=_field_of(str(exc))) from exc
    if not trusted:
        _check_untrusted(spec.name, spec.mounts, spec.network)
    return spec


def parse_table(name: str, table: Any, *, trusted: bool = False) -> ToolSpec:
    """A `[tools.NAME]` table: the form of config files and bundle manifests, where the
    name is the key and the table holds the rest."""
    if not isinstance(table, Mapping):
        raise SpecError(f"tool {name!r} must be a table of spec fields", tool=name)
    if table.get("name", name) != name:
        raise SpecError(f"name: {table['name']!r} differs from the table's key", tool=name,
                        field="name")
    return parse_spec({**table, "name": name}, trusted=trusted)


def _check_untrusted(name: str, mounts: Any, network: Any) -> None:
    if any((m.type if isinstance(m, Mount) else m.get("type")) == "bind" for m in mounts):
        raise SpecError("mounts: bind mounts are allowed only in operator config", tool=name,
                        field="mounts")
    if network == "host":
        raise SpecError("network: 'host' is allowed only in operator config", tool=name,
                        field="network")


def merge_spec(base: ToolSpec, overrides: Mapping[str, Any]) -> ToolSpec:
    """A per-request tweak of a configured tool (say a longer timeout) without restating it.
    The overrides are untrusted; what the operator configured stays allowed."""
    # Malformed mounts are left for parse_spec to refuse with the field named.
    raw = overrides.get("mounts", ())
    mounts = [m for m in raw if isinstance(m, Mapping)] if isinstance(raw, list | tuple) else []
    _check_untrusted(base.name, mounts, overrides.get("network"))
    if overrides.get("name", base.name) != base.name:
        raise SpecError("name: overrides cannot rename a tool", tool=base.name, field="name")
    return parse_spec(msgspec.to_builtins(base) | dict(overrides), trusted=True)
