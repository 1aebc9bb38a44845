"""Trace loaders: each returns ``ProgramSpec``s ordered by arrival.

- ``programs`` JSONL, one step per line: ``program_id``, ``step``, ``arrival_s`` (first
  step: the program's start; later steps arrive at the previous finish + ``tool_s``),
  ``prompt_tokens``, ``output_tokens``, ``new_tokens`` (default: the whole prompt for the
  first step, else prompt - previous context), ``tool_s``.
- ``mooncake`` JSONL: each hash id is one 512-token block; a block's ids are a marker
  for its hash id plus filler, so equal hash ids give equal KV blocks (the trace's hash
  ids are already prefix-chained). One single-request program per line.
- ``azure`` CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``): one single-request program
  per row whose prompt opens with a marker drawn from (seed, row); the trace says nothing
  about shared prefixes, so none are shared.
- ``tracelab`` JSONL: each session becomes one program; round prefix/appended tokens
  give prefix and new tokens, the round's tool latencies (summed: tools of one round
  run one after another) the tool time before the next round.
- ``miniswe`` CSV (mini-swe-agent steps: ``session_id,step,created_unix_s,prompt_tokens,
  completion_tokens,reasoning_tokens,cached_tokens,...``): each session becomes one program,
  one step per LLM call, starting at its first call's stamp. A call generates its visible
  and its reasoning tokens; its new prompt tokens are its prompt less the previous call's
  prompt and visible completion, or, where the agent cut its history (negative), less what
  the provider found cached. The tool time before a call is the gap between the two calls'
  one-second stamps, which also holds the provider's latency: an upper bound.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from daemon.replay.workload import ProgramSpec, StepSpec

FORMATS = ("programs", "mooncake", "azure", "tracelab", "miniswe")


class TraceError(ValueError):
    """A trace line that cannot be read; the message names the line."""


def _jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open() as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield n, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TraceError(f"{path}:{n}: {exc}") from exc


def load_programs(path: Path) -> list[ProgramSpec]:
    rows: dict[str, list[dict[str, Any]]] = {}
    for n, obj in _jsonl(path):
        try:
            rows.setdefault(str(obj["program_id"]), []).append(obj)
            int(obj["prompt_tokens"]), int(obj["output_tokens"]), int(obj["step"])
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceError(f"{path}:{n}: needs program_id, step, prompt/output_tokens") from exc
    specs = [_program_from_rows(pid, sorted(rs, key=lambda r: int(r["step"])))
             for pid, rs in rows.items()]
    return sorted(specs, key=lambda s: (s.arrival_s, s.program_id))


def _program_from_rows(pid: str, rows: list[dict[str, Any]]) -> ProgramSpec:
    steps: list[StepSpec] = []
    context = 0
    for row in rows:
        prompt, output = int(row["prompt_tokens"]), int(row["output_tokens"])
        new = row.get("new_tokens")
        new_tokens = prompt if not steps else max(0, prompt - context)
        new_tokens = int(new) if new is not None else new_tokens
        tool_s = float(row.get("tool_s", 0.0)) if steps else 0.0
        steps.append(StepSpec(prompt, output, min(new_tokens, prompt), tool_s))
        context = prompt + output
    return ProgramSpec(pid, float(rows[0].get("arrival_s", 0.0)), tuple(steps))


def load_mooncake(path: Path) -> list[ProgramSpec]:
    specs: list[ProgramSpec] = []
    for n, obj in _jsonl(path):
        try:
            length, output = int(obj["input_length"]), int(obj["output_length"])
            blocks = tuple(int(h) for h in obj["hash_ids"])
            at = float(obj["timestamp"]) / 1000.0
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceError(f"{path}:{n}: needs timestamp, input/output_length, hash_ids") from exc
        step = StepSpec(max(1, length), max(1, output), length, 0.0, blocks)
        specs.append(ProgramSpec(f"mc{n}", at, (step,), tenant="mooncake"))
    return specs


def load_azure(path: Path, seed: int = 0, task: str | None = None) -> list[ProgramSpec]:
    specs: list[ProgramSpec] = []
    start: datetime | None = None
    with path.open(newline="") as fh:
        for n, row in enumerate(csv.DictReader(fh), 2):
            try:
                at = datetime.fromisoformat(row["TIMESTAMP"].strip()[:26])
                prompt, output = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            except (KeyError, TypeError, ValueError) as exc:
                raise TraceError(f"{path}:{n}: bad Azure row {row!r}") from exc
            start = start or at
            step = StepSpec(max(1, prompt), max(1, output), prompt, 0.0)
            rel = (at - start).total_seconds()
            # The seed goes into the program id, which owns the prompt's marker token.
            pid = f"az{seed}-{n}"
            specs.append(ProgramSpec(pid, rel, (step,), tenant=path.stem, task=task))
    return specs


def load_tracelab(path: Path) -> list[ProgramSpec]:
    sessions: dict[str, list[dict[str, Any]]] = {}
    for _, obj in _jsonl(path):
        sessions.setdefault(str(obj["session_id"]), []).append(obj)
    specs: list[ProgramSpec] = []
    for i, (sid, rounds) in enumerate(sessions.items()):
        rounds.sort(key=lambda r: int(r["round_index"]))
        steps: list[StepSpec] = []
        tool_s = 0.0
        for r in rounds:
            prompt = int(r["input_tokens_total"])
            new = prompt if not steps else int(r["newly_append_tokens"])
            steps.append(StepSpec(prompt, max(1, int(r["output_tokens"])), new, tool_s))
            tool_s = round_tool_s(r)
        specs.append(ProgramSpec(f"tl{i}", 0.0, tuple(steps), tenant=sid.split(":")[0],
                                 task="code_generation"))
    return specs


def round_tool_s(row: dict[str, Any]) -> float:
    return sum(float(t.get("tool_wall_latency_ms") or 0.0) for t in row.get("tools", [])) / 1e3


_MINISWE_FIELDS = ("step", "created_unix_s", "prompt_tokens", "completion_tokens",
                   "reasoning_tokens", "cached_tokens")


def load_miniswe(path: Path) -> list[ProgramSpec]:
    sessions: dict[str, list[dict[str, int]]] = {}
    with path.open(newline="") as fh:
        for n, row in enumerate(csv.DictReader(fh), 2):
            try:
                values = {k: int(row[k] or 0) for k in _MINISWE_FIELDS}
                sessions.setdefault(row["session_id"], []).append(values)
            except (KeyError, TypeError, ValueError) as exc:
                raise TraceError(f"{path}:{n}: bad mini-swe-agent row {row!r}") from exc
    if not sessions:
        return []
    start = min(r["created_unix_s"] for rows in sessions.values() for r in rows)
    specs = [_miniswe_program(sid, sorted(rows, key=lambda r: r["step"]), start)
             for sid, rows in sessions.items()]
    return sorted(specs, key=lambda s: (s.arrival_s, s.program_id))


def _miniswe_program(sid: str, rows: list[dict[str, int]], start: int) -> ProgramSpec:
    steps: list[StepSpec] = []
    prev: dict[str, int] | None = None
    for r in rows:
        prompt = max(1, r["prompt_tokens"])
        output = max(1, r["completion_tokens"] + r["reasoning_tokens"])
        if prev is None:
            new, tool_s = prompt, 0.0
        else:
            new = prompt - prev["prompt_tokens"] - prev["completion_tokens"]
            if new < 0:  # the agent cut its history: the provider's cache says what stayed
                new = prompt - min(r["cached_tokens"], prompt)
            tool_s = float(max(0, r["created_unix_s"] - prev["created_unix_s"]))
        steps.append(StepSpec(prompt, output, min(new, prompt), tool_s))
        prev = r
    return ProgramSpec(f"swe-{sid}", float(rows[0]["created_unix_s"] - start), tuple(steps),
                       tenant="miniswe", task="code_generation", meta={"session": sid})


LOADERS: dict[str, Callable[[Path], list[ProgramSpec]]] = {
    "programs": load_programs,
    "mooncake": load_mooncake,
    "azure": load_azure,
    "tracelab": load_tracelab,
    "miniswe": load_miniswe,
}


def load_trace(path: str | Path, fmt: str) -> list[ProgramSpec]:
    if fmt not in LOADERS:
        raise TraceError(f"unknown trace format {fmt!r}; known: {', '.join(FORMATS)}")
    return LOADERS[fmt](Path(path))


def scale_arrivals(specs: Iterable[ProgramSpec], load: float) -> list[ProgramSpec]:
    """``load`` times the arrival rate: start times divided by ``load``."""
    if load <= 0:
        raise ValueError("load must be positive")
    return [with_arrival(s, s.arrival_s / load) for s in specs]


def with_arrival(spec: ProgramSpec, at: float) -> ProgramSpec:
    return ProgramSpec(spec.program_id, at, spec.steps, spec.tenant, spec.task,
                       spec.prefix_group, spec.prefix_tokens, spec.meta)
