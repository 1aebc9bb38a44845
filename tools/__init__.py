"""Tool environments held by programs: specs, docker and process backends, the lifecycle
manager and reconciliation. See `tools.manager` for the entry point."""

from tools.base import Environment, ExecResult, Resource
from tools.docker_backend import DockerBackend
from tools.docker_hosts import DockerHosts
from tools.errors import Reason, ToolError
from tools.manager import ToolManager
from tools.process_backend import ProcessBackend
from tools.reclaim import reconcile
from tools.spec import SpecError, ToolSpec, merge_spec, parse_spec, parse_table

__all__ = [
    "DockerBackend",
    "DockerHosts",
    "Environment",
    "ExecResult",
    "ProcessBackend",
    "Reason",
    "Resource",
    "SpecError",
    "ToolError",
    "ToolManager",
    "ToolSpec",
    "merge_spec",
    "parse_spec",
    "parse_table",
    "reconcile",
]
