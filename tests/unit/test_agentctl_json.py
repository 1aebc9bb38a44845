"""`--json` is accepted by every agentctl command, and the ones that print data without a
daemon print JSON with it (those that need a daemon: tests/integration/test_program_expiry_daemon.py
for `top --once --json`, tests/integration/test_agentctl.py for the rest)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from console.agentctl import build_parser, main
from tests.unit.test_agentctl_help import _commands

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "swe" / "planner.yaml"


# A command with actions (`policy`): its actions take the flags.
LEAVES = [c for c in _commands() if not any(o[:len(c)] == c and o != c for o in _commands())]


@pytest.mark.parametrize("argv", LEAVES, ids=" ".join)
def test_every_command_says_it_takes_json(argv: list[str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    assert "--json" in capsys.readouterr().out


def test_stubgen_prints_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    yaml = tmp_path / "planner.yaml"
    shutil.copy(EXAMPLE, yaml)
    out = tmp_path / "planner.py"
    assert main(["stubgen", str(yaml), "-o", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"stub": str(out), "agent": "planner",
                                                   "written": True}
    assert main(["stubgen", str(yaml), "-o", str(out), "--check", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["up_to_date"] is True
