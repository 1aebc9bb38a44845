"""Every agentctl command's --help prints and exits 0 (a bad help string is a traceback)."""

from __future__ import annotations

import argparse

import pytest

from console.agentctl import build_parser


def _commands() -> list[list[str]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = []
    for name, child in sub.choices.items():
        out.append([name])
        for action in child._actions:
            if isinstance(action, argparse._SubParsersAction):
                out += [[name, grandchild] for grandchild in action.choices]
    return out


@pytest.mark.parametrize("argv", _commands(), ids=" ".join)
def test_help_exits_zero(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([*argv, "--help"])
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out
