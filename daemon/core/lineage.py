"""Programs recognised without a program_id: lineage inference.

An agent framework that knows nothing of agentd sends every LLM call as a new chat
request carrying the whole conversation so far: the previous request's messages, the
reply it got, then what happened since (tool results, a user turn). That shape names the
program as well as an id would. When a request's message list extends an earlier
request's messages plus its reply, the request joins that request's program, so the KV
scheduler sees one program, not a stream of one-call programs it can only forget.

How a match is found: each message is reduced to canonical JSON of its role, content
and tool calls, and the digests chain (a prefix's digest covers every message before
it). When a tracked program's request finishes, the digest of its messages plus its
reply is remembered, keyed by tenant, so one tenant never joins another's program. A
new request looks up the digest of each of its prefixes that ends with an assistant
message, longest first. Memory is bounded: the remembered replies are an LRU of
`REPLIES_REMEMBERED`, one per program (its latest), dropped when the program ends.

Nobody calls release on such a program, so it ends itself: `Config.lineage_idle_s`
after its last request ended (or was matched), with no request running, it is stopped,
by the idle timeout every program has (daemon/core/expiry.py, which records
`program.expired`), with `lineage_idle_s` as its timeout.
A Responses API chain (`previous_response_id`) is held the same way (daemon/api/responses.py).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from daemon import lru
from daemon.state import ProgramState, ProgramStatus, RequestState, RequestStatus
from daemon.workers.protocol import ChatMessage, Finish
from scheduling.kv.decisions import Pause

if TYPE_CHECKING:
    from daemon.core.core import Core

# Latest replies remembered across all programs; a forgotten one makes its program's
# next request start a new program (the old one then ends when idle).
REPLIES_REMEMBERED = 100_000
_DIGEST_BYTES = 16
# A held program quiet for QUIET_FACTOR times the longest it has been quiet between two of
# its requests (at least QUIET_FLOOR_S) is likely done: it gives up its KV room.
QUIET_FACTOR = 2.0
QUIET_FLOOR_S = 2.0
_ENDED = (ProgramStatus.STOPPED, ProgramStatus.FAILED)
_canonical_json = msgspec.json.Encoder(order="sorted")


def canonical(message: ChatMessage) -> bytes:
    """What of a message identifies it: its role, content and tool calls. Surrounding
    whitespace of the content is not part of it (clients strip replies), nor is a missing
    content told from an empty one (an assistant turn of tool calls comes back with
    either); a call is its function's name and arguments as JSON values (a client may
    re-serialise them), not its id."""
    calls = [[call.name, _arguments(call.arguments)] for call in message.tool_calls]
    return _canonical_json.encode([message.role, message.content.strip(), calls])


def _arguments(text: str) -> Any:
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return text  # not JSON: as it is


def extend(digest: bytes, message: ChatMessage) -> bytes:
    """The digest of a message list that extends the one `digest` covers by `message`."""
    return hashlib.blake2b(digest + canonical(message), digest_size=_DIGEST_BYTES).digest()


def prefix_digests(messages: Sequence[ChatMessage]) -> list[bytes]:
    """digests[j] covers messages[:j]; digests[0] is the empty list's."""
    digests = [b""]
    for message in messages:
        digests.append(extend(digests[-1], message))
    return digests


def reply_turn(req: RequestState, finish: Finish) -> ChatMessage:
    """The assistant turn a request's reply becomes in the client's next request: the
    engine's parsed content and calls where the request had tools, else the text. The
    calls are those the APIs answer with (daemon/api/chat_tools.py `calls_of`: none for
    tool_choice "none", the first only without parallel calls)."""
    parsed, tools = finish.reply, req.tools
    if parsed is None:
        return ChatMessage(role="assistant", content=req.text_so_far)
    calls = [] if tools is None or tools.choice == "none" else parsed.tool_calls
    if tools is not None and not tools.parallel:
        calls = calls[:1]
    return ChatMessage(role="assistant", content=parsed.content or "", tool_calls=calls)


@dataclass(frozen=True, slots=True)
class Asked:
    """A chat request as lineage sees it: its tenant, the digest of its messages and the
    program it continues (None: a new one), with the messages that matched."""

    tenant: str
    digest: bytes
    program: ProgramState | None = None
    prefix_messages: int = 0


@dataclass(slots=True)
class _Held:
    """A program the daemon ends itself: whose request asked what, its last reply, and
    its clock: when it last went quiet and the longest it has been quiet before."""

    tenant: str
    asked: bytes
    quiet_since: float
    longest_gap: float = 0.0
    reply: tuple[str, bytes] | None = None  # the key of its remembered reply
    paused: bool = False  # its room given up in this quiet spell
    timer: asyncio.TimerHandle | None = None


class Lineage:
    """Lineage inference and the idle end of the programs it holds (module docstring)."""

    def __init__(self, core: Core, remember: int = REPLIES_REMEMBERED) -> None:
        self._core = core
        self.inference = core.config.lineage_inference
        self.idle_s = core.config.lineage_idle_s
        self._replies: lru.Lru[tuple[str, bytes], str] = lru.Lru(remember)
        self._held: dict[str, _Held] = {}
        core.on_request_end.append(self.answered)
        core.on_program_end.append(self.forget)

    def ask(self, tenant: str, messages: Sequence[ChatMessage],
            session_id: str | None = None) -> Asked:
        """The program a request with `messages` continues, if inference is on and one
        does (in `session_id`, when the request names a session)."""
        digests = prefix_digests(messages)
        if self.inference:
            for j in range(len(messages), 0, -1):
                if messages[j - 1].role != "assistant":
                    continue
                program = self._continued((tenant, digests[j]), session_id)
                if program is not None:
                    return Asked(tenant, digests[-1], program, j)
        return Asked(tenant, digests[-1])

    def _continued(self, key: tuple[str, bytes], session_id: str | None
                   ) -> ProgramState | None:
        program_id = self._replies.get(key)
        held = self._held.get(program_id) if program_id is not None else None
        program = self._core.programs.get(program_id) if program_id is not None else None
        if held is None or program is None or program.status in _ENDED \
                or program.active_request is not None:
            return None  # ended, or busy: a concurrent copy of one conversation is not it
        if session_id is not None and session_id != program.session_id:
            return None
        now = self._core.clock()
        held.longest_gap = max(held.longest_gap, now - held.quiet_since)
        held.quiet_since = now  # and no idle end between this match and its submit
        self._core.expiry.lived(program)
        return program

    def opened(self, program: ProgramState, asked: Asked) -> None:
        """`program` is about to run the request `asked`; from now on the daemon ends it."""
        held = self._held.get(program.id)
        if held is None:
            held = self._held[program.id] = _Held(asked.tenant, asked.digest, self._core.clock())
            self._core.expiry.limit(program, self.idle_s, "lineage_idle_s")
        held.asked = asked.digest
        if asked.program is not None:
            self._core.writer.trace(
                "program.inferred", session_id=program.session_id, program_id=program.id,
                prefix_messages=asked.prefix_messages)

    def holds(self, program_id: str) -> bool:
        """Whether the program outlives its request: it has a reply a later request can
        continue from. One whose first request failed has none and ends at once."""
        held = self._held.get(program_id)
        return held is not None and held.reply is not None

    def answered(self, req: RequestState, finish: Finish | None) -> None:
        """A request ended (the core's hook): remember a held program's reply, and
        start its quiet clock."""
        held = self._held.get(req.program_id)
        if held is None:
            return
        held.quiet_since, held.paused = self._core.clock(), False
        if finish is not None and req.status == RequestStatus.FINISHED:
            reply = reply_turn(req, finish)
            self._remember(req.program_id, held, (held.tenant, extend(held.asked, reply)))
        if held.reply is not None:
            self._check_at(req.program_id, held, self._quiet_s(held))

    def _remember(self, program_id: str, held: _Held, key: tuple[str, bytes]) -> None:
        if held.reply is not None and self._replies.get(held.reply) == program_id:
            self._replies.pop(held.reply)
        self._replies.pop(key)  # the newest program with this history takes it
        self._replies.setdefault(key, program_id)
        held.reply = key

    def _quiet_s(self, held: _Held) -> float:
        """How long the program may be quiet before it is likely done: twice the longest
        it has been quiet between two requests, at least `QUIET_FLOOR_S`."""
        return min(max(QUIET_FACTOR * held.longest_gap, QUIET_FLOOR_S), self.idle_s)

    def _check_at(self, program_id: str, held: _Held, delay: float) -> None:
        if held.timer is not None:
            held.timer.cancel()
        held.timer = asyncio.get_running_loop().call_later(
            max(delay, 0.0), self._check, program_id)

    def _check(self, program_id: str) -> None:
        """Past its quiet time a program gives up its KV room (past `idle_s` the idle
        timeout ends it: daemon/core/expiry.py)."""
        held = self._held.get(program_id)
        program = self._core.programs.get(program_id)
        if held is None or program is None:
            return
        held.timer = None
        if program.active_request is not None:
            return  # the request's end starts the clock again
        quiet = self._core.clock() - held.quiet_since
        if quiet >= self._quiet_s(held) and not held.paused:
            held.paused = True
            self._give_up_room(program)
        if not held.paused:
            self._check_at(program_id, held, self._quiet_s(held) - quiet)

    def _give_up_room(self, program: ProgramState) -> None:
        """Pause the program as the KV policy would: a waiting program may take its room;
        it stays joinable, and its next request restores it (on its own worker while its
        blocks are cached). An explicit client releases a finished program at once; this
        is the closest an inferred one gets, so its last hold does not keep others out."""
        if program.status == ProgramStatus.ACTING and program.worker_id is not None \
                and not program.pinned and not program.held:
            self._core.kv.apply([Pause(program.id, program.worker_id,
                                       "quiet past its usual tool time (lineage)")])

    def forget(self, program: ProgramState) -> None:
        """The program ended (the core's hook): nothing may join it any more."""
        held = self._held.pop(program.id, None)
        if held is None:
            return
        if held.timer is not None:
            held.timer.cancel()
        if held.reply is not None and self._replies.get(held.reply) == program.id:
            self._replies.pop(held.reply)
