"""What a replay tells the KV policy about a paused program's cache, and how well the
daemon's estimate (scheduling/kv/residency.py) matches the sim engine's truth.

``engine`` gives the policy the truth read from the sim's block cache; ``estimate``
gives it what the daemon would estimate from engine-reported token counts; ``unknown``
gives it None (no estimate: the issue's plain order); ``cold`` gives it False, what the
daemon's view said of every paused program before it estimated. Either way
the estimate is kept and scored against the truth on every view of a PAUSED program,
so an ``engine`` run also reports how the estimate would have done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scheduling.kv.residency import ResidencyEstimator

RESIDENCY_MODES = ("engine", "estimate", "unknown", "cold")


@dataclass
class Accuracy:
    views: int = 0  # PAUSED-program views scored
    agree: int = 0
    false_resident: int = 0  # estimated cached, evicted in truth
    false_cold: int = 0  # estimated evicted, cached in truth
    unknown: int = 0  # no estimate (no request of the program ended)

    def score(self, estimate: bool | None, truth: bool) -> None:
        self.views += 1
        if estimate is None:
            self.unknown += 1
        elif estimate == truth:
            self.agree += 1
        elif estimate:
            self.false_resident += 1
        else:
            self.false_cold += 1

    def row(self) -> dict[str, Any]:
        share = round(self.agree / self.views, 4) if self.views else None
        return {"paused_views": self.views, "agree_share": share, "agree": self.agree,
                "false_resident": self.false_resident, "false_cold": self.false_cold,
                "unknown": self.unknown}


class ResidencyProbe:
    def __init__(self, mode: str) -> None:
        if mode not in RESIDENCY_MODES:
            raise ValueError(f"residency must be one of {', '.join(RESIDENCY_MODES)}, "
                             f"got {mode!r}")
        self.mode = mode
        self.estimator = ResidencyEstimator()
        self.accuracy = Accuracy()

    def request_ended(self, program_id: str, worker_id: str, prompt: int, cached: int,
                      output: int, used_tokens: int, capacity_tokens: int,
                      block_size: int) -> None:
        self.estimator.request_ended(program_id, worker_id, prompt, cached, output,
                                     used_tokens, capacity_tokens, block_size)

    def request_hit(self, program_id: str, worker_id: str, cached: int) -> None:
        self.estimator.request_hit(program_id, worker_id, cached)

    def seen(self, program_id: str, worker_id: str | None, used_tokens: int,
             truth: bool) -> bool | None:
        """What the policy is told of a PAUSED program whose cache truly is `truth`."""
        estimate = self.estimator.resident(program_id, worker_id, used_tokens)
        self.accuracy.score(estimate, truth)
        return {"engine": truth, "estimate": estimate, "cold": False}.get(self.mode)

    def stopped(self, program_id: str) -> None:
        self.estimator.forget(program_id)

    def row(self) -> dict[str, Any]:
        return {"residency": self.mode, "residency_estimate": self.accuracy.row()}
