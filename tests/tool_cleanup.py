"""Remove what a test daemon left on the Docker engine. A daemon's stop keeps prepared
environments for their programs (by design), so tests end by removing them here, through
the SDK rather than the code under test."""

from __future__ import annotations

import contextlib
from pathlib import Path

import docker


def remove_daemon_tools(data_dir: Path) -> int:
    """Containers and volumes labelled with the daemon id of `data_dir`; returns the count."""
    path = data_dir / "daemon_id"
    if not path.exists():
        return 0
    mine = {"label": [f"agentd.daemon_id={path.read_text().strip()}"]}
    client = docker.from_env(timeout=60)
    removed = 0
    try:
        for container in client.containers.list(all=True, filters=mine):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True, v=True)
                removed += 1
        for volume in client.volumes.list(filters=mine):
            with contextlib.suppress(docker.errors.NotFound):
                volume.remove(force=True)
                removed += 1
    finally:
        client.close()
    return removed
