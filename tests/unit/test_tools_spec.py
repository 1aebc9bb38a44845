"""Tool specs: parsed from plain dicts, with errors that name the field."""

from __future__ import annotations

import pytest

from tools.base import OutputBuffer, as_argv, result_reason
from tools.errors import Reason
from tools.metrics import Histogram
from tools.spec import SpecError, merge_spec, parse_spec, parse_table


def test_defaults_are_locked_down() -> None:
    spec = parse_spec({"name": "py", "image": "python:3.11"})
    assert (spec.backend, spec.network, spec.exec_timeout_s) == ("docker", "none", 60.0)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"name": "py"}, "image"),
        ({"name": "py", "image": "x", "memory_mb": "lots"}, "memory_mb"),
        ({"name": "py", "image": "x", "memory_mb": 0}, "memory_mb"),
        ({"name": "Bad Name", "image": "x"}, "name"),
        ({"name": "py", "image": "x", "network": "wifi"}, "network"),
        ({"name": "py", "image": "x", "mounts": [{"target": "relative"}]}, "mounts"),
        ({"name": "py", "image": "x", "colour": "red"}, "colour"),
        ({"name": "py", "backend": "process", "image": "x"}, "image"),
        ({"name": "py", "backend": "process", "mounts": [{"target": "/d"}]}, "mounts"),
    ],
)
def test_errors_name_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    assert field in str(err.value) and err.value.reason is Reason.BAD_SPEC
    assert err.value.field is not None and err.value.field.startswith(field)


def test_bind_mounts_only_from_trusted_config() -> None:
    data = {"name": "py", "image": "x", "mounts": [{"type": "bind", "source": "/", "target": "/h"}]}
    with pytest.raises(SpecError, match="bind"):
        parse_spec(data)
    trusted = parse_spec(data, trusted=True)
    assert merge_spec(trusted, {"exec_timeout_s": 5}).exec_timeout_s == 5
    with pytest.raises(SpecError, match="bind"):
        merge_spec(parse_spec({"name": "py", "image": "x"}), {"mounts": data["mounts"]})


def test_argv_and_reasons() -> None:
    assert as_argv("ls -l") == ["/bin/sh", "-c", "ls -l"]
    assert as_argv("print(1)", ("python3", "-c")) == ["python3", "-c", "print(1)"]
    assert as_argv(["ls", "-l"], ("env",)) == ["env", "ls", "-l"]
    assert result_reason(0, timed_out=False, oom=False) is Reason.OK
    assert result_reason(2, timed_out=False, oom=False) is Reason.EXIT
    assert result_reason(-9, timed_out=False, oom=False) is Reason.KILLED
    assert result_reason(137, timed_out=True, oom=False) is Reason.TIMEOUT


def test_output_buffer_keeps_the_tail() -> None:
    buf = OutputBuffer(limit=10)
    for chunk in (b"0123456789", b"abcdefghij", b"KLMNOPQRST"):
        buf.add(chunk)
    assert buf.text() == "KLMNOPQRST" and buf.size <= 20


def test_histogram_is_cumulative() -> None:
    hist = Histogram()
    for value in (0.01, 0.3, 0.3, 400.0):
        hist.observe(value)
    snap = hist.snapshot()
    assert snap["buckets"]["0.05"] == 1 and snap["buckets"]["0.5"] == 3
    assert snap["buckets"]["inf"] == 4 and snap["count"] == 4


def test_requests_cannot_widen_the_sandbox() -> None:
    with pytest.raises(SpecError, match="network"):
        parse_spec({"name": "py", "image": "x", "network": "host"})
    configured = parse_spec({"name": "py", "image": "x", "network": "host"}, trusted=True)
    assert merge_spec(configured, {"memory_mb": 64}).network == "host"  # operator's choice
    base = parse_spec({"name": "py", "image": "x"})
    with pytest.raises(SpecError, match="network"):
        merge_spec(base, {"network": "host"})
    with pytest.raises(SpecError, match="name"):
        merge_spec(base, {"name": "other"})
    with pytest.raises(SpecError, match="mounts"):
        merge_spec(base, {"mounts": 5})


def test_config_tables_take_the_name_from_their_key() -> None:
    spec = parse_table("py", {"image": "x", "memory_mb": 64})
    assert (spec.name, spec.memory_mb) == ("py", 64)
    assert parse_table("py", {"name": "py", "image": "x"}).name == "py"
    with pytest.raises(SpecError) as err:
        parse_table("py", {"name": "other", "image": "x"})
    assert err.value.field == "name"
    with pytest.raises(SpecError, match="table"):
        parse_table("py", ["image", "x"])
    with pytest.raises(SpecError) as err:
        parse_table("py", {"image": "x", "mounts": [{"target": "/s", "size_mb": "big"}]})
    assert err.value.field == "mounts[0].size_mb"
