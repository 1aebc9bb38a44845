"""Where decorated calls run: in this process (local mode) or for a daemon run (daemon mode).

Both modes run calls on a thread pool in the current process; they differ in where the
side effects go:

| | local mode | daemon mode (inside `python -m daemon.runtime.sandbox`) |
|---|---|---|
| future events | kept in `runtime.events` | posted to `POST /v1/runs/{id}/events` |
| `agentd.llm` | `$AGENTD_URL` (OpenAI-compatible), | the daemon's gateway, with |
| | else LLMUnavailable | the run's program/session ids |
| managed state | in memory | the session's state, written through on every mutation |
| agent calls | local controllers (agentd/instances.py) | the same, plus the daemon's global |
| | | controller's decisions, fetched with this process's view every 0.25 s |
| `resources` capacity | none (unbounded) unless given | the sandbox's limits (`process_capacity`) |
| wait for room | `$AGENTD_RESOURCE_WAIT_S`, else 60 s | the daemon's `runtime_resource_wait_s` |

The mode is chosen once per process from the environment: daemon mode when
`AGENTD_RUN_ID` and `AGENTD_DAEMON_URL` are set (the sandbox sets them), else local.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import queue
import resource
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from agentd import failover
from agentd.future import DependencyError, Future, find_futures, resolve
from agentd.instances import ControlHost

DEFAULT_THREADS = 32
LLM_TIMEOUT_S = 300.0
CONTROL_PERIOD_S = 0.25
MIB = 1024 * 1024
# How long a ready agent call waits for room for an instance before it fails (the
# daemon passes its `runtime_resource_wait_s` to sandboxes); 0: no wait, it fails.
DEFAULT_RESOURCE_WAIT_S = 60.0


class LLMUnavailable(RuntimeError):
    """agentd.llm has nowhere to send the call."""


class LLMError(RuntimeError):
    """The LLM endpoint answered with an error."""


_local = threading.local()


def current_future_id() -> str | None:
    return getattr(_local, "future", None)


def _current_llm_key() -> str | None:
    return getattr(_local, "llm_key", None)


def process_capacity(env: Mapping[str, str] = os.environ) -> dict[str, float]:
    """What this process's agent instances may reserve in all: the memory of its
    address-space limit (a run's `memory_mb`; physical memory when unlimited), the CPUs
    it may run on, and GPUs only as configured (`AGENTD_GPUS`; none by default)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        soft = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        gpus = max(0.0, float(env.get("AGENTD_GPUS") or 0))
    except ValueError:
        gpus = 0.0
    return {"CPU": float(len(os.sched_getaffinity(0))), "GPU": gpus,
            "memory_mb": float(soft // MIB)}


def resource_wait(env: Mapping[str, str] = os.environ) -> float:
    """`AGENTD_RESOURCE_WAIT_S`, else the default; a value that is not a number >= 0
    is an error naming the variable (the daemon validates what it passes)."""
    raw = env.get("AGENTD_RESOURCE_WAIT_S")
    if not raw:
        return DEFAULT_RESOURCE_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"AGENTD_RESOURCE_WAIT_S must be a number >= 0, got {raw!r}")
    return value


class Runtime:
    mode = "base"
    session_id = "local"

    def __init__(self, max_threads: int | None = None,
                 capacity: Mapping[str, float] | None = None,
                 resource_wait_s: float | None = None) -> None:
        """`capacity`: what agent instances may reserve in all (None: unbounded);
        `resource_wait_s`: how long a ready call waits for room (None: `resource_wait`)."""
        self.capacity = None if capacity is None else dict(capacity)
        self.resource_wait_s = resource_wait() if resource_wait_s is None else resource_wait_s
        threads = max_threads or int(os.environ.get("AGENTD_MAX_THREADS", DEFAULT_THREADS))
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="agentd")
        self.futures: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._control: ControlHost | None = None

    @property
    def control(self) -> ControlHost:
        """The agent instances of this process and their local controllers."""
        with self._lock:
            if self._control is None:
                self._control = ControlHost(self, self.session_id)
            return self._control

    # --- calls ------------------------------------------------------------------------

    def _new_future(self, kind: str, name: str, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> tuple[Future, list[Future]]:
        deps = find_futures((args, kwargs))
        fut = Future(kind, name, creator=current_future_id() or "driver",
                     dependencies=[d.id for d in deps])
        with self._lock:
            self.futures[fut.id] = fut
            for d in deps:
                d.consumers.append(fut.id)
        self.emit("future.created", id=fut.id, name=name, kind=kind, creator=fut.creator,
                  dependencies=fut.dependencies)
        return fut, deps

    def call_agent(self, agent_type: str, name: str, method: str, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Future:
        """An agent call: its local controller runs it once its dependencies resolved."""
        fut, deps = self._new_future("agent", name, args, kwargs)
        self.control.submit(fut, agent_type, method, args, kwargs, deps, current_future_id())
        return fut

    def call(self, kind: str, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Future:
        """A tool call: it runs on the pool once every future in its args resolved."""
        fut, deps = self._new_future(kind, name, args, kwargs)
        if self._control is not None:
            self._control.track_external(fut)
        executor = f"{kind}:{name}"

        def run() -> None:
            self.execute(fut, deps, executor, fn, None, args, kwargs)

        waiting = [d for d in deps if not d.available()]
        if not waiting:
            self.pool.submit(run)
            return fut
        left = [len(waiting)]
        count_lock = threading.Lock()

        def one_done(_: Future) -> None:
            with count_lock:
                left[0] -= 1
                ready = left[0] == 0
            if ready:
                self.pool.submit(run)

        for d in waiting:
            d.add_done_callback(one_done)
        return fut

    def execute(self, fut: Future, deps: list[Future], executor: str, fn: Callable[..., Any],
                llm_key: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Run one call whose dependencies have resolved; False if it failed."""
        fut.mark_running(executor)
        failed = [d for d in deps if d.exception() is not None]
        try:
            if failed:
                d = failed[0]
                raise DependencyError(
                    f"{fut.name} ({fut.id}) did not run: its dependency {d.name} "
                    f"({d.id}) failed: {d.exception()!r}") from d.exception()
            a, k = resolve(args), resolve(kwargs)
            _local.future, _local.llm_key = fut.id, llm_key
            try:
                value = fn(*a, **k)
                if inspect.iscoroutine(value):
                    value = asyncio.run(value)
                value = resolve(value)
            finally:
                _local.future = _local.llm_key = None
        except BaseException as exc:
            self.fail(fut, exc, executor)
            return False
        self._resolve(fut, value=value)
        return True

    def fail(self, fut: Future, exc: BaseException, executor: str) -> None:
        if fut.executor is None:
            fut.executor = executor
        exc.add_note(f"agentd: raised in {fut.kind} {fut.name} (future {fut.id}, "
                     f"executor {fut.executor}, created by {fut.creator})")
        self._resolve(fut, error=exc)

    def _resolve(self, fut: Future, value: Any = None, error: BaseException | None = None) -> None:
        if error is None:
            fut.set_result(value)
        else:
            fut.set_exception(error)
        self.emit("future.resolved", id=fut.id, name=fut.name, kind=fut.kind,
                  creator=fut.creator, executor=fut.executor, dependencies=fut.dependencies,
                  consumers=list(fut.consumers), status=fut.status,
                  started_at=fut.started_at, finished_at=fut.finished_at,
                  error=None if error is None else f"{type(error).__name__}: {error}")

    # --- hooks the modes fill in ----------------------------------------------------------

    def emit(self, event: str, **data: Any) -> None:
        raise NotImplementedError

    def llm(self, messages: list[dict[str, Any]], model: str | None = None,
            max_tokens: int | None = None, **params: Any) -> str:
        raise NotImplementedError

    def endpoint(self) -> Endpoint:
        """Where agentd.Context sends its calls, and as which program."""
        raise NotImplementedError

    def load_state(self, name: str) -> Any:
        raise NotImplementedError

    def save_state(self, name: str, value: Any) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=False)


def _chat(base: str, headers: dict[str, str], body: dict[str, Any]) -> str:
    """`base`: one /v1 base URL, or several comma-separated (agentd/failover.py)."""
    try:
        r = failover.daemons(base).send(lambda b: httpx.post(
            f"{b}/chat/completions", json=body, headers=headers, timeout=LLM_TIMEOUT_S))
    except httpx.HTTPError as exc:
        raise LLMError(f"agentd.llm: cannot reach {base}: {exc}") from exc
    if r.status_code >= 400:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text[:500]
        raise LLMError(f"agentd.llm: {base} answered {r.status_code}: {message}")
    return str(r.json()["choices"][0]["message"]["content"])


def _first_model(base: str, headers: dict[str, str]) -> str:
    try:
        data = failover.daemons(base).send(lambda b: httpx.get(
            f"{b}/models", headers=headers, timeout=30)).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise LLMError(f"agentd.llm: cannot list models at {base}: {exc}") from exc
    if not data:
        raise LLMError(f"agentd.llm: {base} serves no models")
    return str(data[0]["id"])


@dataclass(frozen=True)
class Endpoint:
    """An agentd daemon's /v1 base URL (or several, comma-separated: an active daemon and
    its standbys, agentd/failover.py), the headers to send, the program and session its
    calls run in (None: the daemon's choice), and the model (None: the first served)."""

    base: str
    headers: dict[str, str]
    program_id: str | None = None
    session_id: str | None = None
    model: str | None = None

    def first_model(self) -> str:
        return self.model or _first_model(self.base, self.headers)


class LocalRuntime(Runtime):
    """Plain in-process execution: for developing and testing a workflow."""

    mode = "local"
    MAX_EVENTS = 100_000

    def __init__(self, max_threads: int | None = None,
                 capacity: Mapping[str, float] | None = None,
                 resource_wait_s: float | None = None) -> None:
        super().__init__(max_threads, capacity, resource_wait_s)
        self.events: list[dict[str, Any]] = []
        self.state: dict[str, Any] = {}
        self._model: str | None = None

    def emit(self, event: str, **data: Any) -> None:
        with self._lock:
            if len(self.events) < self.MAX_EVENTS:
                self.events.append({"event": event, "ts": time.time(), **data})

    def llm(self, messages: list[dict[str, Any]], model: str | None = None,
            max_tokens: int | None = None, **params: Any) -> str:
        url = os.environ.get("AGENTD_URL", "").rstrip("/")
        if not url:
            raise LLMUnavailable(
                "agentd.llm: no LLM endpoint in local mode; set AGENTD_URL to an "
                "OpenAI-compatible server (e.g. http://127.0.0.1:8420 for agentd) and "
                "AGENTD_TOKEN to its API token, or submit the workflow to a daemon")
        base = failover.v1_bases(url)
        token = os.environ.get("AGENTD_TOKEN") or os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if model is None:
            model = os.environ.get("AGENTD_MODEL") or self._model or _first_model(base, headers)
            self._model = model
        body = {"model": model, "messages": messages, **params}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        return _chat(base, headers, body)

    def endpoint(self) -> Endpoint:
        url = os.environ.get("AGENTD_URL", "").rstrip("/")
        if not url:
            raise LLMUnavailable(
                "agentd.Context: no daemon in local mode; set AGENTD_URL to an agentd daemon "
                "(e.g. http://127.0.0.1:8420) and AGENTD_TOKEN to its API token, or submit "
                "the workflow to a daemon")
        token = os.environ.get("AGENTD_TOKEN") or os.environ.get("OPENAI_API_KEY")
        return Endpoint(failover.v1_bases(url),
                        {"Authorization": f"Bearer {token}"} if token else {},
                        model=os.environ.get("AGENTD_MODEL") or self._model)

    def load_state(self, name: str) -> Any:
        return self.state.get(name)

    def save_state(self, name: str, value: Any) -> None:
        self.state[name] = value


class DaemonRuntime(Runtime):
    """Inside a sandbox: events, LLM calls and managed state go to the daemon over HTTP."""

    mode = "daemon"
    BATCH = 200

    def __init__(self, url: str, token: str, run_id: str, program_id: str, session_id: str,
                 max_threads: int | None = None,
                 capacity: Mapping[str, float] | None = None,
                 resource_wait_s: float | None = None) -> None:
        super().__init__(max_threads, capacity, resource_wait_s)
        self.url = url.rstrip("/")
        self.run_id, self.program_id, self.session_id = run_id, program_id, session_id
        self.http = httpx.Client(base_url=self.url, timeout=60,
                                 headers={"Authorization": f"Bearer {token}"})
        self._events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._sender = threading.Thread(target=self._send_loop, name="agentd-events",
                                        daemon=True)
        self._sender.start()
        self._stop = threading.Event()
        self._controller = threading.Thread(target=self._control_loop, name="agentd-control",
                                            daemon=True)
        self._controller.start()
        self._state: dict[str, Any] | None = None
        self._state_lock = threading.Lock()
        self._model: str | None = None
        self.llm_programs: set[str] = set()

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ[str] = os.environ) -> DaemonRuntime:
        # the sandbox applies its limits before it builds this runtime
        return cls(env["AGENTD_DAEMON_URL"], env.get("AGENTD_RUN_TOKEN", ""),
                   env["AGENTD_RUN_ID"], env["AGENTD_PROGRAM_ID"], env["AGENTD_SESSION_ID"],
                   capacity=process_capacity(env), resource_wait_s=resource_wait(env))

    # events: a sender thread batches them so that futures never wait on HTTP
    def emit(self, event: str, **data: Any) -> None:
        self._events.put({"event": event, "ts": time.time(), **data})

    def _send_loop(self) -> None:
        stop = False
        while not stop:
            batch: list[dict[str, Any]] = []
            item = self._events.get()
            while True:
                if item is None:
                    stop = True
                    break
                batch.append(item)
                if len(batch) >= self.BATCH:
                    break
                try:
                    item = self._events.get_nowait()
                except queue.Empty:
                    break
            if batch:
                with contextlib.suppress(httpx.HTTPError):
                    self.http.post(f"/v1/runs/{self.run_id}/events", json={"events": batch})

    def flush(self) -> None:
        self._stop.set()
        self._events.put(None)
        self._sender.join(timeout=30)

    # the global controller: send this process's view, install the decisions that come back
    def _control_loop(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10,
                          headers=dict(self.http.headers)) as client:
            while not self._stop.wait(CONTROL_PERIOD_S):
                host = self._control
                if host is None:
                    continue  # no agent call yet
                try:
                    r = client.post(f"/v1/runs/{self.run_id}/control",
                                    json={"view": host.snapshot()})
                    decisions = r.json().get("decisions") if r.status_code == 200 else None
                except (httpx.HTTPError, ValueError):
                    continue
                if decisions:
                    host.apply(decisions)

    # LLM calls: the driver uses the run's program; each agent instance its own program in
    # the same session, because a program issues one LLM call at a time.
    def _llm_program(self) -> str:
        key = _current_llm_key()
        program = self.program_id if key is None else f"{self.program_id}.{key}"
        if key is None and current_future_id() is not None:
            program = f"{self.program_id}.{threading.current_thread().name}"
        self.llm_programs.add(program)
        return program

    def endpoint(self) -> Endpoint:
        return Endpoint(f"{self.url}/v1", dict(self.http.headers), self._llm_program(),
                        self.session_id, self._model)

    def llm(self, messages: list[dict[str, Any]], model: str | None = None,
            max_tokens: int | None = None, **params: Any) -> str:
        program = self._llm_program()
        headers = dict(self.http.headers)
        base = f"{self.url}/v1"
        if model is None:
            model = self._model or _first_model(base, headers)
            self._model = model
        body = {"model": model, "messages": messages, "program_id": program,
                "session_id": self.session_id, **params}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        return _chat(base, headers, body)

    # managed state: read once, written through on every mutation
    def _load_all(self) -> dict[str, Any]:
        if self._state is None:
            r = self.http.get(f"/v1/runs/{self.run_id}/state")
            r.raise_for_status()
            self._state = dict(r.json()["state"])
        return self._state

    def load_state(self, name: str) -> Any:
        with self._state_lock:
            return self._load_all().get(name)

    def save_state(self, name: str, value: Any) -> None:
        text = json.dumps(value)  # TypeError names what cannot be stored
        with self._state_lock:
            r = self.http.put(f"/v1/runs/{self.run_id}/state/{name}",
                              content=f'{{"value": {text}}}',
                              headers={"Content-Type": "application/json"})
            r.raise_for_status()
            self._load_all()[name] = json.loads(text)

    def shutdown(self) -> None:
        super().shutdown()
        self.flush()
        self.http.close()


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def current() -> Runtime:
    """This process's runtime, created on first use from the environment."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            if os.environ.get("AGENTD_RUN_ID") and os.environ.get("AGENTD_DAEMON_URL"):
                _runtime = DaemonRuntime.from_env()
            else:
                _runtime = LocalRuntime()
        return _runtime


def set_runtime(runtime: Runtime | None) -> Runtime | None:
    """Install `runtime` (None: choose again on next use); returns the previous one."""
    global _runtime
    with _runtime_lock:
        old, _runtime = _runtime, runtime
    return old


@contextlib.contextmanager
def local_runtime(max_threads: int | None = None,
                  capacity: Mapping[str, float] | None = None,
                  resource_wait_s: float | None = None) -> Iterator[LocalRuntime]:
    """A fresh LocalRuntime for the block (tests, notebooks); the previous one comes back.
    `capacity` bounds the agents' `resources` reservations as a run's limits would, and
    `resource_wait_s` how long a call waits for room under it."""
    rt = LocalRuntime(max_threads, capacity, resource_wait_s)
    old = set_runtime(rt)
    try:
        yield rt
    finally:
        set_runtime(old)
        rt.shutdown()


def llm(messages: list[dict[str, Any]] | str, model: str | None = None,
        max_tokens: int | None = None, **params: Any) -> str:
    """One chat completion; returns the assistant's text. A str is one user message."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    return current().llm(resolve(messages), model=model, max_tokens=max_tokens, **params)
