"""Context pins (agentd.Context.pin): a program the KV layer never pauses while pinned,
at most MAX_PINS_PER_TENANT programs per tenant at a time.

A pin is the program's `pinned` flag, the one the KV policy already skips when it picks
programs to pause (scheduling/kv/plan.py) and that a migration or a non-preemptable agent
sets too. So an unpin clears only a pin this registry set: a program pinned for another
reason stays pinned. A pin ends with the unpin or with the program (an ended program no
longer counts against its tenant).
"""

from __future__ import annotations

import threading
from typing import Any

from litestar import Request

from daemon.core.core import Core
from daemon.errors import ApiError
from daemon.state import ProgramState

MAX_PINS_PER_TENANT = 8
_STATE_KEY = "agentd.context_pins"


class ContextPins:
    def __init__(self, max_per_tenant: int = MAX_PINS_PER_TENANT) -> None:
        self.max_per_tenant = max_per_tenant
        self._tenant_of: dict[str, str] = {}  # program id -> tenant, for pins set here
        self._lock = threading.Lock()

    def set(self, core: Core, program: ProgramState, tenant: str, pinned: bool) -> None:
        with self._lock:
            self._forget_ended(core)
            ours = program.id in self._tenant_of
            if pinned and not ours and not program.pinned:
                held = sum(1 for t in self._tenant_of.values() if t == tenant)
                if held >= self.max_per_tenant:
                    raise ApiError(409, f"tenant '{tenant}' has {held} pinned programs, the "
                                   "limit; unpin one first", "pin_limit", param="pinned")
                self._tenant_of[program.id] = tenant
                self._apply(core, program, True)
            elif not pinned and ours:
                del self._tenant_of[program.id]
                self._apply(core, program, False)

    def _forget_ended(self, core: Core) -> None:
        for program_id in [p for p in self._tenant_of if p not in core.programs]:
            del self._tenant_of[program_id]

    @staticmethod
    def _apply(core: Core, program: ProgramState, pinned: bool) -> None:
        program.pinned = pinned
        core.writer.update("programs", program.id, pinned=pinned)
        core.writer.trace("context.pinned" if pinned else "context.unpinned",
                          session_id=program.session_id, program_id=program.id)


def of(request: Request[Any, Any, Any]) -> ContextPins:
    """The app's registry, made on first use."""
    pins = request.app.state.get(_STATE_KEY)
    if not isinstance(pins, ContextPins):
        pins = ContextPins()
        request.app.state[_STATE_KEY] = pins
    return pins
