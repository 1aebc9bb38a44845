"""Tenants: who a request is scheduled and rate-limited as (the gateway's side, which
resolves a caller's tenant, is daemon/api/tenants.py).

- A token may carry a tenant (`agentd token create --tenant NAME`). A token made without
  one is a tenant of its own, named by its id, so the per-token rate buckets that existed
  before tenants stay as they were.
- An operator token, or any caller while auth is off, may name the tenant of a request
  (the `tenant` body field or the `X-Tenant` header): a front end that serves several
  customers through one token says whom each call is for. Any other token is refused
  (403 naming the field): a tenant's weight is not something a client can claim.
- A workflow run's token acts as the tenant of its run's session.
- With auth off, and for sessions from before tenants, the tenant is `default`.

A request runs as its caller's tenant; the SLO stack (WFQ/stride weights, per-tenant SLO
overrides, fairness in the long view) and the rate limiter key on that same name. A
session records the tenant of the request that created it, so for its owner the two
agree; a caller of another tenant posting into it still runs as itself, so nobody borrows
another tenant's weight or drains its bucket.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from daemon.core.core import Core
    from daemon.state import ProgramState
    from daemon.workers.protocol import ChatMessage


async def open_program(core: Core, program_id: str | None, session_id: str | None,
                       tenant: str, messages: Sequence[ChatMessage] | None = None
                       ) -> ProgramState:
    """`core.ensure_program`, recording `tenant` on a session it creates and as the
    tenant of the program's next request. A chat request that names no program gives its
    `messages`: with lineage inference on, the program they continue, if any, is this
    tenant's program the request joins (daemon/core/lineage.py)."""
    if program_id is None and messages is not None and core.lineage.inference:
        asked = core.lineage.ask(tenant, messages, session_id)
        continued = None if asked.program is None else asked.program.id
        program = await open_program(core, continued, session_id, tenant)
        core.lineage.opened(program, asked)
        return program
    tenants = core.slo.tenants
    live = program_id is not None and program_id in core.programs  # creates no session
    named = session_id or program_id  # the session a new program would get
    # Asked before the core creates anything, so a session made by this call reads absent.
    absent = not live and named is not None and await tenants.of(named) is None
    program = await core.ensure_program(program_id, session_id)
    if named is None:
        tenants.created(program.session_id, tenant, remember=False)
    elif absent and program.session_id == named:
        tenants.created(named, tenant)
    core.slo.tagging.tenants[program.id] = tenant
    return program
