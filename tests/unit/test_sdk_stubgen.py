"""`agentctl stubgen agent.yaml`: a YAML declaration becomes an importable stub module
whose functions return futures, with the declared directives; bad declarations are
refused with the field named; the SWE example's stubs are what stubgen makes."""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentd
from agentd.stubgen import StubgenError, generate, parse
from console import agentctl

ROOT = Path(__file__).resolve().parents[2]

IMPL = '''import threading
import time


class Worker:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def work(self, item: str, delay: float = 0.0) -> str:
        time.sleep(delay)  # a call that takes the time the test gives it
        self.seen.append(item)
        return f"{item}@{threading.current_thread().name}"

    def count(self) -> int:
        return len(self.seen)
'''

YAML = '''agent: worker
class: Worker
module: worker_impl
directives:
  max_instances: 3
functions:
  - name: work
    doc: Do one item.
    params:
      - {name: item, type: str}
      - {name: delay, type: float, default: 0.0}
    returns: str
  - name: count
    returns: int
'''


@pytest.fixture
def pkg(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "worker_impl.py").write_text(IMPL)
    (tmp_path / "worker.yaml").write_text(YAML)
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in ("worker", "worker_impl"):
        sys.modules.pop(name, None)


def test_cli_writes_an_importable_stub_whose_calls_are_futures(pkg: Path,
                                                               capsys: Any) -> None:
    assert agentctl.main(["stubgen", str(pkg / "worker.yaml")]) == 0
    assert "wrote" in capsys.readouterr().out
    stub: Any = importlib.import_module("worker")
    assert stub.DIRECTIVES == {"max_instances": 3}
    with agentd.local_runtime() as rt:
        t0 = time.monotonic()
        futures = [stub.work(f"i{k}", 0.3) for k in range(3)]
        assert all(isinstance(f, agentd.Future) for f in futures)
        assert time.monotonic() - t0 < 0.2  # returned at once
        agentd.wait(futures, timeout=5)
        assert time.monotonic() - t0 < 0.8  # three instances ran them side by side
        assert {str(f).split("@")[0] for f in futures} == {"i0", "i1", "i2"}
        assert {agentd.as_future(f).executor for f in futures} == {
            "Worker#0", "Worker#1", "Worker#2"}
        created = [e for e in rt.events if e["event"] == "future.created"]
        assert {e["name"] for e in created} == {"Worker.work"}
    with agentd.local_runtime():
        stub.init(stateful=True, max_instances=1)  # the paper's planner.init(...)
        assert [int(stub.count()) for _ in range(2)] == [0, 0]
        order = [stub.work(f"s{k}") for k in range(4)]
        agentd.wait(order, timeout=5)
        assert {agentd.as_future(f).executor for f in order} == {"Worker#0"}
        assert int(stub.count()) == 4


def test_check_reports_a_stale_stub(pkg: Path, capsys: Any) -> None:
    yaml_path = str(pkg / "worker.yaml")
    assert agentctl.main(["stubgen", yaml_path, "--check"]) == 1  # nothing written yet
    assert agentctl.main(["stubgen", yaml_path, "-o", str(pkg / "w.py")]) == 0
    assert agentctl.main(["stubgen", yaml_path, "-o", str(pkg / "w.py"), "--check"]) == 0
    (pkg / "worker.yaml").write_text(YAML.replace("max_instances: 3", "max_instances: 2"))
    assert agentctl.main(["stubgen", yaml_path, "-o", str(pkg / "w.py"), "--check"]) == 1
    assert "not up to date" in capsys.readouterr().err


@pytest.mark.parametrize("change, field", [
    (("agent: worker", "agent: 2worker"), "agent: '2worker' is not a valid Python identifier"),
    (("class: Worker", "class: for"), "class: 'for' is not a valid Python identifier"),
    (("max_instances: 3", "max_instances: 0"), "directives: need 0 <= min_instances"),
    (("max_instances: 3", "speed: 3"), "directives.speed: unknown"),
    (("{name: item, type: str}\n      - {name: delay, type: float, default: 0.0}",
      "{name: item, type: str, default: x}\n      - {name: delay, type: float}"),
     "functions[0].params[1]: a parameter without a default"),
    (("{name: item, type: str}", "{name: item, type: 'str; import os'}"),
     "functions[0].params[0].type: 'str; import os' is not a type expression"),
    (("{name: item, type: str}", "{name: item, type: 'os.system(1)'}"),
     "functions[0].params[0].type: 'os.system(1)' is not a plain type expression"),
    (("  - name: count", "  - name: work"), "functions[1].name: 'work' is declared twice"),
    (("  - name: count", "  - name: init"), "functions[1].name: 'init' is reserved"),
    (("functions:", "funcs:"), "funcs: unknown key"),
    (("agent: worker", "agent: [worker"), "not valid YAML at line 2"),
])
def test_bad_declarations_name_the_field(change: tuple[str, str], field: str) -> None:
    with pytest.raises(StubgenError) as info:
        parse(YAML.replace(*change))
    assert str(info.value).startswith(field), str(info.value)


def test_cli_bad_input_is_one_line_and_exit_1(tmp_path: Path, capsys: Any) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent: x\nclass: X\nfunctions: []\n")
    assert agentctl.main(["stubgen", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "functions: declare at least one function" in err
    assert agentctl.main(["stubgen", str(tmp_path / "missing.yaml")]) == 1
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("agent", ["planner", "developer", "tester"])
def test_swe_example_stubs_are_generated_ones(agent: str) -> None:
    swe = ROOT / "examples" / "swe"
    name, source = generate((swe / f"{agent}.yaml").read_text(), f"{agent}.yaml")
    assert name == agent and (swe / f"{agent}.py").read_text() == source
