"""Program-aware lifecycle of tool environments (ThunderAgent §4.4).

A program's environments are prepared in the background as soon as the tool is known
(declared up front, or by the scheduler ahead of a restore), so the slow part, a container
start and its setup steps, overlaps the program's reasoning; the first `exec` waits only
for what is left. When the program ends, `release_program` removes everything it held.

Events go to `on_event` as small dicts (`kind` is one of `tool.prepare.start`,
`tool.prepare.end`, `tool.exec.start`, `tool.exec.end`, `tool.release`); the daemon turns
them into trace events. All state is per (program_id, tool) slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tools import reclaim
from tools.base import Backend, Environment, ExecResult, OutputListener, Owner, as_argv
from tools.errors import Reason, ToolError
from tools.metrics import ToolMetrics
from tools.spec import ToolSpec

_RELEASED_MEMORY = 10_000  # released program ids remembered, to refuse late acquisitions


@dataclass
class _Slot:
    spec: ToolSpec
    task: asyncio.Task[Environment]


def _tag(exc: ToolError, program_id: str, tool: str) -> ToolError:
    exc.program_id, exc.tool = exc.program_id or program_id, exc.tool or tool
    return exc


def _retrieve(task: asyncio.Task[Environment]) -> None:
    # A preparation nobody waited for may fail; that is reported by events, not by asyncio.
    if not task.cancelled():
        task.exception()


class ToolManager:
    def __init__(
        self,
        daemon_id: str,
        backends: Mapping[str, Backend],
        *,
        catalog: Mapping[str, ToolSpec] | None = None,
        on_event: reclaim.EventSink | None = None,
    ) -> None:
        """`backends` by kind ("docker", "process"); `catalog`: configured tools by name."""
        self.daemon_id = daemon_id
        self._backends = dict(backends)
        self._catalog = dict(catalog or {})
        self._on_event = on_event
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._specs: dict[tuple[str, str], ToolSpec] = {}
        self._released: OrderedDict[str, None] = OrderedDict()
        self._exec_ids = itertools.count(1)
        self.counters = ToolMetrics()

    @property
    def backends(self) -> list[str]:
        return list(self._backends)

    # -- acquiring ----------------------------------------------------------------------

    def holds(self, program_id: str) -> bool:
        """Whether this daemon run prepared anything for the program."""
        return any(key[0] == program_id for key in self._specs)

    def configured(self, tool: str) -> ToolSpec | None:
        return self._catalog.get(tool)

    @property
    def configured_names(self) -> frozenset[str]:
        return frozenset(self._catalog)

    def spec_for(self, tool: str) -> ToolSpec:
        """The configured spec of a tool."""
        if tool not in self._catalog:
            raise ToolError(Reason.UNKNOWN_TOOL, f"no tool named {tool!r} is configured", tool=tool)
        return self._catalog[tool]

    def prepare(self, program_id: str, spec: ToolSpec) -> asyncio.Task[Environment]:
        """Start preparing in the background and return at once. Idempotent per
        (program, tool): a second call returns the preparation already under way."""
        key = (program_id, spec.name)
        if key in self._slots:
            return self._slots[key].task
        self._refuse_released(program_id, spec.name)
        backend = self._backend(spec)
        owner = Owner(self.daemon_id, program_id, spec.name)
        task = asyncio.create_task(self._prepare(backend, owner, spec))
        task.add_done_callback(_retrieve)
        self._slots[key] = _Slot(spec, task)
        self._specs[key] = spec
        return task

    async def acquire(
        self, program_id: str, tool: str, spec: ToolSpec | None = None
    ) -> Environment:
        """The program's environment for `tool`, preparing it now if nobody did earlier.
        Without `spec`: the one this program used before, else the configured one."""
        key = (program_id, tool)
        self._refuse_released(program_id, tool)
        slot = self._slots.get(key)
        if slot is not None:
            task = slot.task
        else:
            # Remembered, so a dead or failed environment is rebuilt the same way without
            # the caller restating its spec.
            task = self.prepare(program_id, spec or self._specs.get(key) or self.spec_for(tool))
        try:
            # Shielded: a caller giving up must not cancel a preparation others may share.
            return await asyncio.shield(task)
        except ToolError:
            self._forget(program_id, tool, task)  # the next call starts afresh
            raise
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and not (current and current.cancelling()):
                raise ToolError(
                    Reason.RELEASED,
                    "program was released while preparing",
                    program_id=program_id,
                    tool=tool,
                ) from None
            raise

    def _refuse_released(self, program_id: str, tool: str) -> None:
        if program_id in self._released:
            raise ToolError(
                Reason.RELEASED, "program was released", program_id=program_id, tool=tool
            )

    def _backend(self, spec: ToolSpec) -> Backend:
        if spec.backend not in self._backends:
            raise ToolError(
                Reason.BAD_SPEC, f"backend {spec.backend!r} is not enabled", tool=spec.name
            )
        return self._backends[spec.backend]

    def _forget(self, program_id: str, tool: str, task: asyncio.Task[Environment]) -> None:
        slot = self._slots.get((program_id, tool))
        if slot is not None and slot.task is task:
            del self._slots[(program_id, tool)]

    async def _prepare(self, backend: Backend, owner: Owner, spec: ToolSpec) -> Environment:
        base = {"program_id": owner.program_id, "tool": spec.name, "backend": backend.kind}
        reclaim.emit(self._on_event, "tool.prepare.start", **base)
        start = time.monotonic()
        try:
            env = await self._create_and_setup(backend, owner, spec)
        except asyncio.CancelledError:
            self._finish_prepare(base, start, None, Reason.RELEASED, None)
            raise
        except Exception as exc:
            error = exc if isinstance(exc, ToolError) else ToolError(Reason.ENGINE_ERROR, repr(exc))
            self._finish_prepare(base, start, None, error.reason, error)
            raise _tag(error, owner.program_id, spec.name) from exc
        self._finish_prepare(base, start, env.id, Reason.OK, None)
        return env

    def _finish_prepare(
        self,
        base: dict[str, Any],
        start: float,
        env_id: str | None,
        reason: Reason,
        exc: ToolError | None,
    ) -> None:
        duration = time.monotonic() - start
        self.counters.prepares[str(reason)] += 1
        self.counters.prepare_seconds.observe(duration)
        reclaim.emit(
            self._on_event,
            "tool.prepare.end",
            **base,
            container_id=env_id,
            duration_s=duration,
            ok=reason is Reason.OK,
            reason=str(reason),
            error=exc.to_dict() if exc else None,
        )

    async def _create_and_setup(
        self, backend: Backend, owner: Owner, spec: ToolSpec
    ) -> Environment:
        # The creation itself is shielded: cancelled mid-way, it still finishes in its thread,
        # and only then can what it made be found and removed.
        create = asyncio.ensure_future(backend.create(owner, spec))
        try:
            env = await asyncio.shield(create)
            await self._run_setup(backend, env)
            return env
        except BaseException:
            with contextlib.suppress(BaseException):
                await create
            await self._reclaim(backend, owner.program_id, spec.name, "prepare failed")
            raise

    async def _run_setup(self, backend: Backend, env: Environment) -> None:
        deadline = time.monotonic() + env.spec.setup_timeout_s
        for index, step in enumerate(env.spec.setup):
            left = max(deadline - time.monotonic(), 0.001)
            result = await backend.exec(env, as_argv(step), left)
            if not result.ok:
                raise ToolError(
                    Reason.SETUP_FAILED,
                    f"setup step {index} ({step!r}) failed: {result.reason} {result.detail}",
                    exit_code=result.exit_code,
                    stderr=result.stderr or result.stdout,
                )

    # -- using --------------------------------------------------------------------------

    async def exec(
        self,
        program_id: str,
        tool: str,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        spec: ToolSpec | None = None,
        on_output: OutputListener | None = None,
    ) -> ExecResult:
        """Run a command in the program's `tool` environment. A string is a shell line.
        A non-zero exit, a timeout or an OOM kill is a result; a broken environment raises.
        `on_output` hears the output as it arrives."""
        exec_id = next(self._exec_ids)
        base = {"program_id": program_id, "tool": tool, "exec_id": exec_id}
        reclaim.emit(self._on_event, "tool.exec.start", **base)
        start = time.monotonic()
        try:
            env = await self.acquire(program_id, tool, spec)
            waited = time.monotonic() - start
            self.counters.exec_wait_seconds.observe(waited)
            argv = as_argv(command, env.spec.command)
            backend = self._backends[env.backend]
            result = await backend.exec(env, argv, timeout_s or env.spec.exec_timeout_s,
                                        on_output)
        except ToolError as exc:
            _tag(exc, program_id, tool)
            self.counters.execs[str(exc.reason)] += 1
            reclaim.emit(
                self._on_event,
                "tool.exec.end",
                **base,
                ok=False,
                reason=str(exc.reason),
                exit_code=exc.exit_code,
                duration_s=time.monotonic() - start,
                error=exc.to_dict(),
            )
            if exc.reason is Reason.DEAD:
                await self._drop_dead(program_id, tool)
            raise
        except asyncio.CancelledError:
            # The caller went away (a client disconnect): every start still gets its end,
            # or whoever tracks running tools would think this one runs forever.
            reclaim.emit(self._on_event, "tool.exec.end", **base, ok=False, reason="cancelled",
                    exit_code=None, duration_s=time.monotonic() - start)
            raise
        self.counters.execs[str(result.reason)] += 1
        self.counters.exec_seconds.observe(result.duration_s)
        reclaim.emit(
            self._on_event,
            "tool.exec.end",
            **base,
            ok=result.ok,
            reason=str(result.reason),
            exit_code=result.exit_code,
            duration_s=result.duration_s,
            waited_s=waited,
            container_id=env.id,
            stderr_tail=result.stderr[-500:],
        )
        return result

    async def _drop_dead(self, program_id: str, tool: str) -> None:
        """A dead environment is removed, so the program's next call gets a fresh one."""
        slot = self._slots.pop((program_id, tool), None)
        if slot is not None:
            await self._reclaim(self._backend(slot.spec), program_id, tool, "dead")

    async def put_file(
        self, program_id: str, tool: str, path: str, data: bytes, mode: int = 0o644
    ) -> None:
        env = await self.acquire(program_id, tool)
        await self._backends[env.backend].put_file(env, path, data, mode)

    async def get_file(self, program_id: str, tool: str, path: str) -> bytes:
        env = await self.acquire(program_id, tool)
        return await self._backends[env.backend].get_file(env, path)

    # -- releasing ----------------------------------------------------------------------

    async def release_program(self, program_id: str) -> list[dict[str, Any]]:
        """Remove every container, volume and directory the program holds, including ones
        a previous daemon run left (found by label). Returns one dict per thing removed."""
        self._released[program_id] = None
        while len(self._released) > _RELEASED_MEMORY:
            self._released.popitem(last=False)
        slots = [self._slots.pop(k) for k in [k for k in self._slots if k[0] == program_id]]
        self._forget_specs({program_id})
        for slot in slots:
            slot.task.cancel()
        await asyncio.gather(*(s.task for s in slots), return_exceptions=True)
        removed = []
        for backend in self._backends.values():
            removed += await self._reclaim(backend, program_id, None, "release")
        return removed

    async def _reclaim(
        self, backend: Backend, program_id: str, tool: str | None, why: str
    ) -> list[dict[str, Any]]:
        try:
            found = await backend.resources(self.daemon_id, program_id)
        except ToolError as exc:
            reclaim.emit(
                self._on_event,
                "tool.release",
                program_id=program_id,
                tool=tool,
                backend=backend.kind,
                ok=False,
                error=exc.to_dict(),
                why=why,
            )
            return []
        mine = [r for r in found if tool is None or r.owner.tool == tool]
        done = await reclaim.reclaim(backend, mine, self._on_event, why)
        self.counters.releases.update(d["resource"] for d in done if d["ok"])
        return done

    async def reconcile(
        self, live_programs: reclaim.LivePrograms, *, dry_run: bool = False
    ) -> list[dict[str, Any]]:
        """Reclaim this daemon's resources whose program is not live; see `tools.reclaim`."""
        done = await reclaim.reconcile(
            self.daemon_id,
            list(self._backends.values()),
            live_programs,
            dry_run=dry_run,
            on_event=self._on_event,
        )
        if not dry_run:
            gone = {d["program_id"] for d in done if d["ok"]}
            for key in [k for k in self._slots if k[0] in gone]:
                self._slots.pop(key).task.cancel()
            self._forget_specs(gone)
            self.counters.releases.update(d["resource"] for d in done if d["ok"])
        return done

    def _forget_specs(self, program_ids: set[str]) -> None:
        for key in [k for k in self._specs if k[0] in program_ids]:
            del self._specs[key]

    async def close(self) -> None:
        """Stop preparations in flight (removing what they built); prepared environments stay
        for their programs' release or the next reconciliation."""
        tasks = [s.task for s in self._slots.values() if not s.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- observing ----------------------------------------------------------------------

    async def list(
        self, program_id: str | None = None, *, sizes: bool = True
    ) -> list[dict[str, Any]]:
        """Every resource this daemon (or one program) holds, with owner, state, disk bytes
        and age. A backend that cannot be reached is reported as one entry, not raised."""
        now, rows = time.time(), []
        for kind, backend in self._backends.items():
            try:
                found = await backend.resources(self.daemon_id, program_id, sizes=sizes)
            except ToolError as exc:
                rows.append({"backend": kind, "resource": "error", "error": exc.to_dict()})
                continue
            rows += [r.to_dict() | {"age_s": max(now - r.created_at, 0.0)} for r in found]
            # Engines that did not answer while others did: one row each.
            rows += [{"backend": kind, "resource": "error", "host": host,
                      "error": ToolError(Reason.ENGINE_DOWN, message).to_dict()}
                     for host, message in sorted(backend.hosts_down().items())]
        return rows

    def hosts_down(self) -> dict[str, str]:
        """Engines that did not answer the last listing, by URL: reported, retried by the
        next listing or sweep."""
        return {host: message for backend in self._backends.values()
                for host, message in backend.hosts_down().items()}

    async def usage(self) -> dict[str, Any]:
        """What the engines hold now, by state, and its disk bytes (a `df`: not per event)."""
        rows = await self.list(sizes=True)
        held = [r for r in rows if r["resource"] != "error"]
        by_state = Counter((r["backend"], r["resource"], r["state"]) for r in held)
        return {
            "resources": [
                {"backend": b, "resource": k, "state": s, "count": n}
                for (b, k, s), n in sorted(by_state.items())
            ],
            "disk_bytes": sum(r["disk_bytes"] or 0 for r in held),
            "programs_holding": len({r["program_id"] for r in held}),
            # A backend is down when none of its engines answers; hosts_down names each one.
            "backends_down": sorted(r["backend"] for r in rows
                                    if r["resource"] == "error" and not r.get("host")),
            # Every engine that did not answer, also when none of its backend's did.
            "hosts_down": sorted(self.hosts_down()),
            "hosts": sorted(h for b in self._backends.values() for h in b.hosts()),
        }

    async def metrics(self) -> dict[str, Any]:
        return self.counters.snapshot() | await self.usage()
