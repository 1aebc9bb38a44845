"""Step-time cost model of the simulated engine, with JSON load/save.

    t_step = c0 + c_prefill·prefill_tokens + c_decode·decode_seqs + c_attn·Σ context tokens
           + c_pf·Σ over prefill chunks of chunk·(context before the chunk + chunk/2)

The last term is the quadratic part of prefill attention: a chunk of ``n`` new tokens after
``p`` cached ones attends to about ``n·(p + n/2)`` query-key pairs. Constants are seconds.

Shipped models live in ``cost_models/<name>.json`` next to this file; ``load_cost_model`` takes
either such a name or a path to a file written by ``CostModel.save`` (or ``agentd calibrate``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

COST_MODELS_DIR = Path(__file__).parent / "cost_models"
# The default local worker is SmolLM2 on CPU, so the sim default mimics it.
DEFAULT_COST_MODEL = "smollm2-135m-cpu"


@dataclass(frozen=True, kw_only=True)
class CostModel:
    name: str
    c0: float
    c_prefill: float
    c_decode: float
    c_attn: float
    c_pf: float = 0.0
    source: str = ""
    # Engine settings the figures assume (kv_capacity_tokens, max_batch, ...): hints for a CLI.
    defaults: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for k in ("c0", "c_prefill", "c_decode", "c_attn", "c_pf"):
            if getattr(self, k) < 0:
                raise ValueError(f"cost model {self.name!r}: {k} must be >= 0")

    def step_time(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        context_tokens: int,
        prefill_pairs: float = 0.0,
    ) -> float:
        """Modelled seconds for one engine step; an empty step costs nothing."""
        if prefill_tokens == 0 and decode_seqs == 0:
            return 0.0
        return (
            self.c0
            + self.c_prefill * prefill_tokens
            + self.c_decode * decode_seqs
            + self.c_attn * context_tokens
            + self.c_pf * prefill_pairs
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostModel:
        known = {"name", "c0", "c_prefill", "c_decode", "c_attn", "c_pf", "source", "defaults"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown cost model fields: {sorted(unknown)}")
        return cls(**data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        return cls.from_dict(json.loads(Path(path).read_text()))


def prefill_pairs(chunk: int, context_before: int) -> float:
    return chunk * (context_before + chunk / 2)


def shipped_cost_models() -> list[str]:
    return sorted(p.stem for p in COST_MODELS_DIR.glob("*.json"))


def load_cost_model(name_or_path: str | Path = DEFAULT_COST_MODEL) -> CostModel:
    """A shipped model by name (``llama3-8b-h100``), else a JSON file path."""
    shipped = COST_MODELS_DIR / f"{name_or_path}.json"
    if isinstance(name_or_path, str) and "/" not in name_or_path and shipped.is_file():
        return CostModel.load(shipped)
    path = Path(name_or_path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no cost model {str(name_or_path)!r}: not a file, and not one of "
            f"{shipped_cost_models()}"
        )
    return CostModel.load(path)
