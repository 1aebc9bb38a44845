"""A session's futures as a dependency graph: trace events in, boxes and arrows out.

Workflow runs report `future.created` (id, name, kind, creator, dependencies) and
`future.resolved` (status, executor, consumers, timings, error) into the session's trace.
Future ids are unique within a run only, so a node is keyed by run and id. Columns are
dependency depth (a future sits right of everything it waits for); rows keep creation
order. Pure: the template draws the shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NODE_W, NODE_H = 180, 38
GAP_X, GAP_Y = 56, 14
PAD = 10
MAX_NODES = 400  # beyond this the graph is unreadable; the page says what it left out


@dataclass(frozen=True, slots=True)
class Node:
    key: str
    name: str
    kind: str
    status: str
    x: float
    y: float
    title: str


@dataclass(frozen=True, slots=True)
class Edge:
    path: str  # an SVG path from the dependency to its consumer
    title: str


@dataclass(frozen=True, slots=True)
class Graph:
    width: float
    height: float
    nodes: list[Node]
    edges: list[Edge]
    left_out: int


def futures_of(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every future the trace mentions, merged from its created and resolved events."""
    found: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.get("kind") not in ("future.created", "future.resolved"):
            continue
        data = e.get("data") or {}
        if data.get("id") is None:
            continue
        run = str(data.get("run_id") or "")
        key = f"{run}:{data['id']}"
        f = found.setdefault(key, {"status": "pending", "created": e.get("ts")})
        f.update({k: v for k, v in data.items() if v is not None})
        f["deps"] = [f"{run}:{d}" for d in data.get("dependencies") or []]
    return found


def _depths(futures: dict[str, dict[str, Any]]) -> dict[str, int]:
    depth: dict[str, int] = {}
    for key in futures:  # creation order: a dependency is always created first
        known = [depth[d] for d in futures[key]["deps"] if d in depth]
        depth[key] = 1 + max(known) if known else 0
    return depth


def _kind(f: dict[str, Any]) -> str:
    """The call's kind; the trace may lack it, but a tool's executor is named "tool:..."."""
    if f.get("kind"):
        return str(f["kind"])
    executor = str(f.get("executor") or "")
    return "tool" if executor.startswith("tool:") else ("agent" if executor else "call")


def _title(key: str, f: dict[str, Any]) -> str:
    took = ""
    if isinstance(f.get("started_at"), int | float) and isinstance(f.get("finished_at"),
                                                                  int | float):
        took = f", ran {(f['finished_at'] - f['started_at']) * 1000:.0f} ms"
    deps = ", ".join(d.split(":", 1)[1] for d in f["deps"]) or "none"
    text = (f"{f.get('id')} {f.get('name')} ({_kind(f)}) {f['status']}{took}; "
            f"created by {f.get('creator', '?')}, run by {f.get('executor', '-')}; "
            f"waits for {deps}; run {key.split(':', 1)[0] or '-'}")
    if f.get("error"):
        text += f"; error: {f['error']}"
    return text


def layout(events: list[dict[str, Any]]) -> Graph:
    futures = futures_of(events)
    left_out = max(len(futures) - MAX_NODES, 0)
    futures = dict(list(futures.items())[:MAX_NODES])
    depth = _depths(futures)
    rows: dict[int, int] = {}
    nodes: dict[str, Node] = {}
    for key, f in futures.items():
        col = depth[key]
        row = rows.get(col, 0)
        rows[col] = row + 1
        nodes[key] = Node(key, str(f.get("name", f.get("id"))), _kind(f),
                          str(f["status"]), PAD + col * (NODE_W + GAP_X),
                          PAD + row * (NODE_H + GAP_Y), _title(key, f))
    edges = [_edge(nodes[d], nodes[key]) for key, f in futures.items()
             for d in f["deps"] if d in nodes]
    width = PAD * 2 + (max(depth.values(), default=0) + 1) * (NODE_W + GAP_X) - GAP_X
    height = PAD * 2 + max(rows.values(), default=0) * (NODE_H + GAP_Y)
    return Graph(width, height, list(nodes.values()), edges, left_out)


def _edge(src: Node, dst: Node) -> Edge:
    x0, y0 = src.x + NODE_W, src.y + NODE_H / 2
    x1, y1 = dst.x - 4, dst.y + NODE_H / 2
    mid = (x0 + x1) / 2
    return Edge(f"M{x0:.1f} {y0:.1f} C{mid:.1f} {y0:.1f} {mid:.1f} {y1:.1f} {x1:.1f} {y1:.1f}",
                f"{dst.name} waits for {src.name}")
