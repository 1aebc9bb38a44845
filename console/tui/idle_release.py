"""Bulk release of idle programs from the programs view: ask the daemon which programs
have been quiet for `AgentdTui.idle_release_s` (a dry run), show them in a confirmation,
and release them only on yes (POST /v1/programs/release-idle)."""

from __future__ import annotations

from typing import Any

from textual.message import Message

LISTED = 8


class IdlePlanned(Message):
    """The dry run's answer: the programs a release would end."""

    def __init__(self, idle_s: float, planned: list[dict[str, Any]]) -> None:
        super().__init__()
        self.idle_s = idle_s
        self.planned = planned


def idle_question(idle_s: float, planned: list[dict[str, Any]]) -> str:
    lines = [f"release {len(planned)} program(s) idle for {idle_s:g} s or more?"]
    lines += [f"  {p['id']}  tenant {p.get('tenant', '-')}  idle {p.get('idle_s', 0):.0f} s"
              for p in planned[:LISTED]]
    if len(planned) > LISTED:
        lines.append(f"  … and {len(planned) - LISTED} more")
    return "\n".join(lines)


def released(answer: Any) -> str:
    return f"released {answer['released']} program(s)"
