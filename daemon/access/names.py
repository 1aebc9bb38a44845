"""Tenant names, shared by the gateway, the token CLI and the [slo.tenants] config table
(dependency-free so the CLI and config loading stay light)."""

from __future__ import annotations

import re

DEFAULT_TENANT = "default"  # auth off, and sessions from before tenants
INTERNAL_TENANT = "agentd-internal"  # the daemon's own calls (the LLM meta selector's)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def tenant_problem(name: str) -> str | None:
    """Why `name` cannot be a tenant, or None. Names appear in metric labels, trace
    fields and config table keys, so they are kept to a plain identifier."""
    if _NAME.fullmatch(name):
        return None
    return (f"{name[:80]!r} is not a tenant name: 1-64 characters from A-Z a-z 0-9 "
            "'.' '_' '-', starting with a letter or digit")
