"""Tool specs in a workflow bundle's manifest: the config's schema and checks, errors that
name the manifest field, the process backend only from operators, no shadowing of
configured tools, and a manifest stored only when every spec is good."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from daemon.runtime.bundle_tools import (
    INSUFFICIENT_SCOPE,
    NAME_TAKEN,
    bundle_specs,
    check_tools,
)
from daemon.runtime.bundles import BundleError, BundleStore

BOX = {"image": "agentd-busybox", "memory_mb": 64, "setup": ["mkdir -p /work"]}
SH = {"backend": "process", "exec_timeout_s": 5}


def _error(raw: Any, configured: frozenset[str] = frozenset(), operator: bool = False
           ) -> BundleError:
    with pytest.raises(BundleError) as err:
        check_tools(raw, configured=configured, operator=operator)
    return err.value


def test_good_specs_are_kept_as_written() -> None:
    assert check_tools({"box": BOX}, configured=frozenset(), operator=False) == {"box": BOX}
    assert check_tools(None, configured=frozenset(), operator=False) == {}


@pytest.mark.parametrize(("table", "param"), [
    ({**BOX, "memory_mb": "lots"}, "tools.box.memory_mb"),
    ({**BOX, "colour": "red"}, "tools.box.colour"),
    ({"memory_mb": 64}, "tools.box.image"),
    ({**BOX, "mounts": [{"target": "relative"}]}, "tools.box.mounts[0]"),
    ({**BOX, "name": "other"}, "tools.box.name"),
    ({**BOX, "network": "host"}, "tools.box.network"),
    ({**BOX, "mounts": [{"type": "bind", "source": "/", "target": "/h"}]}, "tools.box.mounts"),
])
def test_a_bad_spec_names_the_manifest_field(table: dict[str, Any], param: str) -> None:
    err = _error({"box": table})
    assert err.param == param and err.code == "bad_tool_spec"
    assert str(err).startswith("tools.box: ")


def test_the_tools_field_itself_must_be_a_table() -> None:
    assert _error(["box"]).param == "tools"
    assert _error({f"t{i}": BOX for i in range(40)}).param == "tools"
    assert _error({"Bad Name": BOX}).param.startswith("tools.Bad Name")


def test_the_process_backend_needs_an_operator() -> None:
    err = _error({"sh": SH})
    assert (err.code, err.param) == (INSUFFICIENT_SCOPE, "tools.sh.backend")
    assert check_tools({"sh": SH}, configured=frozenset(), operator=True) == {"sh": SH}


def test_a_bundle_tool_may_not_take_a_configured_name() -> None:
    err = _error({"box": BOX}, configured=frozenset({"box"}), operator=True)
    assert (err.code, err.param) == (NAME_TAKEN, "tools.box")
    manifest = {"tools": {"box": BOX, "sh": SH}}
    assert set(bundle_specs(manifest, frozenset())) == {"box", "sh"}
    assert bundle_specs({}, frozenset({"box"})) == {}
    with pytest.raises(BundleError) as later:  # the operator configured it after upload
        bundle_specs(manifest, frozenset({"sh"}))
    assert (later.value.code, later.value.param) == (NAME_TAKEN, "tools.sh")


def test_the_manifest_holds_the_tools_of_its_version(tmp_path: Path) -> None:
    store = BundleStore(tmp_path)
    files = {"main.py": "def main():\n    return 1\n"}
    manifest = store.register("wf", files, "main:main",
                              check_tools({"box": BOX}, configured=frozenset(), operator=False))
    assert manifest["tools"] == {"box": BOX}
    assert store.manifest("wf") == manifest
    assert "tools" not in store.register("wf", files, "main:main")
    assert store.manifest("wf", 1) == manifest
    assert [w["versions"] for w in store.list()] == [[1, 2]]
