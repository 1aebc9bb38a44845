"""The Ray actor that is one of the daemon's engine workers, on whichever node Ray picked.

It runs `agentd worker --connect tcp://…` (the same runtime an operator starts by hand) as
its child process and lives exactly as long as that process: when the worker exits on its
own (its engine died, it was killed) the actor process exits too, which Ray counts as an
actor failure and restarts within `max_restarts`; when the actor or its node dies, the
worker gets SIGTERM from the kernel (the parent-death signal of daemon/workers/local.py),
so no worker outlives its actor. The worker key arrives as an argument and is written to
a file only its owner can read, in a directory removed when the actor stops.

A tensor-parallel worker's ranks are the bundles of its placement group, all on one node:
the actor holds bundle 0 and a `RankHolder` actor holds each other bundle; the worker sees
the GPUs Ray gave all of them (CUDA_VISIBLE_DEVICES), asked again at every (re)start,
since a placement group moved to another node after a failure holds other GPUs there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import ray

from daemon.workers.local import DAEMON_PID_ENV

STOP_WAIT_S = 10.0


def node_name(node_id: str) -> str:
    """The Ray node's name (`ray start --node-name`; Ray's default is the node's IP)."""
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if node.get("NodeID") == node_id:
            return str(node.get("NodeName") or node_id)
    return node_id


class RankHolder:
    """Holds one bundle of a tensor-parallel worker's placement group; says its GPUs."""

    def gpus(self) -> list[str]:
        return own_gpus()


def own_gpus() -> list[str]:
    return [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]


def visible_gpus(rank_holders: list[Any]) -> list[str]:
    """The GPUs of every rank of the worker: the caller's own, then each holder's."""
    others = ray.get([holder.gpus.remote() for holder in rank_holders])
    return [*own_gpus(), *(g for gpus in others for g in gpus)]


class EngineWorkerActor:
    """Plain class; ray_placement.py wraps it with `ray.remote` and the options it needs."""

    def __init__(self, worker_args: list[str], key: str,
                 rank_holders: list[Any] | None = None) -> None:
        self.node_id = ray.get_runtime_context().get_node_id()
        self.node = node_name(self.node_id)
        self._env = {"PYTHONUNBUFFERED": "1", DAEMON_PID_ENV: str(os.getpid())}
        if rank_holders:
            self._env["CUDA_VISIBLE_DEVICES"] = ",".join(visible_gpus(rank_holders))
        self._dir = tempfile.mkdtemp(prefix="agentd-worker-")
        key_file = Path(self._dir) / "worker.key"
        key_file.touch(mode=0o600)
        key_file.write_text(key)
        self._cmd = [sys.executable, "-m", "daemon.commands.cli", "worker", *worker_args,
                     "--key-file", str(key_file), "--node", self.node]
        self._stopping = False
        self._proc: subprocess.Popen[bytes] | None = None
        started = threading.Event()
        # The thread that starts the worker waits on it: the parent-death signal fires when
        # the thread that forked ends, so it must live exactly as long as the worker.
        threading.Thread(target=self._run, args=(started,), daemon=True,
                         name="agentd-worker").start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        self._proc = subprocess.Popen(self._cmd, env={**os.environ, **self._env})
        started.set()
        code = self._proc.wait()
        if not self._stopping:
            # Unasked for: end the actor so that Ray restarts it (a clean exit would not
            # count as a failure, and the worker would be gone for good).
            shutil.rmtree(self._dir, ignore_errors=True)
            os._exit(code or 1)

    def where(self) -> dict[str, Any]:
        """Where it runs, for the daemon's trace."""
        return {"node": self.node, "ray_node_id": self.node_id,
                "pid": self._proc.pid if self._proc else 0,
                "gpus": self._env.get("CUDA_VISIBLE_DEVICES", ",".join(own_gpus()))}

    def stop(self) -> int | None:
        """Stop the worker as `agentd stop` would (SIGTERM), then kill it after a wait."""
        self._stopping = True
        code = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                code = self._proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                code = self._proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)
        return code
