"""Policies in the web UI against a real daemon: list by layer, versions, the editor,
validation reports inline, a side-by-side diff, activate, roll back, CSRF, escaping."""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest

from tests.daemon_process import DaemonProcess
from tests.ui.webui_support import (
    api_json,
    csrf_of,
    esc,
    flash_of,
    found,
    login,
    require_ui,
    submit,
    text_of,
)

CANARY = '''from scheduling.kv.baselines import StickyPolicy


class Canary(StickyPolicy):
    name = "{name}"
'''
BROKEN = '''from scheduling.kv.baselines import StickyPolicy


class Canary(StickyPolicy):
    name = "{name}"

    def decide(self, view, now):
        return 1 / 0
'''
# No "/": a policy's name is one path segment of the API (/v1/policies/{name}).
HOSTILE = "<img src=x onerror=alert('pol')>\"&"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(data_dir=tmp_path_factory.mktemp("webui-pol") / "data", workers=1)
    d.start()
    try:
        require_ui(d)
        yield d
    finally:
        d.stop()


def page_of(name: str, version: int | None = None) -> str:
    return f"/ui/policy?name={quote(name, safe='')}" + (f"&v={version}" if version else "")


def save(ui: httpx.Client, name: str, source: str, layer: str = "kv",
         on: str = "/ui/policies") -> httpx.Response:
    return submit(ui, on, "/ui/actions/policy", action="save", name=name, layer=layer,
                  source=source, form_id="policy-new")


def policy(d: DaemonProcess, name: str) -> dict[str, object]:
    return dict(api_json(d, f"/v1/policies/{quote(name, safe='')}"))


def active_kv(d: DaemonProcess) -> tuple[str, int]:
    [row] = [p for p in api_json(d, "/v1/policies")["data"]
             if p["layer"] == "kv" and p["active"]]
    return row["name"], row["active_version"]


def test_policies_are_listed_by_layer(daemon: DaemonProcess, ui: httpx.Client) -> None:
    page = ui.get("/ui/policies").text
    kv = re.search(r'<table class="policies" data-layer="kv">.*?</table>', page, re.S)
    assert kv, page[:3000]
    for builtin in ("agentd", "sticky", "vllm-default"):
        assert f'data-policy="{builtin}"' in kv.group(0)
    assert "active v1" in kv.group(0)
    assert 'id="new-name"' in page and 'for="new-source"' in page
    assert 'class="gutter" aria-hidden="true"' in page  # the editor's line numbers


def test_edit_validate_diff_activate_and_roll_back(daemon: DaemonProcess,
                                                   ui: httpx.Client) -> None:
    before = active_kv(daemon)
    r = save(ui, "ui-canary", CANARY.format(name="ui-canary"))
    assert r.status_code == 303 and r.headers["location"] == page_of("ui-canary", 1) + "#report"
    shown = ui.get(page_of("ui-canary", 1)).text
    assert "saved ui-canary v1 (not active yet): validation ok" in shown
    report = found(r'<div id="validation-report".*?</div>', shown)
    assert "Valid" in report and "class <code>Canary</code>" in report
    assert re.search(r'<tr id="L4"><td class="ln">4</td><td><code>class Canary', shown)

    # The editor on the policy's own page stores v2; a broken one is stored and reported.
    r = submit(ui, page_of("ui-canary", 1), "/ui/actions/policy", action="save",
               name="ui-canary", layer="kv", form_id="policy-edit",
               source=BROKEN.format(name="ui-canary"))
    assert r.headers["location"] == page_of("ui-canary", 2) + "#report"
    shown = ui.get(page_of("ui-canary", 2)).text
    assert "validation FAILED (" in shown
    report = found(r'<div id="validation-report".*?</div>', shown)
    assert "Invalid" in report and '<a href="#L8">line 8</a>' in report
    assert "ZeroDivisionError" in report
    assert versions_status(daemon, "ui-canary") == {1: "draft", 2: "draft"}

    # Side by side: v1 left, v2 right, the added lines on the right only.
    diff = ui.get("/ui/policy/diff", params={"name": "ui-canary", "from": 1, "to": 2}).text
    rows = re.findall(r'<tr class="d-(add|del|change|same)">(.*?)</tr>', diff, re.S)
    added = [text_of(cells) for kind, cells in rows if kind == "add"]
    assert any("return 1 / 0" in a for a in added) and len(added) == 3
    assert not [k for k, _ in rows if k in ("del", "change")]

    # Validate (report inline), then activating the broken version is refused.
    r = submit(ui, page_of("ui-canary", 2), "/ui/actions/policy", action="validate",
               name="ui-canary", version="2")
    assert r.headers["location"] == page_of("ui-canary", 2) + "#report"
    assert flash_of(ui, page_of("ui-canary", 2)).startswith(
        "ok: validated ui-canary v2: validation FAILED")
    submit(ui, page_of("ui-canary", 2), "/ui/actions/policy", action="activate",
           name="ui-canary", version="2")
    refused = flash_of(ui, page_of("ui-canary", 2))
    assert refused.startswith("error: activate policy ui-canary v2 failed:")
    assert "failed validation" in refused and "line 8" in refused
    assert active_kv(daemon) == before

    # Activate v1: the daemon runs it; roll back: the previous one runs again.
    r = submit(ui, page_of("ui-canary", 1), "/ui/actions/policy", action="activate",
               name="ui-canary", version="1")
    assert r.headers["location"] == page_of("ui-canary", 1)
    assert re.match(r"ok: activated ui-canary v1 \(swapped in [\d.]+ µs\)",
                    flash_of(ui, page_of("ui-canary", 1)))
    assert active_kv(daemon) == ("ui-canary", 1)
    page = ui.get(page_of("ui-canary")).text
    assert 'aria-label="roll back policy ui-canary' in page
    assert ">v1</dd>" in page.replace('<dd id="active-version">', "<dd>")
    submit(ui, page_of("ui-canary"), "/ui/actions/policy", action="rollback", name="ui-canary")
    assert flash_of(ui, page_of("ui-canary")) == (
        f"ok: rolled back ui-canary v1; the layer now runs {before[0]} v{before[1]}")
    assert active_kv(daemon) == before
    history = ui.get(page_of("ui-canary")).text
    assert "policy.rolled_back" in history and "policy.activated" in history


def versions_status(d: DaemonProcess, name: str) -> dict[int, str]:
    return {v["version"]: v["status"]
            for v in api_json(d, f"/v1/policies/{quote(name, safe='')}/versions")["data"]}


def test_a_refused_save_keeps_the_edited_source(daemon: DaemonProcess,
                                                ui: httpx.Client) -> None:
    source = CANARY.format(name="ui-kept") + "# an edit worth keeping <b>\n"
    r = save(ui, "ui-kept", source, layer="no-such-layer")
    assert r.status_code == 303 and r.headers["location"] == "/ui/policies"
    page = ui.get("/ui/policies").text
    assert "save policy ui-kept failed: unknown layer" in page
    assert esc("# an edit worth keeping <b>") in page  # back in the textarea, escaped
    assert 'value="ui-kept"' in page
    assert "# an edit worth keeping" not in ui.get("/ui/policies").text  # refilled once
    assert ui.get(page_of("ui-kept")).status_code == 404  # nothing was stored
    r = save(ui, "ui-kept", "   ")
    assert "source: the policy source is empty" in flash_of(ui, "/ui/policies")


def test_policy_forms_need_the_csrf_token(daemon: DaemonProcess, ui: httpx.Client) -> None:
    save(ui, "ui-csrf", CANARY.format(name="ui-csrf"))
    before = active_kv(daemon)
    forms = [{"action": "save", "name": "ui-csrf", "layer": "kv",
              "source": CANARY.format(name="ui-csrf")},
             {"action": "activate", "name": "ui-csrf", "version": "1"},
             {"action": "validate", "name": "ui-csrf", "version": "1"},
             {"action": "rollback", "name": before[0]}]
    token = csrf_of(ui.get("/ui/policies").text)
    for form in forms:
        for sent in ({}, {"_csrf": "forged"}, {"_csrf": token[:-2]}):
            r = ui.post("/ui/actions/policy", data={**form, **sent})
            assert r.status_code == 403, (form, sent)
            assert "CSRF" in r.text
    assert len(policy(daemon, "ui-csrf")["versions"]) == 1  # type: ignore[arg-type]
    assert active_kv(daemon) == before
    # Another user's session token is no good either.
    other = login(daemon)
    try:
        r = other.post("/ui/actions/policy", data={**forms[1], "_csrf": token})
        assert r.status_code == 403
    finally:
        other.close()
    assert active_kv(daemon) == before


def test_hostile_policy_names_are_escaped(daemon: DaemonProcess, ui: httpx.Client) -> None:
    r = save(ui, HOSTILE, CANARY.format(name=HOSTILE.replace("'", "\\'")))
    assert r.status_code == 303
    assert r.headers["location"] == page_of(HOSTILE, 1) + "#report"
    assert "%3Cimg%20src%3Dx" in r.headers["location"]
    first = ui.get(page_of(HOSTILE, 1)).text
    assert "saved " + esc(HOSTILE) + " v1" in first and "<img src=x" not in first
    save(ui, HOSTILE, CANARY.format(name=HOSTILE.replace("'", "\\'")) + "# two\n",
         on=page_of(HOSTILE, 1))
    pages = [ui.get("/ui/policies").text, ui.get(page_of(HOSTILE, 1)).text,
             ui.get("/ui/policy/diff", params={"name": HOSTILE, "from": 1, "to": 2}).text]
    for page in pages:
        assert "<img src=x" not in page
        assert esc(HOSTILE) in page
    assert f'href="/ui/policy?name={quote(HOSTILE, safe="")}"' in pages[0]
    assert 'class="d-add"' in pages[2]
    assert policy(daemon, HOSTILE)["name"] == HOSTILE


def test_a_built_in_is_not_edited_in_place_but_starts_a_new_policy(
        daemon: DaemonProcess, ui: httpx.Client) -> None:
    """A built-in's stored source is its whole module, which can never pass as a new
    version: its page offers "new policy from this one" instead of the editor."""
    page = ui.get(page_of("sticky")).text
    assert 'id="policy-editor"' not in page and 'id="policy-derive"' in page
    assert found(r'id="derive-name"[^>]*value="([^"]*)"', page, 1) == "sticky-custom"
    r = submit(ui, page_of("sticky"), "/ui/actions/policy", action="derive", base="sticky",
               name="ui-sticky-2")
    assert r.headers["location"] == page_of("ui-sticky-2", 1) + "#report"
    shown = ui.get(page_of("ui-sticky-2", 1)).text
    assert "created ui-sticky-2 v1 from sticky (not active yet): validation ok" in shown
    report = found(r'<div id="validation-report".*?</div>', shown)
    assert "Valid" in report and "class <code>UiSticky2</code>" in report
    assert "from scheduling.kv.baselines import StickyPolicy" in text_of(shown)
    assert 'id="policy-editor"' in shown  # a stored policy is edited in place
    assert policy(daemon, "ui-sticky-2")["layer"] == "kv"
    assert len(policy(daemon, "sticky")["versions"]) == 1  # type: ignore[arg-type]

    # A taken name and a base that is not a built-in are refused, naming the field.
    submit(ui, page_of("sticky"), "/ui/actions/policy", action="derive", base="sticky",
           name="ui-sticky-2")
    assert esc("name: a policy named 'ui-sticky-2' exists already") in flash_of(
        ui, page_of("sticky"))
    assert len(policy(daemon, "ui-sticky-2")["versions"]) == 1  # type: ignore[arg-type]
    submit(ui, page_of("ui-sticky-2"), "/ui/actions/policy", action="derive",
           base="ui-sticky-2", name="ui-sticky-3")
    assert esc("base: 'ui-sticky-2' is not a built-in") in flash_of(ui, page_of("ui-sticky-2"))


def test_a_new_policy_from_any_built_in_passes_validation(daemon: DaemonProcess,
                                                          ui: httpx.Client) -> None:
    built_ins = [p["name"] for p in api_json(daemon, "/v1/policies")["data"]
                 if policy(daemon, p["name"]).get("derive_from")]
    assert len(built_ins) >= 20, built_ins
    failed = []
    for base in built_ins:
        name = f"from-{base}"
        submit(ui, page_of(base), "/ui/actions/policy", action="derive", base=base, name=name)
        report = policy(daemon, name)["versions"][0]["validation"]  # type: ignore[index]
        if not report.get("ok"):
            failed.append((base, report.get("errors")))
    assert failed == []
