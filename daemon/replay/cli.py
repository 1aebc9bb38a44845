"""``agentd replay``: run traces through the scheduling stack on simulated workers in
virtual time and write a JSON comparison. Every number it prints is simulated.

Real-worker (wall-clock) replay against live engines is not part of this command.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from daemon.replay.harness import Replay, ReplayConfig
from daemon.replay.residency import RESIDENCY_MODES
from daemon.replay.slo import ORDERINGS, SloStack, slo_stack
from daemon.replay.synthetic import synthetic_programs
from daemon.replay.traces import FORMATS, TraceError, load_azure, load_trace, scale_arrivals
from daemon.replay.workload import ProgramSpec
from scheduling.kv import KV_POLICIES, make_kv_policy
from scheduling.slo.templates import TABLE_6, Slo, SloTable, TaskType

AZURE_TASKS = {"code": TaskType.CODE_GENERATION.value, "conv": TaskType.DIALOGUE.value}


def add_replay_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "replay", help="replay a trace against simulated workers in virtual time")
    _arguments(p)
    p.set_defaults(func=_run_reporting_errors)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", nargs="?", help="trace file (omit with --synthetic-agents)")
    p.add_argument("--format", choices=FORMATS, default="programs")
    p.add_argument("--synthetic-agents", type=int, metavar="N",
                   help="N synthetic agent programs fitted to the TraceLab session")
    p.add_argument("--policy", default="agentd",
                   help=f"KV policies, comma-separated: {', '.join(sorted(KV_POLICIES))}")
    p.add_argument("--ordering", default=None,
                   help="SLO stacks run side by side, comma-separated: a pool policy, "
                        "meta-rules, meta-bandit, meta-llm, full or an ablation of full "
                        f"({', '.join(ORDERINGS)}); omit for KV-only runs")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--kv-tokens", type=int, default=444_000, help="KV capacity per worker")
    p.add_argument("--cost-model", default="llama3-8b-h100", help="shipped name or JSON file")
    p.add_argument("--concurrency", type=int, help="cap on live programs (closed loop)")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiplies step time")
    p.add_argument("--kv-residency", choices=RESIDENCY_MODES, default="engine",
                   help="what the KV policy knows of a paused program's cache: the sim's "
                        "truth, the daemon's estimate from reported token counts, nothing "
                        "(unknown) or that it is evicted (cold)")
    p.add_argument("--duration-s", type=float, help="stop at this virtual time")
    p.add_argument("--load", type=float, default=1.0, help="multiplies the arrival rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-template", help='JSON {"task": {"ttft_s": x, "tpot_s": y}}')
    p.add_argument("--json", dest="json_out", help="write the result JSON here")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def load_specs(args: argparse.Namespace) -> list[ProgramSpec]:
    if args.synthetic_agents:
        specs = synthetic_programs(args.synthetic_agents, seed=args.seed)
    elif not args.trace:
        raise TraceError("give a TRACE_FILE or --synthetic-agents N")
    elif args.format == "azure":
        task = next((t for k, t in AZURE_TASKS.items() if k in Path(args.trace).stem), None)
        specs = load_azure(Path(args.trace), args.seed, task)
    else:
        specs = load_trace(args.trace, args.format)
    return scale_arrivals(specs, args.load) if args.load != 1.0 else specs


def slo_table(path: str | None) -> SloTable | None:
    """Table 6 with the template's tasks replaced; every error names the offending field."""
    if path is None:
        return None
    try:
        raw = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"--slo-template {path}: not JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise ValueError(f'--slo-template {path}: want {{"task": {{"ttft_s": x, "tpot_s": y}}}}')
    base = dict(TABLE_6)
    for task, slo in raw.items():
        base[_task(path, task)] = Slo(_seconds(path, slo, task, "ttft_s"),
                                      _seconds(path, slo, task, "tpot_s"))
    return SloTable(base=base)


def _task(path: str, name: str) -> TaskType:
    try:
        return TaskType(name)
    except ValueError:
        known = ", ".join(t.value for t in TaskType)
        raise ValueError(f"--slo-template {path}: unknown task {name!r}; known: {known}") from None


def _seconds(path: str, slo: object, task: str, key: str) -> float:
    value = slo.get(key) if isinstance(slo, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"--slo-template {path}: {task}.{key} must be a positive number")
    return float(value)


def slo_stacks(names: str | None) -> list[SloStack | None]:
    if not names:
        return [None]
    try:
        return [slo_stack(n.strip()) for n in names.split(",")]
    except KeyError as exc:
        raise ValueError(f"--ordering: {exc.args[0]}") from None


def run_replay(args: argparse.Namespace) -> int:
    if args.load <= 0:
        raise ValueError(f"--load must be positive, got {args.load:g}")
    specs = load_specs(args)
    config = ReplayConfig(
        workers=args.workers, kv_tokens=args.kv_tokens, cost_model=args.cost_model,
        concurrency=args.concurrency, duration_s=args.duration_s, time_scale=args.time_scale,
        residency=args.kv_residency, progress_every_s=0.0 if args.quiet else 5.0,
    )
    stacks = slo_stacks(args.ordering)
    if args.slo_template and not args.ordering:
        raise ValueError("--slo-template needs --ordering (SLOs are assigned by the SLO layer)")
    table = slo_table(args.slo_template)
    results = [
        Replay(specs, config, make_kv_policy(policy), stack, slos=table).run()
        for policy in args.policy.split(",") for stack in stacks
    ]
    out = {"params": _params(args, config, len(specs)), "results": results}
    text = json.dumps(out, indent=2)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    else:
        print(text)
    return 0


def _params(args: argparse.Namespace, config: ReplayConfig, n: int) -> dict[str, Any]:
    params = {k: v for k, v in vars(args).items() if k != "func"}
    params.update(programs=n, simulated=True, kv_check_interval_s=config.kv.check_interval_s)
    return params


def replay_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="agentd replay", description=__doc__)
    _arguments(p)
    return _run_reporting_errors(p.parse_args(argv))


def _run_reporting_errors(args: argparse.Namespace) -> int:
    try:
        return run_replay(args)
    except (TraceError, KeyError, ValueError, OSError) as exc:
        # A KeyError's str() is its repr; the message is its first argument.
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"agentd replay: {msg}", file=sys.stderr)
        return 2

