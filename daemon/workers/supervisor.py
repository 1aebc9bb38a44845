"""Spawns and supervises the daemon's local engine workers.

Each local worker is a child process running `agentd worker`; a worker that
exits unexpectedly is restarted with exponential backoff, and each crash and
restart is a trace event, so `/v1/workers` and the trace show what happened.
Workers die with the daemon, and the ones a killed daemon left running anyway
are stopped at the next start (daemon/workers/local.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

from daemon.config import Config
from daemon.workers import local as local_workers
from daemon.workers.key import key_path

log = logging.getLogger("agentd.supervisor")

MAX_BACKOFF_S = 30.0
STABLE_AFTER_S = 60.0


def worker_command(cfg: Config, endpoint: str, worker_id: str) -> list[str]:
    # The path, not the key: a command line is visible to every user of the host.
    return [sys.executable, "-m", "daemon.commands.cli", "worker",
            *worker_args(cfg, endpoint, worker_id),
            "--key-file", str(key_path(cfg.config_path))]


def worker_args(cfg: Config, endpoint: str, worker_id: str) -> list[str]:
    """`agentd worker`'s arguments for one of the daemon's own workers, but its key file
    (which its placer provides: a local path, or one on the Ray node)."""
    cmd = ["--engine", cfg.engine, "--connect", endpoint, "--worker-id", worker_id,
           "--log-level", cfg.log_level]
    if cfg.engine == "sim":
        cmd += ["--kv-tokens", str(cfg.sim_kv_tokens), "--time-scale", str(cfg.sim_time_scale)]
        if cfg.sim_cost_model:
            cmd += ["--cost-model", cfg.sim_cost_model]
        if cfg.model:
            cmd += ["--model", cfg.model]
    else:
        cmd += ["--kv-cache-bytes", str(cfg.vllm_kv_cache_bytes),
                "--max-model-len", str(cfg.vllm_max_model_len), "--dtype", cfg.vllm_dtype,
                "--block-size", str(cfg.vllm_block_size)]
        if cfg.vllm_kv_offload_bytes:
            cmd += ["--kv-offload-bytes", str(cfg.vllm_kv_offload_bytes)]
        if cfg.vllm_cuda_graphs:
            cmd.append("--no-enforce-eager")
        if cfg.vllm_tool_call_parser:
            cmd += ["--tool-call-parser", cfg.vllm_tool_call_parser]
        if cfg.vllm_chat_template:
            cmd += ["--chat-template", cfg.vllm_chat_template]
        if cfg.model:
            cmd += ["--model", cfg.model]
    return cmd


class Supervisor:
    def __init__(self, cfg: Config, endpoint: str, on_event: Callable[..., None]) -> None:
        self.cfg = cfg
        self.endpoint = endpoint
        self.on_event = on_event
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.restarts: dict[str, int] = {}
        self._record_path = cfg.data_path / local_workers.RECORD_FILE
        self._running: dict[str, local_workers.LocalWorker] = {}
        self._record_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    async def start(self) -> None:
        await local_workers.reap_stale(self._record_path, self.on_event)
        for i in range(self.cfg.workers):
            worker_id = f"local-{self.cfg.engine}-{i}"
            self._tasks.append(asyncio.create_task(self._keep_running(worker_id)))

    async def _keep_running(self, worker_id: str) -> None:
        backoff = 0.5
        while not self._stopping:
            proc = await asyncio.create_subprocess_exec(
                *worker_command(self.cfg, self.endpoint, worker_id),
                env={**os.environ, "PYTHONUNBUFFERED": "1",
                     local_workers.DAEMON_PID_ENV: str(os.getpid())},
            )
            self.procs[worker_id] = proc
            await self._record(worker_id, proc.pid)
            self.on_event("worker.process.started", worker_id=worker_id, pid=proc.pid)
            started = time.monotonic()
            code = await proc.wait()
            if self._stopping:
                return
            self.restarts[worker_id] = self.restarts.get(worker_id, 0) + 1
            log.warning("worker %s exited with %s; restarting in %.1fs", worker_id, code, backoff)
            self.on_event("worker.process.exited", worker_id=worker_id, exit_code=code,
                          restart_in_s=backoff)
            await asyncio.sleep(backoff)
            # A worker that ran a while before dying gets a quick restart again.
            ran_long = time.monotonic() - started > STABLE_AFTER_S
            backoff = 0.5 if ran_long else min(backoff * 2, MAX_BACKOFF_S)

    async def _record(self, worker_id: str, pid: int) -> None:
        """Write down the pids of the running workers, for the reaper of the next start."""
        async with self._record_lock:  # written in turn: a later record is never overwritten
            worker = await asyncio.to_thread(local_workers.describe, worker_id, pid)
            if worker is None:
                self._running.pop(worker_id, None)
            else:
                self._running[worker_id] = worker
            await asyncio.to_thread(local_workers.write_record, self._record_path,
                                    list(self._running.values()))

    async def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping = True
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                await asyncio.wait_for(proc.wait(), timeout_s)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.to_thread(self._record_path.unlink, missing_ok=True)
