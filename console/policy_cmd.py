"""`agentctl policy ...`: list, show, activate, rollback, diff and edit stored policies."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from console.client import AgentdClient, Call, ClientError
from console.policy_templates import template


def _path(name: str, suffix: str = "") -> str:
    return f"/v1/policies/{quote(name, safe='')}{suffix}"


def _print(a: argparse.Namespace, payload: Any, text: str) -> None:
    print(json.dumps(payload, indent=2) if a.json else text, flush=True)


def _report(v: dict[str, Any]) -> str:
    report = v.get("validation") or {}
    head = f"{v['name']} v{v['version']} [{v['status']}] validation: " + (
        "ok" if report.get("ok") else "FAILED")
    lines = [head]
    lines += [f"  line {e['line']}: {e['message']}" if e.get("line") else f"  {e['message']}"
              for e in report.get("errors", [])]
    if report.get("timings_ms"):
        lines.append(f"  slowest call {report.get('max_ms', 0):.3f} ms "
                     f"(budget {report.get('budget_ms', 0):.1f} ms)")
    return "\n".join(lines)


def cmd_list(c: AgentdClient, a: argparse.Namespace) -> int:
    rows = sorted(c.call(Call("GET", "/v1/policies"))["data"],
                  key=lambda r: (r["layer"], r["name"]))
    name_w = max((len(r["name"]) for r in rows), default=4)
    layer_w = max((len(r["layer"]) for r in rows), default=5)
    text = "\n".join(f"{'*' if r['active'] else ' '} {r['layer']:<{layer_w}} "
                     f"{r['name']:<{name_w}} versions={r['versions']} "
                     f"active={r['active_version'] or '-'}" for r in rows)
    _print(a, rows, text or "(no policies)")
    return 0


def cmd_show(c: AgentdClient, a: argparse.Namespace) -> int:
    p = c.call(Call("GET", _path(a.name)))
    lines = [f"{p['name']} ({p['layer']}) active version: {p['active_version'] or '-'}"]
    lines += [f"  v{v['version']} {v['status']:<12} by {v['author']}" for v in p["versions"]]
    lines += [f"  event {e['kind']} {json.dumps(e['data'])}" for e in p.get("events", [])[-10:]]
    _print(a, p, "\n".join(lines))
    return 0


def cmd_activate(c: AgentdClient, a: argparse.Namespace) -> int:
    body = {"version": a.version} if a.version else None
    r = c.call(Call("POST", _path(a.name, "/activate"), body=body))
    _print(a, r, f"activated {r['name']} v{r['version']} (swap {r['swap_us']} us)")
    return 0


def cmd_rollback(c: AgentdClient, a: argparse.Namespace) -> int:
    r = c.call(Call("POST", _path(a.name, "/rollback")))
    _print(a, r, f"rolled back {a.name} v{r['rolled_back']['version']}; active now "
                 f"{r['active']['name']} v{r['active']['version']}")
    return 0


def cmd_diff(c: AgentdClient, a: argparse.Namespace) -> int:
    r = c.call(Call("GET", _path(a.name, "/diff"), params={"from": a.a, "to": a.b}))
    _print(a, r, r["diff"].rstrip("\n") or "(no differences)")
    return 0


def cmd_edit(c: AgentdClient, a: argparse.Namespace) -> int:
    layer, original = _starting_point(c, a)
    source = _edit(original)
    if source == original:
        print("no changes; nothing stored", flush=True)
        return 0
    v = c.call(Call("PUT", _path(a.name), body={"layer": layer, "source": source}))
    _print(a, v, _report(v))
    if not v["validation"].get("ok"):
        return 1
    if not (a.yes or _confirm(f"activate {a.name} v{v['version']}? [y/N] ")):
        return 0
    r = c.call(Call("POST", _path(a.name, "/activate"), body={"version": v["version"]}))
    _print(a, r, f"activated {r['name']} v{r['version']} (swap {r['swap_us']} us)")
    return 0


def _starting_point(c: AgentdClient, a: argparse.Namespace) -> tuple[str, str]:
    """(layer, source to edit): the stored policy's, or a template for a new one."""
    try:
        current = c.call(Call("GET", _path(a.name)))
    except ClientError as exc:
        if exc.status != 404:
            raise
        if a.layer is None:
            raise ClientError(f"no policy named {a.name!r}; to create it, give its layer: "
                              f"agentctl policy edit {a.name} --layer LAYER") from exc
        layers = sorted({r["layer"] for r in c.call(Call("GET", "/v1/policies"))["data"]})
        if a.layer not in layers:
            raise ClientError(f"unknown layer {a.layer!r}; the daemon has "
                              f"{', '.join(layers)}") from exc
        return a.layer, template(a.layer, a.name)
    if a.layer is not None and a.layer != current["layer"]:
        raise ClientError(f"policy {a.name!r} belongs to layer {current['layer']!r}, "
                          f"not {a.layer!r}")
    return current["layer"], current["source"]


def _edit(text: str) -> str:
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.NamedTemporaryFile("w+", suffix=".py", delete=False) as f:
        f.write(text)
    try:
        if subprocess.run([*shlex.split(editor), f.name], check=False).returncode != 0:
            raise ClientError(f"the editor {editor!r} failed; nothing was stored")
        with open(f.name) as edited:
            return edited.read()
    finally:
        os.unlink(f.name)


def _confirm(prompt: str) -> bool:
    if not sys.stdin.isatty():
        return False
    return input(prompt).strip().lower() in ("y", "yes")


def add_policy_parser(subparsers: Any,
                      common: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """Add `policy ACTION ...` to agentctl; dispatch reads `args.policy_command`."""
    policy = subparsers.add_parser("policy", help="scheduling policies: list, show, activate, "
                                   "rollback, diff, edit")
    actions = policy.add_subparsers(dest="policy_action", required=True, metavar="ACTION")
    specs: dict[str, tuple[Callable[[AgentdClient, argparse.Namespace], int], str]] = {
        "list": (cmd_list, "stored policies; * marks the active one"),
        "show": (cmd_show, "one policy's versions and events"),
        "activate": (cmd_activate, "operator: validate and swap in a version"),
        "rollback": (cmd_rollback, "operator: put back the previously active version"),
        "diff": (cmd_diff, "unified diff between two versions"),
        "edit": (cmd_edit, "operator: edit the source in $EDITOR (a new policy: from a "
                           "template of --layer), store, optionally activate"),
    }
    for action, (func, text) in specs.items():
        p = actions.add_parser(action, help=text, description=text)
        if common is not None:
            common(p)
        p.set_defaults(policy_command=func)
        if action != "list":
            p.add_argument("name", metavar="NAME")
    by_name = actions.choices
    by_name["activate"].add_argument("--version", type=int, default=None)
    by_name["diff"].add_argument("a", type=int, metavar="A")
    by_name["diff"].add_argument("b", type=int, metavar="B")
    by_name["edit"].add_argument("--yes", action="store_true", help="activate without asking")
    by_name["edit"].add_argument("--layer", default=None, metavar="LAYER",
                                 help="for a new policy: its layer (kv, ordering, meta, "
                                      "admission, ...); it starts from a template")
