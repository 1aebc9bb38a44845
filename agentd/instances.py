"""Agent instances in this process, each behind a local controller.

Every agent call goes through `scheduling.agents.cluster.Cluster`: the router places
it (stateful session pin, installed route, weighted route, else least loaded, growing
up to `max_instances`), the instance's local controller queues it until its
dependencies' values have arrived (pushed as each producer finishes) and orders it by
the installed priority, and `_pump` hands each startable call to the thread pool. An
instance runs one call at a time; a batchable one up to its `max_batch` at once, each
in a slot with an LLM program of its own (`<Agent>.<i>.<slot>`, slot 0 being the
instance's program), so that their LLM calls meet in the engine's batch. Each instance
reserves its agent's `resources` from the run's capacity (`Runtime.capacity`, from the
sandbox's limits; see scheduling/agents/resources.py): an agent whose one instance
cannot fit at all is an error at its first call, and a provision that does not fit is
refused. A call to an agent with no instance and no room for one while other agents'
instances hold the run's capacity waits in the cluster's waiting room
(scheduling/agents/waiting.py; a `future.waiting` event) until a kill or a provision
makes room, for at most `Runtime.resource_wait_s` once it is ready; then it fails with
a ResourceError naming the agent, the resource, what it needs and what is free (a
watcher thread, alive only while calls wait, ends the waits that run out); a waiting
call whose dependency fails gets its DependencyError at once. Waiting calls are in
the global view with no executor, so the daemon's policy can make room for them.
Decisions from the daemon's global controller
(route, set_priority, migrate, kill, provision) are installed with `apply`; the
cluster's placement / start / migration facts become runtime events.

Tool calls are not placed on instances; the cluster knows them as external calls so
that an agent call depending on one gets its value the same way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scheduling.agents.cluster import Applied, Cluster
from scheduling.agents.policy import (
    DRIVER,
    ControlDecision,
    Directives,
    FutureView,
    InstanceView,
    decision_from_dict,
)
from scheduling.agents.resources import NoCapacity, never_fits

if TYPE_CHECKING:
    from agentd.future import Future
    from agentd.runtime import Runtime

_local = threading.local()
WAIT_POLL_S = 1.0  # the watcher's longest sleep while a waiting call is not ready yet


def current_instance() -> str | None:
    """The instance whose call this thread runs (None: the driver)."""
    return getattr(_local, "instance", None)


@dataclass
class AgentKind:
    cls: type
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    directives: Directives


@dataclass
class _Call:
    future: Future
    agent_type: str
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    deps: list[Future] = field(default_factory=list)


class ResourceError(NoCapacity):
    """An agent whose declared `resources` the run cannot give even one instance."""


class ControlHost:
    def __init__(self, runtime: Runtime, session_id: str) -> None:
        self.runtime = runtime
        self.session_id = session_id
        self.cluster = Cluster(grow_on_demand=True, capacity=runtime.capacity,
                               resource_wait_s=runtime.resource_wait_s)
        self.lock = threading.RLock()
        self._watcher: threading.Thread | None = None  # ends waits for resources
        self._slots: dict[str, set[int]] = {}  # instance -> the batch slots in use
        self._building: dict[str, threading.Lock] = {}  # instance -> guards its object
        self.kinds: dict[str, AgentKind] = {}
        self._names: dict[tuple[type, str], str] = {}
        self.objects: dict[str, Any] = {}
        self.calls: dict[str, _Call] = {}

    # --- agent types and instances -----------------------------------------------------

    def agent_type(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any],
                   directives: Directives) -> str:
        """The agent type for this class and constructor arguments, registered once;
        its `min_instances` instances exist from then on, as many as the run's capacity
        holds (their objects are made at their first call). ResourceError: one instance
        needs more than the run has in all (nothing is registered)."""
        key = (cls, repr((args, sorted(kwargs.items()))))
        with self.lock:
            name = self._names.get(key)
            if name is not None:
                return name
            taken = sum(1 for c, _ in self._names if c is cls)
            name = cls.__name__ if not taken else f"{cls.__name__}~{taken + 1}"
            capacity = self.cluster.capacity
            problem = None if capacity is None else never_fits(name, directives.resources,
                                                               capacity)
            if problem is not None:
                raise ResourceError(problem)
            self._names[key] = name
            self.kinds[name] = AgentKind(cls, args, kwargs, directives)
            self.cluster.add_agent(name, directives)
            self.cluster.provision_startup(name, max(0, directives.min_instances), time.time())
            self._flush()
            return name

    def instances(self, agent_type: str) -> int:
        with self.lock:
            return len(self.cluster.alive(agent_type))

    # --- calls ------------------------------------------------------------------------

    def track_external(self, fut: Future) -> None:
        """A call the cluster does not run (a tool): consumers get its value when done."""
        with self.lock:
            self.cluster.external(fut.id, self.session_id, time.time())
        fut.add_done_callback(self._external_done)

    def _external_done(self, fut: Future) -> None:
        with self.lock:
            self.cluster.complete(fut.id, None, fut.exception() is None, time.time())
            self._pump()

    def submit(self, fut: Future, agent_type: str, method: str, args: tuple[Any, ...],
               kwargs: dict[str, Any], deps: list[Future], parent: str | None) -> None:
        """Place a new agent call; `parent` is the call this one is made from, if any."""
        with self.lock:
            for d in deps:
                if not self.cluster.knows(d.id):
                    self.track_external(d)
            try:
                self.cluster.create(fut.id, self.session_id, agent_type, time.time(),
                                    deps=[d.id for d in deps],
                                    creator=current_instance() or DRIVER, parent=parent,
                                    call_key=f"{method}:{_call_key(args, kwargs)}")
            except NoCapacity as exc:
                self._flush()
                self.runtime.fail(fut, exc, f"{agent_type} (not placed)")
                return
            # started only by `_pump` below, so it is recorded in time for `_run`
            self.calls[fut.id] = _Call(fut, agent_type, method, args, kwargs, deps)
            self._pump()
            if self.cluster.waiting():
                self._watch()

    def _watch(self) -> None:
        """Start the thread that ends waits for resources that run out (lock held)."""
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._expire_loop, daemon=True,
                                             name="agentd-resource-wait")
            self._watcher.start()

    def _expire_loop(self) -> None:
        while True:
            with self.lock:
                for fid, why in self.cluster.expire(time.time()):
                    call = self.calls.pop(fid, None)
                    if call is not None:
                        self.runtime.fail(call.future, ResourceError(why),
                                          f"{call.agent_type} (not placed)")
                self._pump()  # consumers of a failed call can start now
                if not self.cluster.waiting():
                    self._watcher = None
                    return
                deadline = self.cluster.next_deadline()
            pause = WAIT_POLL_S if deadline is None else deadline - time.time()
            time.sleep(min(WAIT_POLL_S, max(0.01, pause)))

    def _pump(self) -> None:
        """Fail the waiting calls a failed dependency ended, then hand every call a free
        instance can start to the pool (lock held)."""
        self._fail_waiting()
        now = time.time()
        for inst in self.cluster.startable():
            while (started := self.cluster.start_next(inst, now)) is not None:
                self.runtime.pool.submit(self._run, inst, started.future, self._take_slot(inst))
        self._flush()

    def _fail_waiting(self) -> None:
        """Fail the waiting calls the cluster ended because a dependency failed, in
        order (one may be the failed dependency of the next). `execute` given only the
        failed dependency raises the DependencyError a placed call would, without
        calling anything."""
        for fid, dep in self.cluster.take_dependency_failures():
            call = self.calls.pop(fid, None)
            if call is None:
                continue
            failed = [d for d in call.deps if d.id == dep]
            where = f"{call.agent_type} (not placed)"
            if failed and failed[0].available():
                self.runtime.execute(call.future, failed, where, _never_called, None, (), {})
            else:  # `execute` would block on it under the lock: fail it plainly instead
                self.runtime.fail(call.future, RuntimeError(
                    f"{fid} did not run: its dependency {dep} failed"), where)

    def _take_slot(self, inst: str) -> int:
        used = self._slots.setdefault(inst, set())
        slot = next(i for i in range(len(used) + 1) if i not in used)
        used.add(slot)
        return slot

    def _run(self, inst: str, view: FutureView, slot: int = 0) -> None:
        call = self.calls.pop(view.future_id)
        _local.instance = inst
        llm_key = inst.replace("#", ".") + (f".{slot}" if slot else "")
        try:
            obj = self._object(inst, call.agent_type)
            fn: Callable[..., Any] = getattr(obj, call.method)
            ok = self.runtime.execute(call.future, call.deps, inst, fn, llm_key,
                                      call.args, call.kwargs)
        except BaseException as exc:  # the constructor raised
            self.runtime.fail(call.future, exc, inst)
            ok = False
        finally:
            _local.instance = None
        with self.lock:
            self._slots[inst].discard(slot)
            self.cluster.finish(inst, view.future_id, None, ok, time.time())
            self._pump()

    def _object(self, inst: str, agent_type: str) -> Any:
        """The instance's object, built by its first call; a batch's calls wait for it."""
        obj = self.objects.get(inst)
        if obj is not None:
            return obj
        with self.lock:
            building = self._building.setdefault(inst, threading.Lock())
        with building:
            obj = self.objects.get(inst)
            if obj is None:
                kind = self.kinds[agent_type]
                obj = self.objects[inst] = kind.cls(*kind.args, **kind.kwargs)
        return obj

    # --- the global controller's side -------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """This process's part of the global view, as JSON."""
        with self.lock:
            view = self.cluster.view(time.time())
            return {"instances": [_instance_dict(i) for i in view.instances],
                    "futures": [_future_dict(f) for f in view.futures],
                    "agents": {n: _directives_dict(d) for n, d in view.agents.items()},
                    "rules": {"priorities": dict(view.rules.priorities),
                              "routes": [[s, t, i] for (s, t), i in view.rules.routes.items()],
                              "pins": [[s, t, i] for (s, t), i in view.rules.pins.items()],
                              "weights": [[t, list(i), list(w)]
                                          for t, (i, w) in view.rules.weights.items()]},
                    "capacity": self.cluster.capacity}

    def apply(self, decisions: list[dict[str, Any]]) -> list[Applied]:
        """Install decisions sent by the daemon; each is checked against this process's
        current state (the daemon decided on a view that may be a moment old)."""
        parsed: list[ControlDecision] = []
        for data in decisions:
            try:
                parsed.append(decision_from_dict(data))
            except ValueError as exc:
                self.runtime.emit("control.applied", ok=False, detail=str(exc),
                                  decision=str(data.get("kind")))
        with self.lock:
            applied = self.cluster.apply(parsed, time.time())
            self._pump()
        return applied

    def _flush(self) -> None:
        for e in self.cluster.take_events():
            kind = e.pop("event")
            self.runtime.emit(kind, **e)


def _never_called() -> None:
    raise AssertionError("a call with a failed dependency ran")


def _call_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """What identifies a retry: the same method on the same subject (its first argument)
    again in the session. The other arguments (an attempt number, the last error) are
    what a retry changes."""
    from agentd.future import Future

    subject = args[0] if args else next(iter(sorted(kwargs.items())), None)
    if isinstance(subject, Future):
        return f"<future {subject.id}>"
    return repr(subject)[:500]


def _instance_dict(i: InstanceView) -> dict[str, Any]:
    d = i._asdict()
    d["state"] = i.state.value
    return d


def _future_dict(f: FutureView) -> dict[str, Any]:
    d = f._asdict()
    d["status"] = f.status.value
    d["dependencies"], d["consumers"] = list(f.dependencies), list(f.consumers)
    return d


def _directives_dict(d: Directives) -> dict[str, Any]:
    return {"stateful": d.stateful, "batchable": d.batchable, "preemptable": d.preemptable,
            "min_instances": d.min_instances, "max_instances": d.max_instances,
            "resources": dict(d.resources), "max_batch": d.max_batch}
