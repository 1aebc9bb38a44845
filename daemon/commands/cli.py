"""`agentd`: start the daemon, run a worker, fetch the model, replay traces.

Every failure a user can cause ends with one readable line on stderr and a
non-zero exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from daemon.commands.calibrate import add_calibrate_parser
from daemon.commands.errors import CliError
from daemon.commands.stop import add_stop_parser
from daemon.commands.token import add_token_parser
from daemon.config import ConfigError
from daemon.replay.cli import add_replay_parser

EXIT_USAGE = 2
EXIT_FAILURE = 1


# Libraries whose INFO lines are per request (the web UI calls the API through httpx):
# warnings only, unless the log level is debug.
CHATTY_LOGGERS = ("httpx", "httpcore")


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(
            logging.NOTSET if root.level <= logging.DEBUG else logging.WARNING)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": round(record.created, 3), "level": record.levelname.lower(),
                               "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


# --- agentd start -------------------------------------------------------------------


def cmd_start(args: argparse.Namespace) -> int:
    import uvicorn

    from daemon import config as config_mod
    from daemon.app import create_app
    from daemon.standby import run as standby_run
    from daemon.workers import placement_settings
    from db.lease import supports_lease

    flags = {k: getattr(args, k) for k in
             ("host", "port", "db", "data_dir", "engine", "workers", "model", "log_format")}
    cfg = config_mod.load(flags, config_file=args.config)
    setup_logging(cfg.log_level, cfg.log_format)
    # Bound before anything starts, so a port in use is one line and exit 1, and the
    # "serving on" line comes only once the address is ours.
    if args.standby and not supports_lease(cfg.db_url):
        raise CliError("--standby needs a PostgreSQL store (--db postgresql+asyncpg://...): "
                       "an SQLite file has no lease another daemon could take over")
    try:
        placement_settings.check_at_start(cfg)
    except placement_settings.PlacementError as exc:
        raise CliError(str(exc)) from None
    sock = listen_socket(cfg.host, cfg.port)
    cfg.port = cfg.port or int(sock.getsockname()[1])  # port 0: the one the system chose

    def server_config(app: Any) -> uvicorn.Config:
        return uvicorn.Config(app, host=cfg.host, port=cfg.port, log_config=None,
                              access_log=False, lifespan="on", timeout_graceful_shutdown=10)

    # uvicorn re-raises the stop signal after its graceful shutdown; a no-op handler
    # underneath turns a clean SIGTERM/SIGINT stop into exit code 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    # on PostgreSQL: the store's lease first, waiting for it as a standby (daemon/standby/)
    serving = standby_run.serve(cfg, args.standby, sock, lambda: listen_socket(cfg.host, cfg.port),
                                lambda: create_app(cfg), server_config)
    try:
        with asyncio.Runner(loop_factory=server_config(None).get_loop_factory()) as runner:
            started = runner.run(serving)
    except standby_run.StartRefused as exc:
        raise CliError(str(exc)) from exc
    if not started:
        raise CliError(f"could not start on {cfg.base_url}; the log above says why")
    return 0


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port); CliError naming the address if it cannot be."""
    where = f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise CliError(f"cannot listen on {where}: {exc.strerror or exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise CliError(f"cannot listen on {where}: {exc.strerror or exc}") from exc
    return sock


# --- agentd worker ------------------------------------------------------------------


def build_engine(args: argparse.Namespace) -> Any:
    if args.engine == "sim":
        if args.tensor_parallel_size != 1:
            raise CliError("--tensor-parallel-size is for vllm workers: the sim engine models "
                           "one rank")
        from daemon.engines.sim.cost import load_cost_model
        from daemon.engines.sim.engine import SimEngine

        try:
            cost = load_cost_model(args.cost_model)
        except FileNotFoundError as exc:
            raise CliError(str(exc)) from exc
        return SimEngine(
            model=args.model or "sim-llama3-8b", kv_capacity_tokens=args.kv_tokens,
            block_size=args.block_size or 16, max_batch=args.max_batch,
            cost_model=cost, time_scale=args.time_scale,
        )
    from daemon.engines.vllm.engine import VllmEngine
    from daemon.models.smollm2 import DEFAULT_SMOLLM2_DIR

    try:
        return VllmEngine(
            model_dir=args.model or str(DEFAULT_SMOLLM2_DIR), kv_cache_bytes=args.kv_cache_bytes,
            block_size=args.block_size or 128, max_model_len=args.max_model_len,
            dtype=args.dtype, enforce_eager=not args.no_enforce_eager,
            max_num_seqs=args.max_batch, tool_call_parser=args.tool_call_parser,
            chat_template=args.chat_template, kv_offload_bytes=args.kv_offload_bytes,
            tensor_parallel_size=args.tensor_parallel_size,
        )
    except ValueError as exc:  # a setting that cannot work: one line, not a traceback
        raise CliError(str(exc)) from exc


def _rank(text: str) -> int:
    rank = int(text)  # argparse turns a ValueError into one usage line
    if rank < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {rank}")
    return rank


def cmd_worker(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from daemon.core import interpreter_tuning
    from daemon.engines.worker import EndpointError, WorkerRuntime
    from daemon.workers.key import WorkerKeyError, default_key_path, read_worker_key

    setup_logging(args.log_level, "plain")
    try:  # before the engine loads: a missing key should not cost a model load
        key = read_worker_key(Path(args.key_file) if args.key_file else default_key_path())
    except WorkerKeyError as exc:
        raise CliError(str(exc)) from exc
    try:
        runtime = WorkerRuntime(build_engine(args),
                                args.connect or [os.environ.get("AGENTD_CONNECT", "")],
                                args.worker_id, key=key, node=args.node, dp_rank=args.dp_rank)
    except EndpointError as exc:
        raise CliError(str(exc)) from exc
    # A worker's full collections delay every answer it streams, as the daemon's would.
    interpreter_tuning.settle_after_startup()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, runtime.stop)
        await runtime.run()

    asyncio.run(run())
    return 1 if runtime.engine_died else 0


# --- agentd model -------------------------------------------------------------------


def cmd_model_fetch(args: argparse.Namespace) -> int:
    from daemon.models.smollm2 import fetch_command

    return fetch_command(args.dest)


# --- parser -------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentd", description="A serving daemon for agent programs.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("start", help="run the daemon in the foreground")
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.add_argument("--db", help="SQLAlchemy URL (default: SQLite file in the data dir)")
    s.add_argument("--standby", action="store_true",
                   help="PostgreSQL only: answer 503 until the active daemon's store lease "
                   "lapses, then take over")
    s.add_argument("--data-dir")
    s.add_argument("--engine", choices=["sim", "vllm"])
    s.add_argument("--workers", type=int, help="local workers to spawn")
    s.add_argument("--model", help="model dir (vllm) or model name (sim)")
    s.add_argument("--config", help="TOML config file")
    s.add_argument("--log-format", choices=["plain", "json"])
    s.set_defaults(func=cmd_start)

    w = sub.add_parser("worker", help="run one engine worker that connects to a daemon")
    w.add_argument("--engine", choices=["sim", "vllm"], default="sim")
    w.add_argument("--connect", action="append", help="the daemon's worker endpoint "
                   "(tcp:// or ipc://); several (repeated, or comma-separated: an active "
                   "daemon and its standbys) are all tried, the worker registers with the one "
                   "that answers (default: AGENTD_CONNECT)")
    w.add_argument("--worker-id")
    w.add_argument("--node", default="", help="the node it runs on, as the daemon shows it "
                   "and prices moves between nodes (default: the host name)")
    w.add_argument("--dp-rank", type=_rank, help="its data-parallel rank (>= 0)")
    w.add_argument("--key-file", help="a copy of the daemon's worker key (default: "
                   "worker.key in $AGENTD_CONFIG_DIR or ~/.config/agentd)")
    w.add_argument("--model")
    w.add_argument("--max-batch", type=int, default=64)
    w.add_argument("--block-size", type=int)
    w.add_argument("--kv-tokens", type=int, default=65536, help="sim: KV capacity in tokens")
    w.add_argument("--time-scale", type=float, default=1.0,
                   help="sim: <1 runs faster than modelled")
    w.add_argument("--cost-model", default="llama3-8b-h100",
                   help="sim: a shipped cost model name or a JSON file from `agentd calibrate`")
    w.add_argument("--kv-cache-bytes", type=int, default=256 * 1024 * 1024, help="vllm")
    w.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="vllm on GPUs: split the model over this many of the visible GPUs")
    w.add_argument("--kv-offload-bytes", type=int, default=0,
                   help="vllm on a GPU: host memory for KV blocks evicted from the GPU")
    w.add_argument("--max-model-len", type=int, default=2048, help="vllm")
    w.add_argument("--dtype", default="float32",
                   help="vllm (float32: vLLM's CPU bf16 kernels flip SmolLM2's greedy answers)")
    w.add_argument("--no-enforce-eager", action="store_true", help="vllm: allow compiled mode")
    w.add_argument("--tool-call-parser", default="",
                   help="vllm: vLLM's parser of tool calls in replies (e.g. hermes); none: "
                   "tool_choice 'auto' is refused")
    w.add_argument("--chat-template", default="",
                   help="vllm: a chat template file, or 'chatml-tools' (ChatML with Hermes "
                   "tool calls); default: the model's own")
    w.add_argument("--log-level", default="info")
    w.set_defaults(func=cmd_worker)

    m = sub.add_parser("model", help="manage models")
    msub = m.add_subparsers(dest="model_command", required=True)
    f = msub.add_parser("fetch-smollm2", help="download and convert SmolLM2-135M-Instruct")
    f.add_argument("dest", nargs="?", default=None,
                   help="target directory (default: agentd/models/SmolLM2-135M-Instruct under "
                        "$XDG_CACHE_HOME, or ~/.cache)")
    f.set_defaults(func=cmd_model_fetch)
    add_token_parser(sub)
    add_stop_parser(sub)
    add_replay_parser(sub)
    add_calibrate_parser(sub)
    return p


def run_cli(argv: Sequence[str] | None, parser: Callable[[], argparse.ArgumentParser]) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (CliError, ConfigError) as exc:
        print(f"{parser().prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, ConfigError) else EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    except SystemExit:
        raise
    except OSError as exc:
        print(f"{parser().prog}: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "),
              file=sys.stderr)
        return EXIT_FAILURE


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(argv, build_parser)


if __name__ == "__main__":
    sys.exit(main())
