"""Daemon configuration: flags > AGENTD_* environment > TOML file > defaults."""

from __future__ import annotations

import ipaddress
import json
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import platformdirs

from daemon.content.settings import DEFAULT_REDACT

MIN_RESULT_BYTES = 1024


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key."""


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("agentd", appauthor=False))


def default_config_dir() -> Path:
    return Path(platformdirs.user_config_dir("agentd", appauthor=False))


@dataclass
class Config:
    host: str = "127.0.0.1"
    port: int = 8420
    db: str = ""  # SQLAlchemy URL; empty = SQLite file in data_dir
    data_dir: str = ""
    engine: str = "sim"  # engine of locally spawned workers: sim | vllm
    workers: int = 1  # local workers spawned at start (0 = only remote workers)
    model: str = ""  # model dir for vllm workers; model name for sim
    worker_bind: str = ""  # ZeroMQ endpoint the broker binds; empty = ipc in data_dir
    heartbeat_interval_s: float = 0.5
    heartbeat_timeout_s: float = 3.0
    queue_timeout_s: float = 60.0  # a queued request fails after this long with no worker
    # A running request moves to another worker after this long without a token while its
    # worker's engine does not step either (daemon/workers/watch.py); 0 = off.
    request_stall_timeout_s: float = 30.0
    # ... or after this long without a token at all, even if the engine steps; 0 = off.
    request_progress_timeout_s: float = 600.0
    max_body_bytes: int = 4 * 1024 * 1024
    max_tokens_limit: int = 32768
    # vllm-default | sticky | prefix-router | continuum-ttl | thunderagent | autellix-plas |
    # agentd (scheduling/kv/registry.py; sources in bench/README.md)
    kv_policy: str = "agentd"
    # Bound on a ready program's wait for KV; longer trades that bound for throughput
    # (bench/README.md, "Tuning notes").
    kv_force_resume_s: float = 30.0
    # Where a paused program's residency comes from: "events" (the engine's KV cache events
    # where its worker reports them, else an estimate from token counts) | "estimate" (the
    # estimate only: an ablation).
    kv_residency: str = "events"
    # [kv_options]: the agentd policy's AgentdOptions (scheduling/kv/agentd.py), for tuning
    # and ablations (bench/kv.py); empty = as shipped.
    kv_options: dict[str, Any] = field(default_factory=dict)
    # SLO scheduling (daemon/slo/settings.py): the policies each layer starts with.
    ordering_policy: str = "fcfs"  # a pool policy of scheduling/slo/ordering.py
    meta_policy: str = "meta-rules"  # meta-rules | meta-bandit | meta-llm | off | a pool policy
    meta_interval_s: float = 2.0
    admission_policy: str = "statera"  # statera | unbounded
    slo: dict[str, Any] = field(default_factory=dict)  # the [slo] tables: cycle, windows, rules
    log_format: str = "plain"  # plain | json
    log_level: str = "info"
    sim_kv_tokens: int = 65536
    sim_time_scale: float = 1.0
    sim_cost_model: str = ""
    vllm_kv_cache_bytes: int = 256 * 1024 * 1024
    # Host memory for KV blocks evicted from the GPU (vLLM's CPU offloading): they come back
    # over PCIe instead of being recomputed. GPU builds only: on the CPU build the KV cache
    # already lives in host memory, and a worker refuses a non-zero value. 0 = off.
    vllm_kv_offload_bytes: int = 0
    vllm_max_model_len: int = 2048
    vllm_dtype: str = "float32"
    vllm_block_size: int = 128  # a multiple of 32 on CPU
    vllm_cuda_graphs: bool = False  # GPU only: capture CUDA graphs instead of eager mode
    # Tool calling on vLLM workers (daemon/engines/vllm/tools.py): the parser that finds
    # calls in a reply ("" = none: tool_choice "auto" is refused), e.g. hermes; and the chat
    # template ("" = the model's own; a file, or "chatml-tools": ChatML with Hermes-format
    # calls, for SmolLM2, whose own template drops tools).
    vllm_tool_call_parser: str = ""
    vllm_chat_template: str = ""
    auth: bool = True  # false only on a loopback host
    config_dir: str = ""  # holds the first-start operator token; empty = XDG config dir
    max_prompt_chars: int = 1_000_000  # 0 = no limit
    max_queued_requests: int = 10_000  # 0 = no limit
    rate_limit_rps: float = 0.0  # per API token; 0 = off
    rate_limit_burst: int = 0  # 0 = max(1, rate_limit_rps)
    # Workflow runs (daemon/runtime/runs.py): the GPUs each run's agents may reserve
    # (-1 = the GPUs visible to the daemon), and how long a ready agent call waits for
    # room for an instance before it fails (0 = it fails at once).
    runtime_gpus: float = -1.0
    runtime_resource_wait_s: float = 60.0
    # Sandboxes are forked from a server that already imported what they need
    # (daemon/runtime/zygote.py), not exec'd one by one: about 0.2 s of CPU less a run.
    runtime_fork_server: bool = True
    # The most a run's result may take as JSON; a run returning more fails and says so,
    # and the daemon never reads more than this (plus room for a failure's report).
    max_result_bytes: int = 1024 * 1024
    # A chat request without a program_id whose messages extend an earlier request's
    # messages plus its reply joins that request's program (daemon/core/lineage.py); such a
    # program, and a Responses API chain's, ends after this long without a request.
    lineage_inference: bool = True
    lineage_idle_s: float = 120.0
    # A program with no request (and no tool of it running) for this long is ended as a
    # release would end it, tools reclaimed (daemon/core/expiry.py); 0 = never. A tenant's
    # [slo.tenants.NAME] table may set its own `program_idle_timeout_s`.
    program_idle_timeout_s: float = 1800.0
    # History (daemon/history/): the daemon samples its own series into the store every
    # history_interval_s (0 = off); raw samples are kept history_raw_keep_s, 1-minute
    # rollups history_minute_keep_s, 10-minute rollups history_ten_minute_keep_s, and the
    # event log history_events_keep_s.
    history_interval_s: float = 10.0
    history_raw_keep_s: float = 3600.0
    history_minute_keep_s: float = 86400.0
    history_ten_minute_keep_s: float = 7 * 86400.0
    history_events_keep_s: float = 7 * 86400.0
    # Content tracing (daemon/content/): store each request's prompt, completion and tool
    # arguments, redacted by content_redact's patterns and cut at content_max_chars a field;
    # off unless turned on here or in a tenant's [slo.tenants.NAME] `content_tracing`.
    content_tracing: bool = False
    content_max_chars: int = 16384
    content_redact: list[str] = field(default_factory=lambda: list(DEFAULT_REDACT))
    # [prices.MODEL] prompt_per_mtok = X, completion_per_mtok = Y: a cost beside token totals
    prices: dict[str, Any] = field(default_factory=dict)
    # POST /v1/sessions/{id}/export/otlp sends a session's spans (GenAI semantic conventions)
    # to this OTLP/HTTP traces endpoint (http://collector:4318/v1/traces); "" = not offered.
    # [otlp_headers]: headers it sends (a collector's API key).
    otlp_endpoint: str = ""
    otlp_headers: dict[str, Any] = field(default_factory=dict)
    # Tool specs by name, from the config file's [tools.NAME] tables.
    tools: dict[str, Any] = field(default_factory=dict)
    # [placement]: where the daemon's own workers run: `backend = "local"` (child
    # processes) or "ray" (actors on a Ray cluster's nodes); daemon/workers/placement.py.
    placement: dict[str, Any] = field(default_factory=dict)
    # Docker engines by pool, from [tool_pools.NAME] tables (`hosts = ["unix://…", "tcp://…"]`);
    # a tool's `pool` picks one. Empty: every docker tool runs on the DOCKER_HOST engine.
    tool_pools: dict[str, Any] = field(default_factory=dict)

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir) if self.data_dir else default_data_dir()

    @property
    def config_path(self) -> Path:
        return Path(self.config_dir) if self.config_dir else default_config_dir()

    @property
    def db_url(self) -> str:
        if self.db:
            return self.db
        return f"sqlite+aiosqlite:///{self.data_path / 'agentd.db'}"

    @property
    def broker_endpoint(self) -> str:
        return self.worker_bind or f"ipc://{self.data_path / 'workers.sock'}"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


_FIELDS = {f.name: f for f in fields(Config)}


def _coerce(key: str, value: Any) -> Any:
    kind = type(getattr(Config(), key))
    try:
        if kind is bool:
            return str(value).lower() in ("1", "true", "yes", "on")
        if kind is list and isinstance(value, str):  # from the environment: a JSON list
            value = json.loads(value)
        return kind(value)
    except (TypeError, ValueError) as exc:  # json's errors are ValueErrors
        raise ConfigError(f"config key '{key}': expected {kind.__name__}, got {value!r}") from exc


def _from_file(path: Path) -> dict[str, Any]:
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc
    section = raw.get("agentd", raw)
    unknown = sorted(set(section) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"config file {path}: unknown key(s): {', '.join(unknown)}")
    return dict(section)


def _from_env(env: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _FIELDS:
        value = env.get(f"AGENTD_{name.upper()}")
        if value is not None:
            out[name] = value
    return out


def load(
    flags: dict[str, Any] | None = None,
    config_file: str | None = None,
    env: dict[str, str] | None = None,
) -> Config:
    env = dict(os.environ) if env is None else env
    merged: dict[str, Any] = {}
    file_path = config_file or env.get("AGENTD_CONFIG")
    if file_path:
        merged.update(_from_file(Path(file_path)))
    merged.update(_from_env(env))
    merged.update({k: v for k, v in (flags or {}).items() if v is not None})
    cfg = Config(**{k: _coerce(k, v) for k, v in merged.items() if k in _FIELDS})
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    from tools.spec import DEFAULT_POOL, SpecError, parse_pools, parse_table

    try:
        pools = parse_pools(cfg.tool_pools)
    except SpecError as exc:
        raise ConfigError(f"config tool_pools: {exc.message}") from exc
    for name, raw in cfg.tools.items():
        try:
            spec = parse_table(name, raw, trusted=True)
        except (SpecError, TypeError) as exc:
            raise ConfigError(f"config tools.{name}: {exc}") from exc
        if spec.pool not in (None, DEFAULT_POOL, *pools):
            raise ConfigError(f"config tools.{name}: pool {spec.pool!r} is not one of the "
                              f"[tool_pools] tables ({', '.join(sorted(pools)) or 'none'})")
    if cfg.engine not in ("sim", "vllm"):
        raise ConfigError(f"engine must be 'sim' or 'vllm', got {cfg.engine!r}")
    if not 0 <= cfg.port <= 65535:
        raise ConfigError(f"port must be 0-65535, got {cfg.port}")
    if cfg.workers < 0:
        raise ConfigError(f"workers must be >= 0, got {cfg.workers}")
    from scheduling.kv import KV_POLICIES

    if cfg.kv_policy not in KV_POLICIES:
        raise ConfigError(
            f"kv_policy must be one of {', '.join(sorted(KV_POLICIES))}, got {cfg.kv_policy!r}")
    if cfg.kv_residency not in ("events", "estimate"):
        raise ConfigError(
            f"kv_residency must be 'events' or 'estimate', got {cfg.kv_residency!r}")
    if cfg.kv_options:
        from scheduling.kv.registry import agentd_options

        try:
            agentd_options(cfg.kv_policy, cfg.kv_options)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    from daemon.slo.settings import config_problem

    problem = config_problem(cfg)
    if problem is not None:
        raise ConfigError(problem)
    if not cfg.kv_force_resume_s > 0:
        raise ConfigError(f"kv_force_resume_s must be > 0, got {cfg.kv_force_resume_s!r}")
    from daemon.engines.vllm.tools import BUNDLED_TEMPLATES

    template = cfg.vllm_chat_template
    if template and template not in BUNDLED_TEMPLATES and not Path(template).is_file():
        raise ConfigError(f"vllm_chat_template {template!r} is not a file nor one of "
                          f"{', '.join(BUNDLED_TEMPLATES)}")
    if cfg.log_format not in ("plain", "json"):
        raise ConfigError(f"log_format must be 'plain' or 'json', got {cfg.log_format!r}")
    if cfg.heartbeat_timeout_s <= cfg.heartbeat_interval_s:
        raise ConfigError("heartbeat_timeout_s must be larger than heartbeat_interval_s")
    for key in ("request_stall_timeout_s", "request_progress_timeout_s"):
        if not getattr(cfg, key) >= 0:
            raise ConfigError(f"{key} must be >= 0 (0 turns the timeout off)")
    if not (cfg.runtime_gpus >= 0 or cfg.runtime_gpus == -1):
        raise ConfigError(f"runtime_gpus must be >= 0, or -1 for the GPUs visible to the "
                          f"daemon, got {cfg.runtime_gpus!r}")
    if not cfg.lineage_idle_s > 0:
        raise ConfigError(f"lineage_idle_s must be > 0, got {cfg.lineage_idle_s!r}")
    _check_idle_timeouts(cfg)
    _check_placement(cfg)
    _check_history(cfg)
    _check_content(cfg)
    if not cfg.runtime_resource_wait_s >= 0:
        raise ConfigError("runtime_resource_wait_s must be >= 0 (0: no wait)")
    if cfg.max_result_bytes < MIN_RESULT_BYTES:
        raise ConfigError(f"max_result_bytes must be at least {MIN_RESULT_BYTES}, "
                          f"got {cfg.max_result_bytes}")
    for key in ("max_prompt_chars", "max_queued_requests", "rate_limit_rps", "rate_limit_burst"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{key} must be >= 0 (0 turns the limit off)")
    if not cfg.auth and not is_loopback(cfg.host):
        raise ConfigError(f"auth = false is only allowed on a loopback host, not {cfg.host!r}; "
                          "keep auth on and give clients a token (`agentd token create`)")


def _check_idle_timeouts(cfg: Config) -> None:
    from scheduling.kv.idle import TIMEOUT_KEY, tenant_timeouts, timeout_value

    try:
        timeout_value(TIMEOUT_KEY, cfg.program_idle_timeout_s)
        tenant_timeouts(cfg.slo.get("tenants", {}))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _check_placement(cfg: Config) -> None:
    from daemon.workers import placement_settings

    try:
        settings = placement_settings.parse(cfg.placement)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    problem = placement_settings.problem(cfg, settings)
    if problem is not None:
        raise ConfigError(problem)


def _check_history(cfg: Config) -> None:
    if not cfg.history_interval_s >= 0:
        raise ConfigError(f"history_interval_s must be >= 0 (0 turns sampling off), "
                          f"got {cfg.history_interval_s!r}")
    # each tier must outlive two buckets of the tier that folds it, or points are pruned
    # before they are rolled up
    for key, least in (("history_raw_keep_s", 120.0), ("history_minute_keep_s", 1200.0),
                       ("history_ten_minute_keep_s", 1200.0),
                       ("history_events_keep_s", 60.0)):
        if not getattr(cfg, key) >= least:
            raise ConfigError(f"{key} must be >= {least:.0f}, got {getattr(cfg, key)!r}")


def _check_content(cfg: Config) -> None:
    from daemon.content.settings import parse

    if cfg.otlp_endpoint and not cfg.otlp_endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"otlp_endpoint must be an http:// or https:// URL, "
                          f"got {cfg.otlp_endpoint!r}")
    if not all(isinstance(v, str) for v in cfg.otlp_headers.values()):
        raise ConfigError("otlp_headers must be a table of strings")

    try:
        parse(cfg.content_tracing, cfg.content_max_chars, cfg.content_redact,
              cfg.slo.get("tenants", {}), cfg.prices)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
