"""Where the daemon's own engine workers run: the `[placement]` table of the config.

`backend = "local"` (the default): child processes of the daemon, kept running by the
local supervisor (daemon/workers/supervisor.py). `backend = "ray"`: Ray actors on the
nodes of a Ray cluster, restarted by Ray (daemon/workers/ray_placement.py); they talk to
the daemon over the same ZeroMQ worker protocol, on TCP, authenticated with the worker key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from daemon.config import Config
from daemon.workers.placement_settings import parse, worker_connect


class Placement(Protocol):
    """What the daemon asks of a placement backend."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def make(cfg: Config, endpoint: str, key: str, on_event: Callable[..., None]) -> Placement:
    settings = parse(cfg.placement)
    if settings.backend == "ray":
        from daemon.workers.ray_placement import RayPlacement

        return RayPlacement(cfg, settings, worker_connect(cfg, settings), key, on_event)
    from daemon.workers.supervisor import Supervisor

    return Supervisor(cfg, endpoint, on_event=on_event)
