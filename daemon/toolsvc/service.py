"""Tool environments owned by programs, wired into the daemon.

Programs acquire environments on first use or declare them up front (configured tool
names, their workflow bundle's tool names, or spec objects sent with the request). A
declared environment starts preparing when its program is admitted or comes within
`PREPARE_AHEAD` places of the head of the global waiting queue (in the KV policy's restore
order), so setup overlaps the wait and the program's first tool call waits only for what
is left. When a program ends, everything it holds is removed. At start, and every sweep
interval, the daemon reclaims resources labelled with its id whose program is not live.

Every tool call's start and end also go to the KV layer (`core.kv.tool_started` /
`tool_ended`): a program whose tool agentd runs is ACTING from the tool's start, and
its measured tool time is what the KV policy predicts from.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric

from daemon.config import Config
from daemon.core.core import Core
from daemon.state import ProgramState, ProgramStatus
from daemon.toolsvc import metrics as tool_metrics
from scheduling.kv.plan import restore_order
from scheduling.kv.view import WAITING, ProgramView
from tools import (
    DockerHosts,
    ProcessBackend,
    SpecError,
    ToolError,
    ToolManager,
    ToolSpec,
    merge_spec,
    parse_spec,
    parse_table,
)
from tools.spec import parse_pools

log = logging.getLogger("agentd.tools")

SWEEP_INTERVAL_S = 60.0
PREPARE_SCAN_S = 0.25
# Enough to hide setup for the next admissions; few enough that a long queue does not
# start one container per waiting program at once.
PREPARE_AHEAD = 16
USAGE_MAX_AGE_S = 5.0
_LIVE = {"QUEUED", "REASONING", "ACTING", "PAUSED"}
_ADMITTED = (ProgramStatus.REASONING, ProgramStatus.ACTING)

Declaration = str | Mapping[str, Any]


def daemon_id(data_dir: Path) -> str:
    """A stable id for this daemon's data dir: its labels survive restarts."""
    path = data_dir / "daemon_id"
    if not path.exists():
        path.write_text(f"agentd-{uuid.uuid4().hex[:12]}\n")
    return path.read_text().strip()


def catalog(cfg: Config) -> dict[str, ToolSpec]:
    """The configured tools; `config.validate` already refused any that do not parse."""
    return {name: parse_table(name, raw, trusted=True) for name, raw in cfg.tools.items()}


def queue_head(programs: Iterable[ProgramView], n: int) -> set[str]:
    """The first `n` waiting programs, in the order the KV policy restores them."""
    waiting = sorted((p for p in programs if p.status in WAITING), key=restore_order)
    return {p.program_id for p in waiting[:n]}


@dataclass
class _Declared:
    specs: dict[str, ToolSpec] = field(default_factory=dict)
    started: set[str] = field(default_factory=set)

    @property
    def pending(self) -> bool:
        return any(name not in self.started for name in self.specs)


class ToolService:
    def __init__(self, core: Core, cfg: Config) -> None:
        self.core = core
        self.manager = ToolManager(
            daemon_id(cfg.data_path),
            {"docker": DockerHosts(parse_pools(cfg.tool_pools)),
             "process": ProcessBackend(cfg.data_path / "tools")},
            catalog=catalog(cfg),
            on_event=self._on_event,
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self._declared: dict[str, _Declared] = {}
        # Tools of a run's workflow bundle, by the run's program id (see bundle_tools.py).
        self._bundles: dict[str, dict[str, ToolSpec]] = {}
        self._scan_soon = False
        self._usage: dict[str, Any] | None = None
        self._usage_at: float | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self._remove_collector = core.metrics.add(self._collect)
        core.on_program_end.append(self._program_ended)
        core.on_program_waiting.append(self._program_waiting)

    async def start(self) -> None:
        await self._reconcile("start")
        self._refresh_usage()
        self._spawn(self._sweep_loop())
        self._spawn(self._prepare_loop())

    async def stop(self) -> None:
        self._remove_collector()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.manager.close()

    # -- specs: configured, declared, per request ----------------------------------------

    def bind_bundle(self, program_id: str, specs: Mapping[str, ToolSpec]) -> None:
        """Make a bundle's tools visible to a run's program and its per-agent programs,
        until the run's program ends."""
        if specs:
            self._bundles[program_id] = dict(specs)

    def scope(self, program_id: str) -> Mapping[str, ToolSpec]:
        """The bundle tools a program sees: its run's (per-agent programs are
        `<run program>.<agent>.<i>`)."""
        found = self._bundles.get(program_id)
        if found is None and "." in program_id:
            found = self._bundles.get(program_id.split(".", 1)[0])
        return found or {}

    def named(self, program_id: str, tool: str) -> ToolSpec | None:
        """A tool by name as the program sees it: its bundle's, else the configured one
        (bundle_tools.py keeps the two sets of names apart)."""
        return self.scope(program_id).get(tool) or self.manager.configured(tool)

    def check_declarations(self, items: Sequence[Declaration],
                           scope: Mapping[str, ToolSpec] | None = None) -> list[ToolSpec]:
        """Specs of a declaration list (tool names and/or spec objects), all or nothing;
        the error names the entry. `scope`: bundle tools the names may also refer to."""
        specs = []
        for index, item in enumerate(items):
            try:
                specs.append(self._declared_spec(item, scope or {}))
            except ToolError as exc:
                raise ToolError(exc.reason, f"tools[{index}]: {exc.message}",
                                tool=exc.tool) from exc
        return specs

    def _declared_spec(self, item: Declaration, scope: Mapping[str, ToolSpec]) -> ToolSpec:
        if isinstance(item, str):
            return scope.get(item) or self.manager.spec_for(item)
        name = item.get("name")
        base = (scope.get(name) or self.manager.configured(name)
                if isinstance(name, str) else None)
        return merge_spec(base, item) if base else parse_spec(item)

    def resolve(
        self, program_id: str, tool: str, overrides: Mapping[str, Any] | None = None
    ) -> ToolSpec | None:
        """The spec an exec uses: the program's declared one, else the configured one, with
        `overrides`; without either, a per-request spec is `overrides` itself. None leaves
        it to the manager (what the program used before)."""
        declared = self._declared.get(program_id)
        base = (declared.specs.get(tool) if declared else None) or self.named(program_id, tool)
        if not overrides:
            return base
        if base is None:
            if overrides.get("name", tool) != tool:
                raise SpecError("name: must match the tool in the path", tool=tool)
            return parse_spec({**overrides, "name": tool})
        return merge_spec(base, overrides)

    def declare(self, program: ProgramState, items: Sequence[Declaration]) -> list[str]:
        """Tools the program will use, prepared ahead of its first call. Declaring a tool
        again replaces its spec only while its preparation has not started."""
        specs = self.check_declarations(items, self.scope(program.id))
        declared = self._declared.setdefault(program.id, _Declared())
        for spec in specs:
            if spec.name not in declared.started:
                declared.specs[spec.name] = spec
        self._schedule_scan()
        return list(declared.specs)

    # -- asynchronous preparation ----------------------------------------------------------

    def _program_waiting(self, program: ProgramState) -> None:
        declared = self._declared.get(program.id)
        if declared is not None and declared.pending:
            self._schedule_scan()

    def _schedule_scan(self) -> None:
        # Coalesced: a burst of submissions costs one scan, after the core has queued them.
        if not self._scan_soon:
            self._scan_soon = True
            asyncio.get_running_loop().call_soon(self._scan)

    async def _prepare_loop(self) -> None:
        # Admissions and restores have no hook; polling catches programs moving up the queue.
        while True:
            await asyncio.sleep(PREPARE_SCAN_S)
            try:
                self._scan()
            except Exception:  # a bad scan must not end preparation for good
                log.exception("scanning for environments to prepare failed")

    def _scan(self) -> None:
        self._scan_soon = False
        pending = [pid for pid, d in self._declared.items() if d.pending]
        if not pending:
            return
        head = self._queue_head()
        for pid in pending:
            program = self.core.programs.get(pid)
            if program is not None and (program.status in _ADMITTED or pid in head):
                self._prepare(pid, self._declared[pid])

    def _queue_head(self) -> set[str]:
        return queue_head(self.core.kv.view().programs, PREPARE_AHEAD)

    def _prepare(self, program_id: str, declared: _Declared) -> None:
        for name, spec in declared.specs.items():
            if name in declared.started:
                continue
            declared.started.add(name)  # a failure is reported by events, not retried here
            try:
                self.manager.prepare(program_id, spec)
            except ToolError as exc:
                log.warning("cannot prepare %s for %s: %s", name, program_id, exc)

    # -- ending and reconciling ------------------------------------------------------------

    def _program_ended(self, program: ProgramState) -> None:
        self._declared.pop(program.id, None)
        self._bundles.pop(program.id, None)
        # Most programs never touch a tool; asking every backend about them would cost a
        # Docker round trip per request. Leftovers of earlier runs go in the sweep.
        if self.manager.holds(program.id):
            self._spawn(self.manager.release_program(program.id))

    async def live_programs(self) -> set[str]:
        await self.core.writer.flush()
        live = await self.core.live_program_ids()
        return live | {p.id for p in self.core.programs.values() if p.status.value in _LIVE}

    async def _reconcile(self, why: str) -> None:
        # A failed sweep must not stop the daemon or the next sweep; it is retried then.
        try:
            done = await self.manager.reconcile(self.live_programs)
        except Exception:
            log.exception("tool reconciliation (%s) failed", why)
            return
        if done:
            log.info("reclaimed %d tool resources of ended programs (%s)", len(done), why)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            await self._reconcile("sweep")

    # -- observing -------------------------------------------------------------------------

    def program_tools(self, program_id: str) -> dict[str, Any]:
        """What a program declared, the bundle tools it sees, and its tool timing as the
        KV layer sees it (None when the KV layer does not hold it: ended, or held)."""
        declared = self._declared.get(program_id) or _Declared()
        return {"program_id": program_id, "declared": sorted(declared.specs),
                "preparing": sorted(declared.started),
                "bundle_tools": sorted(self.scope(program_id)), "kv": self._kv_timing(program_id)}

    def _kv_timing(self, program_id: str) -> dict[str, Any] | None:
        try:
            view = self.core.kv.view().program(program_id)
        except KeyError:
            return None
        return {"status": view.status.value, "acting_since": view.acting_since,
                "tool_running": view.tool_running, "tool_last_s": view.tool_last_s,
                "tool_ended_at": view.tool_ended_at, "tool_time_mean_s": view.tool_time_mean_s}

    def _collect(self) -> Iterator[Metric]:
        """`agentd_tool_*` on /metrics. What the engines hold comes from a `df`, which walks
        the disk: it is refreshed in the background when older than USAGE_MAX_AGE_S, and a
        scrape reports the last one."""
        if self._usage_at is None or time.monotonic() - self._usage_at > USAGE_MAX_AGE_S:
            self._refresh_usage()
        return tool_metrics.families(self.manager.counters.snapshot(), self._usage,
                                     self.manager.backends)

    def _refresh_usage(self) -> None:
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.create_task(self._read_usage())
            self._tasks.add(self._refreshing)
            self._refreshing.add_done_callback(self._tasks.discard)

    async def _read_usage(self) -> None:
        try:
            self._usage = await self.manager.usage()
        except Exception:
            log.exception("reading tool resource usage failed")
        self._usage_at = time.monotonic()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_event(self, event: dict[str, Any]) -> None:
        fields = {k: v for k, v in event.items() if k not in ("kind", "at")}
        pid = fields.pop("program_id", None)
        if pid and event["kind"] in ("tool.exec.start", "tool.exec.end"):
            # `at` is the time the KV layer got, so a trace shows exactly what it weighed.
            fields["at"] = event["at"]
            if event["kind"] == "tool.exec.start":
                self.core.kv.tool_started(pid, event["at"])
            else:
                self.core.kv.tool_ended(pid, event["at"])
        program = self.core.programs.get(pid) if pid else None
        if pid and program is None:
            # Reclaiming for a program this run never loaded (an orphan found at start or by
            # a sweep): its session, which the trace is kept by, is in the store.
            self._spawn(self._trace_stored(event["kind"], pid, fields))
            return
        self.core.writer.trace(
            event["kind"], program_id=pid,
            session_id=program.session_id if program else None, **fields,
        )

    async def _trace_stored(self, kind: str, program_id: str, fields: dict[str, Any]) -> None:
        program = await self.core.load_program(program_id)
        self.core.writer.trace(kind, program_id=program_id,
                               session_id=program.session_id if program else None, **fields)
