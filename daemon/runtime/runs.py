"""Runs: one execution of a workflow bundle in a sandbox process, and its controller.

A run owns a program (created through `core.ensure_program`), a run-scoped API token
(scope `submit`, named `run <id>`, bound to the run's programs and session by
`auth.RunScope`, revoked when the run ends), a private working
directory (a temporary directory outside the daemon's data dir holding only the bundle
copy) and one sandbox process (`python -I -m daemon.runtime.sandbox`, see
daemon/runtime/sandbox/entry.py).
The sandbox's environment holds only PATH, LANG, MALLOC_ARENA_MAX and the AGENTD_RUN_*
values below: no data dir, no database URL, no token file path. It also carries what
the run's agents may reserve and wait for (agentd/runtime.py): `AGENTD_GPUS` (the
config's `runtime_gpus`, or the GPUs visible to the daemon, daemon/runtime/gpus.py)
and `AGENTD_RESOURCE_WAIT_S` (`runtime_resource_wait_s`).

When the run ends (result, failure, limit, cancel) the controller revokes its token,
releases its program and every per-agent program the sandbox's LLM calls created
(`<program>.<agent>.<i>`), removes the working directory, and records a trace event.
Runs live in memory while they run, and an ended run for `ENDED_RUN_KEEP_S` (at most
`MAX_ENDED_RUNS` of them), long enough for its pollers, followers and control hooks: a
daemon that kept every run held ~20 KiB per run (its events, its sandbox's process
objects) for ever, most of the soak's memory growth. A finished run's record is also
written to `<data dir>/runs/<id>.json`; once the run has left memory (or after a daemon
restart) the API answers from there and from the trace (daemon/runtime/run_records.py).

What a run hands back is bounded, so neither the daemon's memory nor `GET /v1/runs`
grows with what a run returns or reports: its result is at most the config's
`max_result_bytes` of JSON (the daemon reads at most that from the sandbox, plus
`REPORT_ROOM` for a failure's report, and a run that writes more is killed and fails with
"result too large"), the log tail is read from the log's end, and each event a sandbox
reports is cut to `MAX_EVENT_BYTES`, with at most `RUN_EVENT_BYTES` of them kept in memory
per run (all of them go to the trace). Limits above `DEFAULT_LIMITS` are the operator's to
give: any other caller asking for more gets a 403 naming the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from daemon.access import auth
from daemon.core.core import Core, new_id
from daemon.core.tenants import open_program
from daemon.errors import CoreError
from daemon.runtime import confine, run_records
from daemon.runtime.bundle_tools import INSUFFICIENT_SCOPE
from daemon.runtime.bundles import BundleError, Signature, TenantBundles
from daemon.runtime.gpus import visible_gpus
from daemon.runtime.zygote import BASE_ENV, Forked
from daemon.state import ProgramStatus
from db import models, tokens

log = logging.getLogger("agentd.runs")

DEFAULT_LIMITS: dict[str, float] = {"memory_mb": 1024, "cpu_s": 300, "open_files": 256,
                                    "file_size_mb": 64, "timeout_s": 600,
                                    "processes": 128, "disk_mb": 256}
MAX_LIMITS: dict[str, float] = {"memory_mb": 16384, "cpu_s": 86400, "open_files": 4096,
                                "file_size_mb": 4096, "timeout_s": 86400,
                                "processes": 4096, "disk_mb": 16384}
MIN_MEMORY_MB = 128  # below this the interpreter itself does not start
MAX_EVENTS = 50_000
# A run's events kept in memory for its followers: about MAX_EVENTS of the usual few
# hundred bytes; beyond it they go to the trace only, as beyond MAX_EVENTS.
RUN_EVENT_BYTES = 16 * 1024 * 1024
# One event a sandbox reports, as JSON: its longer texts are cut to EVENT_TEXT_CHARS, and
# an event still larger is refused.
MAX_EVENT_BYTES = 16 * 1024
EVENT_TEXT_CHARS = 2000
LOG_TAIL = 8000
# What the daemon reads from a sandbox beyond max_result_bytes: a failure's report (the
# sandbox cuts its texts to well under this, daemon/runtime/sandbox/entry.py).
REPORT_ROOM = 256 * 1024
_READ_CHUNK = 64 * 1024
# How long a run waits for its jail to reap leftovers (a stuck reap must not hang it).
REAP_WAIT_S = 10.0
ENDED = ("finished", "failed", "cancelled")
ENDED_RUN_KEEP_S = 300.0
MAX_ENDED_RUNS = 256
# what a sandbox may report: its futures, and its local controllers' placements,
# migrations and installed decisions (agentd/instances.py)
SANDBOX_EVENTS = frozenset({
    "future.created", "future.resolved", "future.placed", "future.started", "future.migrated",
    "migration.refused", "control.applied", "instance.provisioned", "instance.killed",
    "instance.dead", "future.waiting", "future.wait_expired"})
# The name of a run's token: runs do not survive a restart, so one still active at start
# belongs to a run of an earlier daemon process (a crash) and is revoked.
RUN_TOKEN_NAME = re.compile(r"run run-[0-9a-f]{16}")


def bounded_event(data: dict[str, Any]) -> dict[str, Any] | None:
    """A sandbox event's data with its long texts cut; None when it is still larger than
    MAX_EVENT_BYTES (a list of a thousand ids, say): such an event is refused."""
    cut = {k: v[:EVENT_TEXT_CHARS] + "..." if isinstance(v, str) and len(v) > EVENT_TEXT_CHARS
           else v for k, v in data.items()}
    return cut if len(json.dumps(cut, default=repr)) <= MAX_EVENT_BYTES else None


async def exchange(proc: confine.Process, spec: bytes, limit: int) -> bytes | None:
    """Send the sandbox its spec, then read its stdout to the end and wait for it to exit:
    what it wrote, or None as soon as it wrote more than `limit` bytes (never holding
    more than `limit` plus one chunk)."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(spec)
    with contextlib.suppress(ConnectionError):  # it ended before reading its spec
        await proc.stdin.drain()
    proc.stdin.close()
    reply = bytearray()
    while chunk := await proc.stdout.read(_READ_CHUNK):
        reply += chunk
        if len(reply) > limit:
            return None
    await proc.wait()
    return bytes(reply)


def _copy_bundle(bundle: Path, work: Path) -> None:
    """The run's working copy of its bundle, without the bundle's manifest."""
    shutil.copytree(bundle, work)
    (work / "manifest.json").unlink(missing_ok=True)


def _log_tail(path: Path) -> str:
    """The end of a sandbox's log, read from the end: the log may be `file_size_mb`."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - 4 * LOG_TAIL))  # UTF-8: at most 4 bytes a character
        return f.read().decode(errors="replace")[-LOG_TAIL:]


@dataclass
class Run:
    id: str
    workflow: str
    version: int
    entry: str
    args: dict[str, Any]
    program_id: str
    session_id: str
    limits: dict[str, float]
    tenant: str  # whose workflow namespace the bundle is from (the run's starter's)
    status: str = "starting"  # starting | running | finished | failed | cancelled
    result: Any = None
    error: dict[str, Any] | None = None
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    pid: int | None = None
    token_id: str | None = None
    log_tail: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    event_bytes: int = 0  # the JSON size of `events`
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    proc: confine.Process | None = None
    task: asyncio.Task[None] | None = None
    workdir: Path | None = None

    def notify(self) -> None:
        """Wake every follower: each waits on the event it saw, which is replaced here."""
        old, self.changed = self.changed, asyncio.Event()
        old.set()

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    def view(self) -> dict[str, Any]:
        duration = None
        if self.started_at is not None:
            duration = (self.finished_at or time.time()) - self.started_at
        return {"id": self.id, "workflow": self.workflow, "version": self.version,
                "entry": self.entry, "args": self.args, "program_id": self.program_id,
                "session_id": self.session_id, "tenant": self.tenant, "status": self.status,
                "result": self.result, "error": self.error, "limits": self.limits,
                "timings": {"created_at": self.created_at, "started_at": self.started_at,
                            "finished_at": self.finished_at, "duration_s": duration},
                "events": len(self.events), "log_tail": self.log_tail}


def check_limits(asked: dict[str, Any] | None, *, operator: bool) -> dict[str, float]:
    """The run's limits: the defaults, with what was asked for. Only an operator may ask
    for more than a default (up to MAX_LIMITS); anyone may ask for less."""
    limits = dict(DEFAULT_LIMITS)
    for key, value in (asked or {}).items():
        if key not in DEFAULT_LIMITS:
            raise BundleError(f"unknown limit '{key}'; known: {', '.join(DEFAULT_LIMITS)}",
                              f"limits.{key}", "bad_limit")
        if not isinstance(value, int | float) or isinstance(value, bool) or not (
                0 < value <= MAX_LIMITS[key]):
            raise BundleError(f"limit '{key}' must be a number in (0, {MAX_LIMITS[key]:g}]",
                              f"limits.{key}", "bad_limit")
        if value > DEFAULT_LIMITS[key] and not operator:
            raise BundleError(f"limit '{key}' may be raised above its default "
                              f"({DEFAULT_LIMITS[key]:g}) by an operator only",
                              f"limits.{key}", INSUFFICIENT_SCOPE)
        limits[key] = value
    if limits["memory_mb"] < MIN_MEMORY_MB:
        raise BundleError(f"limit 'memory_mb' must be at least {MIN_MEMORY_MB}",
                          "limits.memory_mb", "bad_limit")
    return limits


def classify_exit(returncode: int, limits: dict[str, float]) -> str:
    """A reason for a sandbox that ended without writing its result."""
    if returncode < 0:
        sig = -returncode
        if sig == signal.SIGXCPU:
            return f"cpu time limit exceeded ({limits['cpu_s']:g} s)"
        if sig == signal.SIGXFSZ:
            return f"file size limit exceeded ({limits['file_size_mb']:g} MiB)"
        if sig in (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS):
            return (f"process crashed ({signal.Signals(sig).name}); often the memory limit "
                    f"({limits['memory_mb']:g} MiB address space)")
        return f"process killed by {signal.Signals(sig).name}"
    return f"process exited with status {returncode} without a result"


class RunController:
    def __init__(self, core: Core, data_path: Path, base_url: str, auth_enabled: bool,
                 token_auth: auth.TokenAuth | None = None) -> None:
        self.core = core
        self.bundles = TenantBundles(data_path / "workflows")
        self.records = data_path / "runs"
        self.base_url = base_url
        self.auth_enabled = auth_enabled
        self.token_auth = token_auth
        self.runs: dict[str, Run] = {}
        # Called with each run once it has ended and released its programs.
        self.on_end: list[Callable[[Run], None]] = []
        self._state_lock = asyncio.Lock()
        self._gpus: float | None = None
        core.expiry.keep.append(self.owns)

    def owns(self, program_id: str) -> bool:
        """Whether a live run owns the program (its own or an agent's, `<program>.<agent>.<i>`):
        the run ends it, not the idle timeout (daemon/core/expiry.py)."""
        root = program_id.partition(".")[0]
        return any(run.program_id == root and not run.ended for run in self.runs.values())

    async def gpus(self) -> float:
        """The GPUs a run's agents may reserve: configured, else those the daemon sees."""
        if self._gpus is None:
            configured = self.core.config.runtime_gpus
            self._gpus = configured if configured >= 0 else float(
                await asyncio.to_thread(visible_gpus))
        return self._gpus

    async def trim_records(self) -> int:
        """Drop results larger than max_result_bytes from the records of runs that ended
        before there was a cap, so that listing runs never carries one."""
        trimmed = await run_records.trim_results(self.records,
                                                 self.core.config.max_result_bytes)
        if trimmed:
            log.info("dropped results larger than max_result_bytes from %d run record(s)",
                     trimmed)
        return trimmed

    async def revoke_stale_tokens(self) -> int:
        """Revoke the tokens of runs of an earlier daemon process (see RUN_TOKEN_NAME)."""
        now = time.time()
        async with self.core.sessions() as s, s.begin():
            stale = [t for t in await tokens.list_all(s)
                     if t.active and RUN_TOKEN_NAME.fullmatch(t.name)]
            for t in stale:
                await tokens.revoke(s, t.id, now)
        if stale:
            log.info("revoked %d token(s) of runs that did not survive a restart", len(stale))
        return len(stale)

    # --- creating ---------------------------------------------------------------------

    async def create(self, tenant: str, workflow: str, version: int | None,
                     args: dict[str, Any], session_id: str | None,
                     limits: dict[str, Any] | None, *, operator: bool) -> Run:
        """A run of `tenant`'s workflow. The caller has checked that `session_id`, if it
        exists, is the tenant's (daemon/api/tenants.py); `operator`: whether it may raise
        limits above the defaults."""
        manifest = self.bundles.of(tenant).manifest(workflow, version)
        if manifest is None:
            which = f"version {version} of " if version is not None else ""
            raise CoreError(f"unknown workflow: no {which}'{workflow}'", 404, "not_found")
        Signature.from_dict(manifest["signature"]).check(args)
        run_limits = check_limits(limits, operator=operator)
        run_id = new_id("run")
        # A session this creates records the tenant, so the run's requests run as it.
        program = await open_program(self.core, new_id("prog"), session_id, tenant)
        run = Run(id=run_id, workflow=workflow, version=int(manifest["version"]),
                  entry=manifest["entry"], args=args, program_id=program.id,
                  session_id=program.session_id, limits=run_limits, tenant=tenant)
        self.runs[run_id] = run
        # the program and session rows must exist before the sandbox writes state/futures
        await self.core.writer.flush()
        secret = await self._issue_token(run)
        self.trace(run, "run.created", workflow=workflow, version=run.version, entry=run.entry)
        run.task = asyncio.create_task(self._execute(run, secret), name=f"run-{run_id}")
        return run

    def run_of_token(self, token_id: str) -> Run | None:
        """The live run whose sandbox holds this token, if any."""
        return next((r for r in self.runs.values()
                     if r.token_id == token_id and not r.ended), None)

    async def _issue_token(self, run: Run) -> str:
        async with self.core.sessions() as s, s.begin():
            run.token_id, secret = await auth.issue_token(s, f"run {run.id}", {auth.SUBMIT})
        if self.token_auth is not None:
            self.token_auth.bind_run(run.token_id,
                                     auth.RunScope(run.id, run.program_id, run.session_id))
        return secret

    def sandbox_env(self, run: Run, secret: str, gpus: float) -> dict[str, str]:
        return {**BASE_ENV, "AGENTD_RUN_ID": run.id, "AGENTD_PROGRAM_ID": run.program_id,
                "AGENTD_SESSION_ID": run.session_id, "AGENTD_DAEMON_URL": self.base_url,
                "AGENTD_RUN_TOKEN": secret, "AGENTD_GPUS": f"{gpus:g}",
                "AGENTD_RESOURCE_WAIT_S": f"{self.core.config.runtime_resource_wait_s:g}"}

    # --- executing --------------------------------------------------------------------

    async def _execute(self, run: Run, secret: str) -> None:
        root = Path(tempfile.mkdtemp(prefix=f"agentd-{run.id}-"))
        log_path = root / "sandbox.log"
        outcome: dict[str, Any]
        try:
            bundle = self.bundles.of(run.tenant).path(run.workflow, run.version)
            await asyncio.to_thread(_copy_bundle, bundle, root / "work")
            run.workdir = root
            spec = {"entry": run.entry, "args": run.args,
                    "limits": {k: v for k, v in run.limits.items() if k != "timeout_s"},
                    "max_result_bytes": self.core.config.max_result_bytes}
            with await asyncio.to_thread(open, log_path, "wb") as log_file:
                proc, jail = await self._start_sandbox(run, root, log_file, secret)
            run.proc, run.pid = proc, proc.pid
            run.status, run.started_at = "running", time.time()
            self.trace(run, "run.started", pid=proc.pid, limits=run.limits,
                       start="fork" if isinstance(proc, Forked) else "exec")
            reply = await self._reply(run, proc, json.dumps(spec).encode())
            # The jail reaps what the run left behind and traces it; the run ends after that.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(jail.closed.wait(), REAP_WAIT_S)
            if isinstance(reply, bytes):
                outcome = jail.explain(self._outcome(reply, proc.returncode or 0, run))
            else:
                outcome = reply
            run.log_tail = await asyncio.to_thread(_log_tail, log_path)
        except asyncio.CancelledError:
            self._kill(run)
            outcome = {"ok": False, "kind": "cancelled", "reason": "cancelled"}
        except Exception as exc:
            log.exception("run %s could not execute", run.id)
            outcome = {"ok": False, "kind": "system", "reason": f"could not start: {exc}"}
        finally:
            shutil.rmtree(root, ignore_errors=True)
        await self._finish(run, outcome)

    async def _start_sandbox(self, run: Run, root: Path, log_file: IO[bytes], secret: str
                             ) -> tuple[confine.Process, confine.Jail]:
        """The sandbox's start parameters: its kernel-level confinement (a uid of its own,
        pids cgroup, namespaces, Landlock, disk quota or watchdog) is confine.Jail's."""
        box = await confine.confinement(self.core.config, self.base_url)
        jail = confine.Jail(box, run.id, run.limits, lambda kind, **d: self.trace(run, kind, **d))
        env = self.sandbox_env(run, secret, await self.gpus())
        proc = await jail.spawn(root, root / "work", log_file, env)
        return proc, jail

    async def _reply(self, run: Run, proc: confine.Process, spec: bytes
                     ) -> bytes | dict[str, Any]:
        """What the sandbox wrote on its result channel; or, when the daemon had to kill
        it (past its wall-clock limit, or writing more than a result may take), why."""
        cap = self.core.config.max_result_bytes
        try:
            reply = await asyncio.wait_for(exchange(proc, spec, cap + REPORT_ROOM),
                                           run.limits["timeout_s"])
            if reply is not None:
                return reply
            reason = f"result too large: more than the daemon's max_result_bytes ({cap})"
        except TimeoutError:
            reason = f"wall-clock limit exceeded ({run.limits['timeout_s']:g} s)"
        self._kill(run)
        await proc.wait()
        return {"ok": False, "kind": "system", "reason": reason}

    def _outcome(self, stdout: bytes, returncode: int, run: Run) -> dict[str, Any]:
        lines = stdout.strip().splitlines()
        if lines:
            with contextlib.suppress(ValueError):
                data = json.loads(lines[-1])
                if isinstance(data, dict) and "ok" in data:
                    return self._within_cap(data, len(lines[-1]))
        return {"ok": False, "kind": "system", "reason": classify_exit(returncode, run.limits)}

    def _within_cap(self, outcome: dict[str, Any], size: int) -> dict[str, Any]:
        """A result line longer than the cap fails the run: the sandbox replaces such a
        line itself, but the code it runs could write past it (REPORT_ROOM is for
        failures only)."""
        cap = self.core.config.max_result_bytes
        if outcome["ok"] and size > cap:
            return {"ok": False, "kind": "system",
                    "reason": f"result too large: {size} bytes of JSON, over the daemon's "
                              f"max_result_bytes ({cap})"}
        return outcome

    def _kill(self, run: Run) -> None:
        if run.proc is not None and run.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.proc.pid, signal.SIGKILL)

    async def _finish(self, run: Run, outcome: dict[str, Any]) -> None:
        if run.ended:
            return
        run.finished_at = time.time()
        if outcome.get("ok"):
            run.status, run.result = "finished", outcome.get("result")
            self.trace(run, "run.finished", duration_s=run.finished_at - (run.started_at or
                                                                           run.created_at))
        else:
            kind = outcome.get("kind", "system")
            run.status = "cancelled" if kind == "cancelled" else "failed"
            run.error = {"kind": kind, "reason": outcome.get("reason"),
                         **(outcome.get("error") or {})}
            self.trace(run, "run.cancelled" if kind == "cancelled" else "run.failed",
                       error_kind=kind, reason=outcome.get("reason"),
                       agent=run.error.get("agent"), path=run.error.get("path"))
        await self._cleanup(run)
        self._write_record(run)
        run.notify()
        for listener in self.on_end:
            try:
                listener(run)
            except Exception:
                log.exception("a run-end listener failed for run %s", run.id)
        self.retire(time.time())

    def retire(self, now: float) -> None:
        """Let ended runs go: their sandboxes' process objects at once, and the runs
        themselves past ENDED_RUN_KEEP_S or beyond MAX_ENDED_RUNS, oldest first. Checked
        at each run's end: once no run ends any more, at most the cap stay."""
        ended = sorted((r for r in self.runs.values() if r.ended),
                       key=lambda r: r.finished_at or r.created_at)
        excess = len(ended) - MAX_ENDED_RUNS
        for i, run in enumerate(ended):
            run.proc = None  # waited for already; holds its pipes' transports
            if i < excess or now - (run.finished_at or now) > ENDED_RUN_KEEP_S:
                del self.runs[run.id]

    async def _cleanup(self, run: Run) -> None:
        if run.token_id is not None:
            async with self.core.sessions() as s, s.begin():
                await tokens.revoke(s, run.token_id, time.time())
            if self.token_auth is not None:
                self.token_auth.unbind_run(run.token_id)
        ended = (ProgramStatus.STOPPED, ProgramStatus.FAILED)
        prefix = run.program_id + "."
        for pid, program in list(self.core.programs.items()):
            if (pid == run.program_id or pid.startswith(prefix)) and program.status not in ended:
                with contextlib.suppress(CoreError):
                    await self.core.release_program(pid)

    def _write_record(self, run: Run) -> None:
        try:
            self.records.mkdir(parents=True, exist_ok=True)
            (self.records / f"{run.id}.json").write_text(json.dumps(run.view(), default=repr))
        except OSError as exc:
            log.warning("cannot write the record of run %s: %s", run.id, exc)

    async def cancel(self, run: Run) -> None:
        if run.ended:
            return
        if run.task is not None:
            run.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run.task

    async def stop(self) -> None:
        """Daemon shutdown: cancel every live run (kills its sandbox, releases its program)."""
        for run in list(self.runs.values()):
            with contextlib.suppress(Exception):
                await self.cancel(run)

    # --- events and state from the sandbox -----------------------------------------------

    def trace(self, run: Run, kind: str, **data: Any) -> None:
        event = {"kind": kind, "ts": time.time(), "run_id": run.id,
                 "session_id": run.session_id, "program_id": run.program_id, **data}
        size = len(json.dumps(event, default=repr))
        if len(run.events) < MAX_EVENTS and run.event_bytes + size <= RUN_EVENT_BYTES:
            run.events.append(event)
            run.event_bytes += size
        self.core.writer.trace(kind, session_id=run.session_id, program_id=run.program_id,
                               run_id=run.id, **data)
        run.notify()

    def sandbox_events(self, run: Run, events: list[dict[str, Any]]) -> int:
        taken = 0
        for e in events:
            kind = str(e.get("event", ""))
            if kind not in SANDBOX_EVENTS:
                continue
            data = bounded_event({k: v for k, v in e.items()
                                  if k not in ("event", "ts", "kind", "session_id",
                                               "program_id", "run_id")})
            if data is None:
                continue
            self.trace(run, kind, **data)
            if kind in ("future.created", "future.resolved"):
                self._future_row(run, kind, data)
            elif kind in ("future.placed", "future.migrated") and data.get("id"):
                where = data.get("instance") or data.get("destination")
                self.core.writer.update("futures", f"{run.id}:{data['id']}", executor=where)
            taken += 1
        return taken

    def _future_row(self, run: Run, kind: str, d: dict[str, Any]) -> None:
        fid = f"{run.id}:{d.get('id')}"
        if kind == "future.created":
            self.core.writer.insert("futures", {
                "id": fid, "program_id": run.program_id, "session_id": run.session_id,
                "kind": str(d.get("kind", "agent"))[:16], "status": "pending",
                "creator": d.get("creator"), "executor": None, "consumers": [],
                "dependencies": d.get("dependencies") or [], "value": None, "error": None,
                "created_at": time.time(), "started_at": None, "finished_at": None})
        else:
            self.core.writer.update("futures", fid, status=str(d.get("status"))[:16],
                                    executor=d.get("executor"),
                                    consumers=d.get("consumers") or [], error=d.get("error"),
                                    started_at=d.get("started_at"),
                                    finished_at=d.get("finished_at"))

    async def load_state(self, run: Run) -> dict[str, Any]:
        await self.core.writer.flush()
        async with self.core.sessions() as s:
            row = await s.get(models.Session, run.session_id)
            return dict(row.state or {}) if row is not None else {}

    async def save_state(self, run: Run, name: str, value: Any) -> None:
        async with self._state_lock, self.core.sessions() as s, s.begin():
            row = await s.get(models.Session, run.session_id)
            if row is None:
                raise CoreError(f"session '{run.session_id}' is not stored yet", 409,
                                "session_missing")
            row.state = {**(row.state or {}), name: value}
        self.core.writer.trace("state.saved", session_id=run.session_id,
                               program_id=run.program_id, run_id=run.id, name=name)

    async def follow(self, run: Run) -> AsyncIterator[dict[str, Any]]:
        """The run's events so far, then new ones until it ends."""
        sent = 0
        while True:
            changed = run.changed
            while sent < len(run.events):
                yield run.events[sent]
                sent += 1
            if run.ended:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), 15)
