"""Bundle validation and versioned storage: errors name the file/line/argument, and a
failed registration leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.runtime.bundles import (
    MAX_BUNDLE_BYTES,
    BundleError,
    BundleStore,
    TenantBundles,
    validate,
)

GOOD = {"main.py": "import helper\n\ndef main(x, y=1, *, z, **kw):\n    return x\n",
        "helper.py": "VALUE = 1\n"}


def test_signature_and_args() -> None:
    sig = validate("wf", GOOD, "main:main")
    assert sig.params == ["x", "y", "z"] and sig.required == ["x", "z"] and sig.var_kwargs
    sig.check({"x": 1, "z": 2, "extra": 3})
    with pytest.raises(BundleError, match="missing argument 'z'") as info:
        sig.check({"x": 1})
    assert info.value.param == "args.z"
    strict = validate("wf", {"m.py": "async def go(a):\n    pass\n"}, "m:go")
    assert strict.is_async
    with pytest.raises(BundleError, match="unknown argument 'b'"):
        strict.check({"a": 1, "b": 2})


@pytest.mark.parametrize(("files", "entry", "match"), [
    ({"main.py": "def main(:\n"}, "main:main", r"syntax error in main.py line 1"),
    ({"main.py": "def main():\n    pass\n", "lib/x.py": "x = (\n"}, "main:main",
     r"lib/x.py line 1"),
    ({"main.py": "def other():\n    pass\n"}, "main:main", "entry function 'main'"),
    ({"main.py": "main = 3\n"}, "main:main", "not a top-level function"),
    ({"main.py": "def main():\n    pass\n"}, "nope:main", "entry module 'nope'"),
    ({"main.py": "def main():\n    pass\n"}, "main", "module:function"),
    ({"../evil.py": "x = 1\n"}, "evil:x", "invalid file path"),
    ({"main.py": "x = 1\n" * (MAX_BUNDLE_BYTES // 4)}, "main:main", "limit"),
])
def test_invalid_bundles_register_nothing(tmp_path: Path, files: dict[str, str], entry: str,
                                          match: str) -> None:
    store = BundleStore(tmp_path)
    with pytest.raises(BundleError, match=match):
        store.register("wf", files, entry)
    assert store.list() == [] and store.manifest("wf") is None
    assert not list(tmp_path.rglob("*.py"))


def test_versions(tmp_path: Path) -> None:
    store = BundleStore(tmp_path)
    assert store.register("wf", GOOD, "main:main")["version"] == 1
    with pytest.raises(BundleError):
        store.register("wf", {"main.py": "def main(:"}, "main:main")
    m2 = store.register("wf", GOOD, "main:main")
    assert m2["version"] == 2
    assert [w["versions"] for w in store.list()] == [[1, 2]]
    assert (store.path("wf", 1) / "helper.py").read_text() == "VALUE = 1\n"
    assert (store.manifest("wf", 1) or {}).get("version") == 1 and store.manifest("wf", 3) is None
    with pytest.raises(BundleError, match="invalid workflow name"):
        store.register("../x", GOOD, "main:main")


def test_workflow_names_are_per_tenant(tmp_path: Path) -> None:
    bundles = TenantBundles(tmp_path)
    bundles.of("a").register("etl", GOOD, "main:main")
    bundles.of("b").register("etl", {"m.py": "def go():\n    pass\n"}, "m:go")
    assert (bundles.of("a").manifest("etl") or {})["entry"] == "main:main"
    assert (bundles.of("b").manifest("etl") or {})["entry"] == "m:go"
    assert bundles.of("c").manifest("etl") is None
    assert [(w["tenant"], w["name"]) for w in bundles.workflows(None)] == [
        ("a", "etl"), ("b", "etl")]
    assert [w["tenant"] for w in bundles.workflows("b")] == ["b"]


def test_bundles_from_before_tenants_move_to_the_default_tenant(tmp_path: Path) -> None:
    old = BundleStore(tmp_path)
    old.register("etl", GOOD, "main:main")
    old.register("default", GOOD, "main:main")  # a bundle named like the tenant
    old.register("default", GOOD, "main:main")
    bundles = TenantBundles(tmp_path)
    assert sorted(bundles.adopt_untenanted("default")) == ["default", "etl"]
    assert [(w["name"], w["versions"]) for w in bundles.workflows("default")] == [
        ("default", [1, 2]), ("etl", [1])]
    assert (bundles.of("default").path("etl", 1) / "helper.py").is_file()
    assert bundles.adopt_untenanted("default") == []  # the tenant layout is left alone
    assert [w["name"] for w in bundles.workflows(None)] == ["default", "etl"]
