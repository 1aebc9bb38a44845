"""agentd.Context: a conversation the program controls, kept as token ids.

    ctx = agentd.Context()
    ctx.system("You are terse.").user("Name a prime.")
    out = ctx.generate(max_tokens=8, temperature=0)   # out.text, out.token_ids
    a, b = ctx.fork(2)                                # share ctx's tokens (prefix cache)
    ctx.snapshot("primer")                            # a named prefix of this tenant
    later = agentd.Context.open("primer")             # in any program of the tenant

A context holds the token ids the engine saw and produced, and the turns appended since
(`system`, `user`, `assistant`, `turn`, `fill`'s text) until the next call tokenizes them
on the worker (whose tokenizer and chat template they need). Every call sends exactly the
ids the context holds: nothing is re-tokenized, so the engine's prefix cache serves every
token a previous call computed. `generate` opens an assistant reply first when the last
thing appended is a turn; its output (end-of-turn token included) joins the context.

Token-level control: `step()` is the next token's distribution (the likeliest `top` ids
with log probabilities; a one-token generate on the same ids, so the prefix is cached), and
`append(ids)` adds chosen ids; a decoding loop of its own (beam search, best-of-n with its
own scoring, an early stop) is those two in turn.

Calls go to the daemon of the run (daemon mode, in the run's program and session) or to
`$AGENTD_URL` with `$AGENTD_TOKEN` (local mode; `program_id`/`session_id` given here, else
each call is a program of its own). A program makes one call at a time: generate a fork's
children in turn, or each in an agent call of its own (its own program).
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from agentd import failover
from agentd.runtime import LLM_TIMEOUT_S, Endpoint, LLMError, current


class ContextDropped(RuntimeError):
    """The context was dropped; it holds nothing any more."""


class SnapshotNotFound(LLMError):
    """The tenant holds no snapshot of that name."""


@dataclass(frozen=True)
class Candidate:
    """One possible token: its id, text and log probability."""

    token_id: int
    token: str
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token with its log probability and the likeliest alternatives."""

    token_id: int
    token: str
    logprob: float
    top: tuple[Candidate, ...]


@dataclass(frozen=True)
class Generation:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop" | "length"
    logprobs: tuple[TokenLogprob, ...] | None  # when asked for
    prompt_tokens: int
    cached_tokens: int  # prompt tokens the engine served from its prefix cache
    # Leading tokens shared with other programs through the snapshot the context was opened
    # from (the KV layer holds them once); 0 when none, or the snapshot changed or went.
    shared_prefix_tokens: int = 0


class Context:
    def __init__(self, model: str | None = None, *, program_id: str | None = None,
                 session_id: str | None = None, token_ids: Iterable[int] = ()) -> None:
        """`program_id` / `session_id` name where calls run in local mode (a run's context
        uses the run's); `token_ids` start it with tokens already known (Context.open)."""
        endpoint = current().endpoint()
        self._endpoint = Endpoint(
            endpoint.base, endpoint.headers, program_id or endpoint.program_id,
            session_id or endpoint.session_id, model or endpoint.model)
        self._model = model
        self._ids: list[int] = [int(t) for t in token_ids]
        self._pending: list[dict[str, str]] = []
        self._dropped = False
        self._snapshot: str | None = None  # opened from it: its programs share its ids

    # --- what it holds ----------------------------------------------------------------

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The ids tokenized so far (turns appended since the last call are not yet)."""
        self._live()
        return tuple(self._ids)

    @property
    def pending(self) -> int:
        """Segments appended and not yet tokenized."""
        return len(self._pending)

    @property
    def model(self) -> str:
        if self._model is None:
            self._model = self._endpoint.first_model()
        return self._model

    # --- appending --------------------------------------------------------------------

    def system(self, text: str) -> Context:
        return self.turn("system", text)

    def user(self, text: str) -> Context:
        return self.turn("user", text)

    def assistant(self, text: str) -> Context:
        """A whole assistant turn (an example answer, or a reply produced elsewhere)."""
        return self.turn("assistant", text)

    def turn(self, role: str, text: str) -> Context:
        """A chat turn of any role the chat template takes (e.g. "tool")."""
        self._live()
        self._pending.append({"kind": "turn", "role": role, "text": text})
        return self

    def fill(self, text: str = "") -> Context:
        """Append `text` as it is (no chat template), then prefill the whole context now,
        so its KV is warm before a later call (or a fork, or a snapshot) needs it."""
        self._live()
        if text:
            self._pending.append({"kind": "text", "text": text})
        answer = self._post({"fill_only": True})
        self._commit(answer, keep_output=False)
        return self

    def append(self, token_ids: Sequence[int]) -> Context:
        """Append token ids as they are (a decoding loop's choices)."""
        self._live()
        if self._pending:
            self.fill()
        self._ids.extend(int(t) for t in token_ids)
        return self

    # --- generating -------------------------------------------------------------------

    def generate(self, max_tokens: int = 256, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = -1, stop: Sequence[str] | None = None, seed: int | None = None,
                 *, regex: str | None = None, json_schema: dict[str, Any] | None = None,
                 grammar: str | None = None, logit_bias: dict[int, float] | None = None,
                 logprobs: int | None = None) -> Generation:
        """Generate and append the output to the context. `regex`, `json_schema` and
        `grammar` (at most one) constrain the output; `logit_bias` maps token ids to a bias;
        `logprobs`: that many likeliest alternatives per token (0: the token's own only)."""
        self._live()
        self._open_reply()
        body: dict[str, Any] = {
            "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
            "top_k": top_k, "stop": list(stop or []), "seed": seed, "regex": regex,
            "json_schema": json_schema, "grammar": grammar, "logprobs": logprobs,
            "logit_bias": {str(k): v for k, v in (logit_bias or {}).items()},
        }
        answer = self._post({k: v for k, v in body.items() if v is not None})
        self._commit(answer, keep_output=True)
        return _generation(answer)

    def step(self, top: int = 20) -> list[Candidate]:
        """The next token's distribution: the `top` likeliest tokens, likeliest first. The
        context is unchanged (`append` the chosen ids)."""
        self._live()
        self._open_reply()
        answer = self._post({"max_tokens": 1, "temperature": 0.0, "logprobs": top})
        self._commit(answer, keep_output=False)
        (position,) = _generation(answer).logprobs or ()
        return sorted(position.top, key=lambda c: -c.logprob)

    # --- tools ------------------------------------------------------------------------

    def tool(self, tool: str, command: str | Sequence[str], *, timeout_s: float | None = None,
             fill_every: int = 2000,
             on_output: Callable[[str, str], None] | None = None) -> dict[str, Any]:
        """Run `command` in the program's `tool` environment (the daemon's tool manager, as
        `POST /v1/programs/{id}/tools/{tool}/exec` does) and append its output to the
        context as it arrives: each time `fill_every` characters of it have come, they are
        prefilled (`fill`), so the KV is warm when the tool ends (0: append only at the
        end, unfilled). `on_output(stream, text)` sees every piece too. Returns the exec's
        result (exit_code, stdout, stderr, reason, ...); a failed environment raises
        LLMError. stderr is passed to `on_output` but not appended."""
        self._program_body("tool")  # refuses a context without a program
        body: dict[str, Any] = {"command": command, "stream": True}
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        path = f"/programs/{self._endpoint.program_id}/tools/{tool}/exec"
        unfilled: list[str] = []
        result: dict[str, Any] | None = None
        for kind, data in self._events(path, body):
            if kind == "output":
                if on_output is not None:
                    on_output(str(data["stream"]), str(data["text"]))
                if data["stream"] == "stdout":
                    unfilled.append(str(data["text"]))
                    if fill_every and sum(map(len, unfilled)) >= fill_every:
                        self.fill("".join(unfilled))
                        unfilled = []
            elif kind == "error":
                raise LLMError(f"agentd.Context.tool: {data['error']['message']}")
            elif kind == "result":
                result = data
        if result is None:
            raise LLMError("agentd.Context.tool: the stream ended without a result")
        if unfilled and fill_every:
            self.fill("".join(unfilled))
        elif unfilled:
            self._pending.append({"kind": "text", "text": "".join(unfilled)})
        return result

    def _events(self, path: str, body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        """A streamed answer's server-sent events: (event, its JSON data). Sent to the
        daemon that answered last (a stream is not retried at another)."""
        url = f"{failover.daemons(self._endpoint.base).current()}{path}"
        try:
            with _client().stream("POST", url, json=body, headers=self._endpoint.headers,
                                  timeout=LLM_TIMEOUT_S) as r:
                if r.status_code >= 400:
                    r.read()
                    raise LLMError(f"agentd.Context: POST {path} answered {r.status_code}: "
                                   f"{_message(r)}")
                kind = "message"
                for line in r.iter_lines():
                    if line.startswith("event:"):
                        kind = line.partition(":")[2].strip()
                    elif line.startswith("data:"):
                        yield kind, json.loads(line.partition(":")[2])
                        kind = "message"
        except httpx.HTTPError as exc:
            raise LLMError(f"agentd.Context: cannot reach {url}: {exc}") from exc

    # --- sharing ----------------------------------------------------------------------

    def fork(self, n: int = 1) -> list[Context]:
        """`n` children holding this context's tokens. Pending turns are prefilled first,
        so the children share one computed prefix through the engine's prefix cache."""
        self._live()
        if n < 1:
            raise ValueError("fork(n): n must be at least 1")
        if self._pending:
            self.fill()
        self._note("fork", {"n": n})
        return [copy.copy(self) for _ in range(n)]

    def snapshot(self, name: str) -> Context:
        """Keep this context's tokens under `name` for the tenant's programs (prefilled
        first, so the next program that opens it finds its KV warm)."""
        self._live()
        if self._pending:
            self.fill()
        self._request("PUT", f"/contexts/snapshots/{name}",
                      {"model": self.model, "token_ids": self._ids, **self._ids_body()})
        self._snapshot = name  # shared from now on with the programs that open it
        return self

    @classmethod
    def open(cls, name: str, *, program_id: str | None = None,
             session_id: str | None = None) -> Context:
        """A context holding the tokens of the tenant's snapshot `name`."""
        probe = cls(program_id=program_id, session_id=session_id)
        # Opened in a program: the daemon fills the snapshot on the program's worker when it
        # went cold there, while the program goes on (its next generate waits for it).
        query = {k: v for k, v in (("program_id", probe._endpoint.program_id),
                                    ("session_id", probe._endpoint.session_id)) if v}
        body = probe._request("GET", f"/contexts/snapshots/{name}", None, query)
        ctx = cls(str(body["model"]), program_id=program_id, session_id=session_id,
                  token_ids=body["token_ids"])
        ctx._snapshot = name  # every generate names it: the KV layer holds its ids once
        return ctx

    @classmethod
    def delete_snapshot(cls, name: str) -> None:
        cls()._request("DELETE", f"/contexts/snapshots/{name}", None)

    @contextlib.contextmanager
    def idle(self) -> Iterator[None]:
        """Around a tool wait: the daemon sees a tool span of the context's program (it is
        ACTING from the start, and the KV layer weighs and may pause it as for a tool
        agentd runs). Needs a program: a run's, or `program_id` given in local mode."""
        body = self._program_body("idle")
        self._request("POST", "/contexts/idle", {**body, "state": "start"})
        try:
            yield
        finally:
            self._request("POST", "/contexts/idle", {**body, "state": "end"})

    def pin(self) -> Context:
        """Keep the context's program resident: the KV layer never pauses it while pinned
        (a few programs per tenant; more is an error). Needs a program, as `idle` does."""
        self._pinned(True)
        return self

    def unpin(self) -> Context:
        self._pinned(False)
        return self

    def _pinned(self, pinned: bool) -> None:
        self._request("POST", "/contexts/pin", {**self._program_body("pin"), "pinned": pinned})

    def _program_body(self, what: str) -> dict[str, Any]:
        self._live()
        if self._endpoint.program_id is None:
            raise ValueError(f"Context.{what} needs a program: run in a workflow, or give "
                             "Context(program_id=...)")
        return self._ids_body()

    def _ids_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self._endpoint.program_id is not None:
            body["program_id"] = self._endpoint.program_id
        if self._endpoint.session_id is not None:
            body["session_id"] = self._endpoint.session_id
        return body

    def _note(self, kind: str, extra: dict[str, Any]) -> None:
        """Tell the daemon of a fork or drop, for the program's trace: only a context with
        a program has one (in local mode without `program_id` each call is its own)."""
        if self._endpoint.program_id is not None:
            self._request("POST", f"/contexts/{kind}",
                          {**self._ids_body(), "tokens": len(self._ids), **extra})

    def drop(self) -> None:
        """Forget the context: later use raises ContextDropped. Its KV blocks stay in the
        engine's prefix cache as free blocks until the engine evicts them. Dropping a
        dropped context does nothing."""
        if self._dropped:
            return
        self._note("drop", {})
        self._ids, self._pending, self._dropped = [], [], True

    def __copy__(self) -> Context:
        child = Context.__new__(Context)
        child._endpoint, child._model = self._endpoint, self._model
        child._ids, child._pending = list(self._ids), list(self._pending)
        child._dropped, child._snapshot = False, self._snapshot
        return child

    # --- the wire ---------------------------------------------------------------------

    def _live(self) -> None:
        if self._dropped:
            raise ContextDropped("the context was dropped")

    def _open_reply(self) -> None:
        if self._pending and self._pending[-1]["kind"] == "turn":
            self._pending.append({"kind": "reply"})

    def _post(self, params: dict[str, Any]) -> dict[str, Any]:
        body = {"model": self.model, "token_ids": self._ids, "segments": self._pending,
                **params}
        if self._endpoint.program_id is not None:
            body["program_id"] = self._endpoint.program_id
        if self._endpoint.session_id is not None:
            body["session_id"] = self._endpoint.session_id
        if self._snapshot is not None:
            body["snapshot"] = self._snapshot
        return self._request("POST", "/contexts/generate", body)

    def _commit(self, answer: dict[str, Any], keep_output: bool) -> None:
        self._ids.extend(answer["segment_token_ids"])
        self._pending = []
        if keep_output:
            self._ids.extend(answer["token_ids"])

    def _request(self, method: str, path: str, body: dict[str, Any] | None,
                 params: dict[str, str] | None = None) -> dict[str, Any]:
        url = f"{self._endpoint.base}{path}"
        try:
            r = failover.daemons(self._endpoint.base).send(lambda base: _client().request(
                method, f"{base}{path}", json=body, params=params,
                headers=self._endpoint.headers, timeout=LLM_TIMEOUT_S))
        except httpx.HTTPError as exc:
            raise LLMError(f"agentd.Context: cannot reach {url}: {exc}") from exc
        if r.status_code == 404 and path.startswith("/contexts/snapshots/"):
            raise SnapshotNotFound(f"agentd.Context: no snapshot {path.rsplit('/', 1)[1]!r}")
        if r.status_code >= 400:
            raise LLMError(f"agentd.Context: {method} {path} answered {r.status_code}: "
                           f"{_message(r)}")
        return {} if r.status_code == 204 else dict(r.json())


_local = threading.local()


def _client() -> httpx.Client:
    """This thread's client: its connections are kept between calls (a new client per call
    cost about 25 ms of CPU, and an agent makes dozens of calls). One per thread, since a
    program's agent calls may run in threads of their own."""
    client: httpx.Client | None = getattr(_local, "client", None)
    if client is None:
        client = _local.client = httpx.Client()
    return client


def _message(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text[:500]


def _generation(answer: dict[str, Any]) -> Generation:
    usage = answer["usage"]
    raw = answer.get("logprobs")
    logprobs = None if raw is None else tuple(
        TokenLogprob(int(t["token_id"]), str(t["token"]), float(t["logprob"]),
                     tuple(Candidate(int(c["token_id"]), str(c["token"]), float(c["logprob"]))
                           for c in t["top"]))
        for t in raw)
    return Generation(text=str(answer["text"]), token_ids=tuple(answer["token_ids"]),
                      finish_reason=str(answer["finish_reason"]), logprobs=logprobs,
                      prompt_tokens=int(usage["prompt_tokens"]),
                      cached_tokens=int(usage["cached_tokens"]),
                      shared_prefix_tokens=int(answer.get("shared_prefix_tokens", 0)))
