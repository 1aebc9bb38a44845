"""``agentd replay``: run traces through the daemon's own scheduling in virtual time, with
simulated workers in process (daemon/replay/virtual.py), and write a JSON comparison.
Every number it prints is simulated.

It reads the same configuration as ``agentd start`` (``--config FILE``, ``AGENTD_*``
variables, the same keys and defaults). ``--policy`` and ``--ordering`` run several
configurations side by side: each value sets ``kv_policy``, or the SLO layers
(``meta_policy``: a pool policy runs fixed, ``meta-rules`` / ``meta-bandit`` /
``meta-llm`` switch among the pool; ``full`` is ``meta-rules`` with the ``statera``
admission, the daemon's default). The hardware flags describe the simulated workers; their
defaults are the daemon's own simulated worker's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from daemon import config as config_mod
from daemon.config import Config, ConfigError
from daemon.replay.synthetic import synthetic_programs
from daemon.replay.traces import FORMATS, TraceError, load_azure, load_trace, scale_arrivals
from daemon.replay.virtual import Hardware, Workload, replay
from daemon.replay.workload import ProgramSpec
from scheduling.kv import KV_POLICIES
from scheduling.layers import META_POLICIES
from scheduling.slo.ordering import default_registry
from scheduling.slo.templates import TaskType

AZURE_TASKS = {"code": TaskType.CODE_GENERATION.value, "conv": TaskType.DIALOGUE.value}
# --ordering values besides the pool policies: the meta policies, and `full`.
FULL = {"meta_policy": "meta-rules", "admission_policy": "statera"}
ORDERINGS = (*default_registry().names(), *META_POLICIES, "full")


def add_replay_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "replay", help="replay a trace through the daemon's scheduling in virtual time")
    _arguments(p)
    p.set_defaults(func=_run_reporting_errors)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", nargs="?", help="trace file (omit with --synthetic-agents)")
    p.add_argument("--format", choices=FORMATS, default="programs")
    p.add_argument("--synthetic-agents", type=int, metavar="N",
                   help="N synthetic agent programs fitted to the TraceLab session")
    p.add_argument("--config", help="the daemon's TOML config file (as agentd start)")
    p.add_argument("--policy", help="kv_policy values run side by side, comma-separated: "
                                    f"{', '.join(sorted(KV_POLICIES))} (default: the config's)")
    p.add_argument("--ordering", help="SLO layers run side by side, comma-separated: "
                                      f"{', '.join(ORDERINGS)} (default: the config's)")
    hw = Hardware()
    p.add_argument("--workers", type=int, help="simulated workers (default: the config's)")
    p.add_argument("--kv-tokens", type=int,
                   help="KV capacity per worker (default: the config's sim_kv_tokens)")
    p.add_argument("--host-kv-tokens", type=int, default=0,
                   help="a host-memory tier per worker holding evicted blocks, loaded back "
                        "over PCIe instead of recomputed (vLLM's CPU offloading on a GPU "
                        "build; default 0: none)")
    p.add_argument("--cost-model", help="shipped name or JSON file "
                                        "(default: the config's sim_cost_model)")
    p.add_argument("--time-scale", type=float,
                   help="multiplies step time (default: the config's sim_time_scale)")
    p.add_argument("--max-batch", type=int, default=hw.max_num_seqs,
                   help="sequences per step, as `agentd worker --max-batch`")
    p.add_argument("--max-batched-tokens", type=int, default=hw.max_batched_tokens,
                   help="tokens per step")
    p.add_argument("--concurrency", type=int, help="cap on live programs (closed loop)")
    p.add_argument("--duration-s", type=float, help="stop at this virtual time")
    p.add_argument("--load", type=float, default=1.0, help="multiplies the arrival rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--store", help="keep the run's programs, requests and traces in this "
                                   "SQLite file (open it with agentd start --db)")
    p.add_argument("--json", dest="json_out", help="write the result JSON here")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--progress-every", type=float, default=5.0, metavar="S",
                   help="wall seconds between progress lines (virtual time, requests and "
                        "programs done, ETA) on stderr")


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


def variants(base: Config, policies: str | None, orderings: str | None) -> list[Config]:
    """The configurations to run: every --policy with every --ordering."""
    kv = [p.strip() for p in policies.split(",")] if policies else [base.kv_policy]
    slo = [o.strip() for o in orderings.split(",")] if orderings else [None]
    out = []
    for policy in kv:
        if policy not in KV_POLICIES:
            raise ValueError(f"--policy: unknown {policy!r}; known: {', '.join(KV_POLICIES)}")
        for ordering in slo:
            changes: dict[str, Any] = {"kv_policy": policy}
            if ordering == "full":
                changes.update(FULL)
            elif ordering is not None:
                if ordering not in ORDERINGS:
                    raise ValueError(f"--ordering: unknown {ordering!r}; known: "
                                     f"{', '.join(ORDERINGS)}")
                changes["meta_policy"] = ordering
            cfg = dataclasses.replace(base, **changes)
            config_mod.validate(cfg)
            out.append(cfg)
    return out


def hardware(args: argparse.Namespace, cfg: Config) -> Hardware:
    return Hardware(
        workers=args.workers if args.workers is not None else max(1, cfg.workers),
        kv_tokens=args.kv_tokens or cfg.sim_kv_tokens, host_kv_tokens=args.host_kv_tokens,
        cost_model=args.cost_model or cfg.sim_cost_model or Hardware.cost_model,
        time_scale=args.time_scale if args.time_scale is not None else cfg.sim_time_scale,
        max_num_seqs=args.max_batch, max_batched_tokens=args.max_batched_tokens)


def run_replay(args: argparse.Namespace) -> int:
    if args.load <= 0:
        raise ValueError(f"--load must be positive, got {args.load:g}")
    base = config_mod.load(config_file=args.config)
    configs = variants(base, args.policy, args.ordering)
    specs = load_specs(args)
    hw = hardware(args, base)
    if args.progress_every <= 0:
        raise ValueError(f"--progress-every must be positive, got {args.progress_every:g}")
    workload = Workload(args.concurrency, args.duration_s,
                        0.0 if args.quiet else args.progress_every)
    if args.store and len(configs) > 1:
        raise ValueError("--store keeps one run: give one --policy and one --ordering")
    store = Path(args.store) if args.store else None
    if store is not None and store.exists():
        raise ValueError(f"--store {store}: the file exists; a run's store starts empty")
    results = [replay(specs, cfg, hw, workload, _label(cfg, args), store) for cfg in configs]
    out = {"params": _params(args, hw, len(specs)), "results": results}
    text = json.dumps(out, indent=2)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    else:
        print(text)
    return 0


def _label(cfg: Config, args: argparse.Namespace) -> str:
    return f"{cfg.kv_policy}/{cfg.meta_policy}" if args.ordering else cfg.kv_policy


def _params(args: argparse.Namespace, hw: Hardware, n: int) -> dict[str, Any]:
    params = {k: v for k, v in vars(args).items() if k != "func"}
    params.update(programs=n, simulated=True, hardware=dataclasses.asdict(hw))
    return params


def replay_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="agentd replay", description=__doc__)
    _arguments(p)
    return _run_reporting_errors(p.parse_args(argv))


def _run_reporting_errors(args: argparse.Namespace) -> int:
    try:
        return run_replay(args)
    except (TraceError, ConfigError, KeyError, ValueError, OSError) as exc:
        # A KeyError's str() is its repr; the message is its first argument.
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"agentd replay: {msg}", file=sys.stderr)
        return 2
