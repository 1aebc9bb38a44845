"""Stored policies and their versions; the one service the API and the daemon use.

Generic over the layers of daemon/policies/layers.py (kv, ordering, meta, admission,
control). Built-ins are registered at start as version 1 (their module's source, author
"builtin"). Each layer has one active version: the stored one survives a restart; with
none stored, the layer's default built-in becomes active (named by the config's
`kv_policy`, `ordering_policy`, `meta_policy`, `admission_policy`; `nalar-default` for
control). New versions are validated when stored and again against the live snapshot
when activated; the live snapshot is taken without holding the event loop
(`Layer.build`), and every change reports how long it held the loop. Each layer's active
version runs behind a `Guard` (daemon/policies/swap.py) that the layer's host in the
daemon returns from `Layer.install`; activation and rollback go through it.
"""

from __future__ import annotations

import asyncio
import difflib
import inspect
import logging
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update

from daemon.policies.layers import LAYERS, Layer
from daemon.policies.loop_hold import with_hold
from daemon.policies.sandbox import module_allowed
from daemon.policies.swap import FAILURES_TO_RETIRE, Active, Failure, Guard
from daemon.policies.validate import Report, filename_for, load_class, validate
from db import models

if TYPE_CHECKING:
    from daemon.core.core import Core

log = logging.getLogger("agentd.policies")
BUILTIN = "builtin"
EVENT_KINDS = ("policy.created", "policy.validated", "policy.activated", "policy.rolled_back",
               "policy.retired",
               "ordering.switch", "ordering.rollback")
# Event fields that name the policy an event is about.
_NAMED_BY = ("name", "failed", "restored", "policy", "rolled_back")


class PolicyError(Exception):
    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


class PolicyService:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self.guards: dict[str, Guard] = {}

    @property
    def guard(self) -> Guard:
        """The kv layer's guard."""
        return self.guards["kv"]

    # --- start ----------------------------------------------------------------------

    @classmethod
    async def start(cls, core: Core) -> PolicyService:
        service = cls(core)
        for layer in LAYERS.values():
            await service._register_builtins(layer)
            active = await service._load_active(layer, layer.default(core.config))
            service.guards[layer.name] = layer.install(core, active, service._on_failure)
            core.writer.trace("policy.activated", layer=layer.name, name=active.name,
                              version=active.version, by="startup")
        return service

    async def _register_builtins(self, layer: Layer) -> None:
        now = time.time()
        async with self.core.sessions() as s, s.begin():
            for name in layer.builtins:
                if await s.get(models.Policy, name) is not None:
                    continue
                source = layer.builtin_source(name)
                s.add(models.Policy(name=name, layer=layer.name, active_version=None,
                                    created_at=now))
                await s.flush()
                s.add(models.PolicyVersion(
                    policy_name=name, version=1, source=source, author=BUILTIN, status="draft",
                    validation_report={"ok": True, "builtin": True, "errors": []},
                    created_at=now))

    async def _load_active(self, layer: Layer, default: str) -> Active:
        async with self.core.sessions() as s, s.begin():
            row = (await s.scalars(select(models.Policy).where(
                models.Policy.layer == layer.name,
                models.Policy.active_version.is_not(None)))).first()
            if row is None:
                row = await s.get(models.Policy, default)
                assert row is not None
                row.active_version = 1
                await self._set_status(s, default, 1, "active")
            name, number = row.name, row.active_version
            assert number is not None
            version = await self._version_row(s, name, number)
            return Active(name, number, self._instantiate(layer, version))

    def _instantiate(self, layer: Layer, v: models.PolicyVersion) -> Any:
        if v.author == BUILTIN and v.version == 1 and v.policy_name in layer.builtins:
            return layer.builtin(v.policy_name, self.core)
        cls = load_class(layer, v.policy_name, v.source, filename_for(v.policy_name, v.version))
        return cls()

    # --- reads ----------------------------------------------------------------------

    async def list_policies(self) -> list[dict[str, Any]]:
        async with self.core.sessions() as s:
            rows = (await s.scalars(select(models.Policy).order_by(models.Policy.name))).all()
            counts = {r.name: await self._latest(s, r.name) for r in rows}
        return [self._policy_dict(r, counts[r.name]) for r in rows]

    async def get(self, name: str, events: bool = True) -> dict[str, Any]:
        async with self.core.sessions() as s:
            row = await self._policy_row(s, name)
            versions = await self._versions(s, name)
            out = self._policy_dict(row, len(versions))
            current = next((v for v in versions if v.version == row.active_version), versions[-1])
            out["status"] = current.status if row.active_version else versions[-1].status
            out["source_version"] = current.version
            out["source"] = current.source
            out["versions"] = [_version_dict(v, source=False) for v in versions]
        out["derive_from"] = self._derive_from(row)
        if events:
            out["events"] = await self.events(name)
        return out

    def _derive_from(self, row: models.Policy) -> dict[str, str] | None:
        """Where a built-in's class is, so a new policy can subclass it: a built-in's
        stored source is its whole module, which never passes as a new version (one
        class, named as the policy, is the rule); None for stored policies."""
        layer = LAYERS.get(row.layer)
        if layer is None or row.name not in layer.builtins:
            return None
        cls = type(layer.builtin(row.name, self.core))
        if not module_allowed(cls.__module__):
            return None  # a policy could not import it
        return {"module": cls.__module__, "class": cls.__qualname__}

    async def versions(self, name: str) -> list[dict[str, Any]]:
        async with self.core.sessions() as s:
            await self._policy_row(s, name)
            return [_version_dict(v, source=False) for v in await self._versions(s, name)]

    async def version(self, name: str, number: int) -> dict[str, Any]:
        async with self.core.sessions() as s:
            return _version_dict(await self._version_row(s, name, number), source=True)

    async def diff(self, name: str, a: int, b: int) -> str:
        async with self.core.sessions() as s:
            old = await self._version_row(s, name, a)
            new = await self._version_row(s, name, b)
        return "".join(difflib.unified_diff(
            old.source.splitlines(keepends=True), new.source.splitlines(keepends=True),
            fromfile=f"{name} v{a}", tofile=f"{name} v{b}"))

    async def events(self, name: str, limit: int = 200) -> list[dict[str, Any]]:
        await self.core.writer.flush()
        async with self.core.sessions() as s:
            rows = (await s.scalars(select(models.TraceEvent).where(
                models.TraceEvent.kind.in_(EVENT_KINDS), models.TraceEvent.session_id.is_(None))
                .order_by(models.TraceEvent.id.desc()).limit(limit * 5))).all()
        hits = [r for r in rows if any(r.data.get(k) == name for k in _NAMED_BY)]
        return [{"id": r.id, "ts": r.ts, "kind": r.kind, "data": r.data}
                for r in reversed(hits[:limit])]

    # --- changes --------------------------------------------------------------------

    # Each change answers with the longest stretch it held the event loop (`loop_hold`).

    async def put(self, name: str, layer_name: str, source: str, author: str) -> dict[str, Any]:
        return await with_hold(f"storing {name}", self._put(name, layer_name, source, author))

    async def validate(self, name: str, number: int | None) -> dict[str, Any]:
        return await with_hold(f"validating {name}", self._validate_stored(name, number))

    async def activate(self, name: str, number: int | None, by: str) -> dict[str, Any]:
        return await with_hold(f"activating {name}", self._activate(name, number, by))

    async def rollback(self, name: str, by: str) -> dict[str, Any]:
        return await with_hold(f"rolling back {name}", self._rollback(name, by))

    async def _put(self, name: str, layer_name: str, source: str, author: str
                   ) -> dict[str, Any]:
        layer = _layer(layer_name)
        async with self.lock, self.core.sessions() as s, s.begin():
            row = await s.get(models.Policy, name)
            if row is not None and row.layer != layer.name:
                raise PolicyError(409, f"policy {name!r} belongs to layer {row.layer!r}, "
                                  f"not {layer.name!r}", "layer_mismatch", "layer")
            number = await self._latest(s, name) + 1
            # Validated before the first write, which takes the store's write lock until
            # the commit: validation awaits the live snapshot's build (Layer.build).
            report = await self._validate(layer, name, source, number)
            if row is None:
                s.add(models.Policy(name=name, layer=layer.name, active_version=None,
                                    created_at=time.time()))
                await s.flush()
            version = models.PolicyVersion(
                policy_name=name, version=number, source=source, author=author,
                status="draft", validation_report=report.to_dict(), created_at=time.time())
            s.add(version)
            await s.flush()
            out = _version_dict(version, source=False)
        self.core.writer.trace("policy.created", layer=layer.name, name=name, version=number,
                               ok=report.ok, author=author)
        return out

    async def _validate_stored(self, name: str, number: int | None) -> dict[str, Any]:
        async with self.lock, self.core.sessions() as s, s.begin():
            row = await self._policy_row(s, name)
            v = await self._version_row(s, name, number or await self._latest(s, name))
            report = await self._validate(_layer(row.layer), name, v.source, v.version, v)
            v.validation_report = {**v.validation_report, **report.to_dict()}
            self._trace_validated(row.layer, name, v.version, report, "validate")
            return _version_dict(v, source=False)

    async def _activate(self, name: str, number: int | None, by: str) -> dict[str, Any]:
        async with self.lock:
            async with self.core.sessions() as s, s.begin():
                row = await self._policy_row(s, name)
                layer = _layer(row.layer)
                v = await self._version_row(s, name, number or await self._latest(s, name))
                if v.status == "retired":
                    raise PolicyError(409, f"{name} v{v.version} is retired after repeated "
                                      "failures; store a new version", "retired")
                report = await self._validate(layer, name, v.source, v.version, v)
                v.validation_report = {**v.validation_report, **report.to_dict()}
                self._trace_validated(layer.name, name, v.version, report, "activate")
                if not report.ok:
                    raise PolicyError(422, f"{name} v{v.version} failed validation: "
                                      + "; ".join(_problem(e) for e in report.errors),
                                      "validation_failed")
                policy = self._instantiate(layer, v)
                guard = self.guards[layer.name]
                swap_s = guard.swap(Active(name, v.version, policy))
                await self._mark_active(s, layer.name, name, v.version)
                out = _version_dict(v, source=False)
            self.core.writer.trace("policy.activated", layer=layer.name, name=name,
                                   version=v.version, by=by, swap_us=round(swap_s * 1e6, 1))
            await self.core.writer.flush()
        # A version that failed at once was rolled back already: say what runs now.
        running = {"name": guard.current.name, "version": guard.current.version}
        return {**out, "swap_us": round(swap_s * 1e6, 1), "active": running}

    async def _rollback(self, name: str, by: str) -> dict[str, Any]:
        async with self.lock:
            async with self.core.sessions() as s:
                layer = _layer((await self._policy_row(s, name)).layer)
            guard = self.guards[layer.name]
            failed = guard.current
            if failed.name != name:
                raise PolicyError(409, f"policy {name!r} is not the active {layer.name} policy "
                                  f"({failed.name} v{failed.version} is)", "not_active")
            restored = guard.restore_previous()
            if restored is None:
                restored = await self._load_default(layer)
                guard.reset(restored)
            self.core.writer.trace("policy.rolled_back", layer=layer.name, name=name,
                                   version=failed.version, restored=restored.name,
                                   restored_version=restored.version,
                                   reason=f"operator rollback by {by}")
            await self._persist_failure(layer.name, failed, restored, count=False)
            await self.core.writer.flush()
        return {"rolled_back": {"name": name, "version": failed.version},
                "active": {"name": restored.name, "version": restored.version}}

    async def _load_default(self, layer: Layer) -> Active:
        default = layer.default(self.core.config)
        async with self.core.sessions() as s:
            v = await self._version_row(s, default, 1)
            return Active(default, 1, self._instantiate(layer, v))

    # --- automatic rollback -----------------------------------------------------------

    def _on_failure(self, failure: Failure) -> None:
        f, r = failure.failed, failure.restored
        self.core.writer.trace("policy.rolled_back", layer=failure.layer, name=f.name,
                               version=f.version, restored=r.name, restored_version=r.version,
                               reason=failure.reason, automatic=True)
        task = asyncio.get_running_loop().create_task(
            self._persist_failure(failure.layer, f, r, count=True))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _persist_failure(self, layer: str, failed: Active, restored: Active,
                               count: bool) -> None:
        async with self.core.sessions() as s, s.begin():
            v = await self._version_row(s, failed.name, failed.version)
            failures = int(v.validation_report.get("runtime_failures", 0)) + int(count)
            v.validation_report = {**v.validation_report, "runtime_failures": failures}
            v.status = "retired" if failures >= FAILURES_TO_RETIRE else "rolled_back"
            if await s.get(models.Policy, restored.name) is not None:
                await self._mark_active(s, layer, restored.name, restored.version)
        if v.status == "retired":
            self.core.writer.trace("policy.retired", layer=layer, name=failed.name,
                                   version=failed.version, failures=failures)

    async def _mark_active(self, s: Any, layer: str, name: str, number: int) -> None:
        """Make (name, number) the layer's one active version; others become drafts."""
        names = (await s.scalars(select(models.Policy.name).where(
            models.Policy.layer == layer))).all()
        await s.execute(update(models.Policy).where(models.Policy.layer == layer)
                        .values(active_version=None))
        await s.execute(update(models.Policy).where(models.Policy.name == name)
                        .values(active_version=number))
        demote = update(models.PolicyVersion).where(
            models.PolicyVersion.policy_name.in_(names), models.PolicyVersion.status == "active")
        await s.execute(demote.values(status="draft"))
        await self._set_status(s, name, number, "active")

    # --- helpers ----------------------------------------------------------------------

    async def _validate(self, layer: Layer, name: str, source: str, number: int,
                        stored: models.PolicyVersion | None = None) -> Report:
        if stored is not None and stored.author == BUILTIN and stored.version == 1:
            return Report(snapshots=["builtin"])
        live = layer.live(self.core)
        if inspect.iscoroutinefunction(layer.build):
            live = await layer.build(live)
        elif layer.build is not None:
            live = await asyncio.to_thread(layer.build, live)
        # The dry run itself stays on the loop's (main) thread: only there can a runaway
        # call be interrupted and its hot line sampled (deadline.py, hotspot.py).
        now = time.time()
        return validate(layer, name, source, [("live", live), ("sample", layer.sample(now))],
                        now, number)

    def _trace_validated(self, layer: str, name: str, number: int, report: Report,
                         on: str) -> None:
        self.core.writer.trace("policy.validated", layer=layer, name=name, version=number,
                               on=on, ok=report.ok, snapshots=report.snapshots,
                               errors=[_problem(e) for e in report.errors])

    async def _set_status(self, s: Any, name: str, number: int, status: str) -> None:
        await s.execute(update(models.PolicyVersion).where(
            models.PolicyVersion.policy_name == name, models.PolicyVersion.version == number)
            .values(status=status))

    async def _policy_row(self, s: Any, name: str) -> models.Policy:
        row = await s.get(models.Policy, name)
        if row is None:
            raise PolicyError(404, f"unknown policy {name!r}", "not_found")
        assert isinstance(row, models.Policy)
        return row

    async def _versions(self, s: Any, name: str) -> list[models.PolicyVersion]:
        return list((await s.scalars(select(models.PolicyVersion).where(
            models.PolicyVersion.policy_name == name)
            .order_by(models.PolicyVersion.version))).all())

    async def _version_row(self, s: Any, name: str, number: int) -> models.PolicyVersion:
        row = (await s.scalars(select(models.PolicyVersion).where(
            models.PolicyVersion.policy_name == name,
            models.PolicyVersion.version == number))).first()
        if row is None:
            raise PolicyError(404, f"policy {name!r} has no version {number}", "not_found")
        assert isinstance(row, models.PolicyVersion)
        return row

    async def _latest(self, s: Any, name: str) -> int:
        versions = await self._versions(s, name)
        return versions[-1].version if versions else 0

    def _policy_dict(self, row: models.Policy, versions: int) -> dict[str, Any]:
        return {"name": row.name, "layer": row.layer, "active_version": row.active_version,
                "active": row.active_version is not None, "versions": versions,
                "created_at": row.created_at}


def _layer(name: str) -> Layer:
    try:
        return LAYERS[name]
    except KeyError:
        raise PolicyError(400, f"unknown layer {name!r}; known: {sorted(LAYERS)}",
                          "unknown_layer", "layer") from None


def _problem(e: Any) -> str:
    return f"line {e.line}: {e.message}" if e.line is not None else e.message


def _version_dict(v: models.PolicyVersion, source: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": v.policy_name, "version": v.version, "status": v.status,
                           "author": v.author, "created_at": v.created_at,
                           "validation": v.validation_report}
    if source:
        out["source"] = v.source
    return out
