"""The `[placement]` table of the config: where the daemon's own workers run
(daemon/workers/placement.py picks the backend from it)."""

from __future__ import annotations

import os
import socket
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec

from daemon.config import Config


class PlacementSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    backend: Literal["local", "ray"] = "local"
    # The Ray cluster (ray.init's address): "" = $RAY_ADDRESS, else "auto" (the cluster
    # `ray start` runs on this machine); never a private cluster started on the quiet.
    address: str = ""
    namespace: str = "agentd"
    # The daemon's worker endpoint as the nodes reach it; "" = worker_bind, which must then
    # name a host the nodes can reach (not 0.0.0.0).
    connect: str = ""
    # What each worker actor reserves on its node: Ray's num_cpus, num_gpus and custom
    # resources (e.g. {"node-kind:gpu" = 1} to keep workers off the head node).
    num_cpus: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    num_gpus: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    resources: dict[str, Annotated[float, msgspec.Meta(ge=0)]] = {}
    # A tensor-parallel vLLM worker: its ranks' resources (each num_cpus, num_gpus and
    # resources above) are a placement group of this many bundles on one node (STRICT_PACK).
    tensor_parallel_size: Annotated[int, msgspec.Meta(ge=1)] = 1
    # Ray restarts a worker actor whose process or node died this many times (-1: always).
    max_restarts: Annotated[int, msgspec.Meta(ge=-1)] = -1
    # Data-parallel replicas go to different nodes where they can (Ray's SPREAD strategy);
    # false: Ray's default, which packs a node before it fills the next.
    spread: bool = True


def parse(raw: dict[str, Any]) -> PlacementSettings:
    """The [placement] table; ValueError naming the key that is wrong."""
    try:
        return msgspec.convert(raw, PlacementSettings)
    except msgspec.ValidationError as exc:
        raise ValueError(f"config placement: {exc}") from None


def ray_address(settings: PlacementSettings, env: dict[str, str] | None = None) -> str:
    env = dict(os.environ) if env is None else env
    return settings.address or env.get("RAY_ADDRESS", "") or "auto"


def worker_connect(cfg: Config, settings: PlacementSettings) -> str:
    return settings.connect or cfg.worker_bind


def problem(cfg: Config, settings: PlacementSettings) -> str | None:
    """Why this placement cannot work with this config, or None."""
    if settings.backend != "ray":
        return None
    if settings.tensor_parallel_size > 1 and (cfg.engine != "vllm" or not settings.num_gpus):
        return ("placement.tensor_parallel_size > 1 needs engine = \"vllm\" and "
                "placement.num_gpus > 0: its ranks are GPUs")
    if not cfg.worker_bind.startswith("tcp://"):
        return ("placement backend 'ray' needs worker_bind = \"tcp://HOST:PORT\": workers on "
                "other nodes cannot reach the default ipc socket")
    connect = worker_connect(cfg, settings)
    host = urlsplit(connect).hostname or ""
    if not connect.startswith("tcp://") or host in ("", "0.0.0.0", "::", "*"):
        return (f"placement.connect must be tcp://HOST:PORT with a host the Ray nodes reach, "
                f"got {connect!r} (set it when worker_bind listens on every interface)")
    return None


CONNECT_TIMEOUT_S = 10.0  # for the cluster's GCS port to accept a connection


class PlacementError(RuntimeError):
    """The Ray cluster cannot be used; the message says which setting and why."""


def unreachable(address: str) -> str | None:
    """Why nothing answers at a HOST:PORT Ray address, or None: ray.init would retry a dead
    one for ever, in a thread nothing can stop. ("auto" and ray:// are Ray's to check.)
    Blocking: `agentd start` asks before it serves, the placement from a thread."""
    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not port.isdigit():
        return None
    try:
        socket.create_connection((host, int(port)), CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return f"placement.address {address}: no Ray cluster answers there ({exc})"
    return None


def check_at_start(cfg: Config) -> None:
    """PlacementError when the configured Ray cluster does not answer: `agentd start` says
    so in one line before it serves, instead of failing in its startup."""
    settings = parse(cfg.placement)
    if settings.backend == "ray" and (problem := unreachable(ray_address(settings))):
        raise PlacementError(problem)
