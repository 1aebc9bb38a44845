"""Policies: the list by layer, one policy's versions and source, a side-by-side diff, the
editor (store a new version, validated on the way in), validate, activate, roll back.

Everything goes through /v1/policies: the registry validates and swaps, the UI shows
its reports. Names travel in the query string (?name=), so any name has a page.
"""

from __future__ import annotations

import json
import re
from typing import Any

from litestar import Response, get, post

from webui.client import Api, ApiError, seg
from webui.diffview import side_by_side
from webui.web import Form, FormError, Req, form_action, int_param, qall, refill, render, with_api

ACTIONS = ("save", "validate", "activate", "rollback", "derive")
STARTER = '''from scheduling.kv.baselines import StickyPolicy


class MyPolicy(StickyPolicy):
    name = "my-policy"  # must equal the policy's name
'''


def policy_url(name: str, version: int | None = None, anchor: str = "") -> str:
    return f"/ui/policy?name={qall(name)}" + (f"&v={version}" if version else "") + anchor


@get("/policies", name="ui.policies")
async def policies_page(request: Req) -> Response[Any]:
    async def page(api: Api) -> Response[Any]:
        rows = await api.policies()
        layers: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            layers.setdefault(str(r["layer"]), []).append(r)
        filled = refill(request, "policy-new")
        return render(request, "policies.html", title="Policies", layers=layers,
                      layer_names=sorted(layers) or ["kv"], form=filled,
                      source=filled.get("source", STARTER))

    return await with_api(request, page)


@get("/policy", name="ui.policy")
async def policy_page(request: Req) -> Response[Any]:
    name = str(request.query_params.get("name") or "")

    async def page(api: Api) -> Response[Any]:
        policy = await api.policy(name)
        numbers = [int(v["version"]) for v in policy["versions"]]
        chosen = int_param(request.query_params.get("v"), int(policy["source_version"]))
        chosen = chosen if chosen in numbers else int(policy["source_version"])
        version = await api.policy_version(name, chosen)
        filled = refill(request, "policy-edit")
        return render(request, "policy.html", title=f"Policy {name}", policy=policy,
                      version=version, numbers=numbers,
                      editor_source=filled.get("source", version["source"]),
                      here=policy_url(name, chosen))

    return await with_api(request, page)


@get("/policy/diff", name="ui.policy.diff")
async def policy_diff_page(request: Req) -> Response[Any]:
    q = request.query_params
    name = str(q.get("name") or "")

    async def page(api: Api) -> Response[Any]:
        policy = await api.policy(name)
        numbers = [int(v["version"]) for v in policy["versions"]]
        b = int_param(q.get("to"), numbers[-1])
        a = int_param(q.get("from"), max(b - 1, 1))
        rows = side_by_side(await api.policy_diff(name, a, b))
        return render(request, "policy_diff.html", title=f"Diff of {name}", policy=policy,
                      numbers=numbers, a=a, b=b, rows=rows, back=policy_url(name))

    return await with_api(request, page)


@post("/actions/policy", status_code=303)
async def policy_action(request: Req) -> Response[Any]:
    return await form_action(request, _policy_action, _describe)


def _describe(form: Form) -> str:
    version = f" v{form.get('version')}" if form.get("version") else ""
    return f"{form.get('action') or 'change'} policy {form.get('name') or ''}{version}"


async def _policy_action(api: Api, form: Form) -> tuple[str, str | None]:
    action = str(form.get("action") or "")
    name = str(form.get("name") or "").strip()
    if action not in ACTIONS:
        raise FormError(f"action must be one of {', '.join(ACTIONS)}")
    if not name:
        raise FormError("name: enter the policy's name")
    path = f"/v1/policies/{seg(name)}"
    if action == "derive":
        return await _derive(api, path, name, str(form.get("base") or ""))
    if action == "save":
        return await _save(api, path, name, form)
    if action == "rollback":
        out = await api.post(f"{path}/rollback")
        active = out["active"]
        return (f"rolled back {name} v{out['rolled_back']['version']}; the layer now runs "
                f"{active['name']} v{active['version']}", policy_url(name))
    version = _version_field(form)
    out = await api.post(f"{path}/{action}", {"version": version} if version else None)
    if action == "activate":
        return (f"activated {name} v{out['version']} (swapped in {out['swap_us']} µs)",
                policy_url(name, int(out["version"])))
    return (f"validated {name} v{out['version']}: {_verdict(out)}",
            policy_url(name, int(out["version"]), "#report"))


async def _save(api: Api, path: str, name: str, form: Form) -> tuple[str, str | None]:
    source = str(form.get("source") or "").replace("\r\n", "\n")
    if not source.strip():
        raise FormError("source: the policy source is empty")
    out = await api.put(path, {"source": source, "layer": str(form.get("layer") or "kv")})
    return (f"saved {name} v{out['version']} (not active yet): {_verdict(out)}",
            policy_url(name, int(out["version"]), "#report"))


def derived_source(module: str, base_class: str, name: str, base: str) -> str:
    """A new policy's first source: a subclass of built-in `base`'s class that passes
    validation as it is (one class, `name` equal to the policy's)."""
    words = re.findall(r"[A-Za-z0-9]+", name)
    cls = "".join(w[:1].upper() + w[1:] for w in words)
    cls = cls if cls[:1].isalpha() else f"Policy{cls}"
    return (f"from {module} import {base_class}\n\n\n"
            f"class {cls}({base_class}):\n"
            f"    \"\"\"Starts as the built-in policy {json.dumps(base)}; override what "
            f"you change.\"\"\"\n\n"
            f"    name = {json.dumps(name)}  # must equal the policy's name\n")


async def _derive(api: Api, path: str, name: str, base: str) -> tuple[str, str | None]:
    """"New policy from this one": a built-in is never edited in place (its stored source
    is its whole module, which cannot pass as a version); a new policy subclasses it."""
    built_in = await api.policy(base) if base else {}
    origin = built_in.get("derive_from")
    if not origin:
        raise FormError(f"base: {base!r} is not a built-in policy a new one can start from")
    try:
        await api.policy(name)
    except ApiError as exc:
        if exc.status != 404:
            raise
    else:
        raise FormError(f"name: a policy named {name!r} exists already; choose another name")
    source = derived_source(str(origin["module"]), str(origin["class"]), name, base)
    out = await api.put(path, {"source": source, "layer": str(built_in["layer"])})
    return (f"created {name} v{out['version']} from {base} (not active yet): {_verdict(out)}",
            policy_url(name, int(out["version"]), "#report"))


def _version_field(form: Form) -> int | None:
    raw = str(form.get("version") or "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise FormError("version: must be a whole number from 1")
    return int(raw)


def _verdict(version: dict[str, Any]) -> str:
    report = version.get("validation") or {}
    if report.get("ok"):
        return "validation ok"
    return f"validation FAILED ({len(report.get('errors') or [])} problem(s))"
