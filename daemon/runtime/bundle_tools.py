"""Tools declared in a workflow bundle's manifest.

`POST /v1/workflows` may carry `tools`: tool specs by name, the same schema as the
config's `[tools.NAME]` tables and parsed by the same code (`tools.spec.parse_table`),
as untrusted specs (no bind mounts, no host network). They are stored in the version's
`manifest.json`. The rules:

- Upload: every spec must parse; the first that does not is a 400 naming
  `tools.NAME[.FIELD]`, and nothing is registered.
- `backend = "process"` runs commands on the host as the daemon's user, so a bundle
  declaring one needs scope `operator` to be uploaded (403 `insufficient_scope`), as a
  spec in a request does. Once an operator uploaded it, runs of that version may use it,
  as they may use a process tool the operator configured.
- Names are scoped to the bundle: only the programs of its runs (the run's program and
  its per-agent programs `<program>.<agent>.<i>`) see them.
- A bundle tool never takes the place of an operator's configured tool: a name the
  config has is refused at upload (409 `tool_name_taken`), and if the operator
  configures that name later, runs of the bundle are refused (409, naming the tool)
  until it is uploaded again under another name.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

from daemon.runtime.bundles import BundleError
from tools.spec import SpecError, ToolSpec, parse_table

MAX_TOOLS = 32
INSUFFICIENT_SCOPE = "insufficient_scope"
NAME_TAKEN = "tool_name_taken"


def check_tools(raw: Any, *, configured: Container[str], operator: bool
                ) -> dict[str, dict[str, Any]]:
    """The manifest's `tools` table, checked; raises BundleError naming the field."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise BundleError("tools must be a table of tool specs by name", "tools")
    if len(raw) > MAX_TOOLS:
        raise BundleError(f"too many tools ({len(raw)} > {MAX_TOOLS})", "tools")
    for name, table in raw.items():
        spec = _parse(name, table)
        if spec.backend == "process" and not operator:
            raise BundleError(
                f"tools.{name}.backend: 'process' runs host commands as the daemon's user; "
                "a bundle declaring it needs scope operator (or use the docker backend)",
                f"tools.{name}.backend", INSUFFICIENT_SCOPE)
        _check_free(name, configured)
    return {name: dict(table) for name, table in raw.items()}


def bundle_specs(manifest: Mapping[str, Any], configured: Container[str]
                 ) -> dict[str, ToolSpec]:
    """The specs of a registered version's tools, for a run about to start."""
    tables = manifest.get("tools") or {}
    for name in tables:
        _check_free(name, configured)
    return {name: _parse(name, table) for name, table in tables.items()}


def _parse(name: Any, table: Any) -> ToolSpec:
    if not isinstance(name, str):
        raise BundleError("tools: names must be strings", "tools")
    try:
        return parse_table(name, table)
    except SpecError as exc:
        param = f"tools.{name}" + (f".{exc.field}" if exc.field else "")
        raise BundleError(f"tools.{name}: {exc.message}", param, "bad_tool_spec") from exc


def _check_free(name: str, configured: Container[str]) -> None:
    if name in configured:
        raise BundleError(
            f"tools.{name}: the operator's config defines a tool of that name; a bundle "
            "tool may not replace it, so name it differently", f"tools.{name}", NAME_TAKEN)
