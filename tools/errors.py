"""One error type for everything that goes wrong around a tool environment.

A non-zero exit or a timeout of a command is *not* an error (agents' tools fail all the time
and the program wants the output); it is an `ExecResult` with a reason. `ToolError` is for
the environment itself: it could not be built, it died, or the engine is unreachable.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Reason(StrEnum):
    OK = "ok"
    EXIT = "exit"  # the command ran and exited non-zero
    TIMEOUT = "timeout"  # the command outlived its timeout and was killed
    OOM = "oom"  # the command was killed by the memory limit
    KILLED = "killed"  # killed by a signal that was not ours and not the OOM killer
    BAD_SPEC = "bad_spec"
    BAD_PATH = "bad_path"
    UNKNOWN_IMAGE = "unknown_image"
    START_FAILED = "start_failed"
    SETUP_FAILED = "setup_failed"
    DEAD = "dead"  # the container (or working dir) is gone or stopped
    ENGINE_DOWN = "engine_down"
    ENGINE_ERROR = "engine_error"  # the engine answered, refusing the request
    UNKNOWN_TOOL = "unknown_tool"
    RELEASED = "released"  # the program was released while this was pending


def tail(text: str, limit: int = 2000) -> str:
    """The end of a stream is where the error message is."""
    return text if len(text) <= limit else "…" + text[-limit:]


class ToolError(Exception):
    def __init__(
        self,
        reason: Reason,
        message: str,
        *,
        tool: str = "",
        program_id: str = "",
        exit_code: int | None = None,
        stderr: str = "",
    ) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.tool = tool
        self.program_id = program_id
        self.exit_code = exit_code
        self.stderr_tail = tail(stderr)

    def to_dict(self) -> dict[str, Any]:
        return {
            "reason": str(self.reason),
            "message": self.message,
            "tool": self.tool,
            "program_id": self.program_id,
            "exit_code": self.exit_code,
            "stderr_tail": self.stderr_tail,
        }
