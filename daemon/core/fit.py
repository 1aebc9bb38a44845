"""Requests no worker could ever serve, refused when they arrive."""

from __future__ import annotations

from collections.abc import Iterable

from daemon.errors import CoreError
from daemon.state import WorkerState


def refuse_unservable(prompt_tokens: int, workers: Iterable[WorkerState]) -> None:
    """CoreError (400, `prompt_too_long`) when a prompt is at least every healthy worker's
    whole KV cache: no placement can ever run it (the engine needs room for one more token),
    and a program-aware KV policy would otherwise hold it in the queue for good. With no
    healthy worker the limit is unknown and the request queues as any other."""
    capacities = [w.kv_capacity_tokens for w in workers if w.healthy]
    if capacities and prompt_tokens >= max(capacities):
        raise CoreError(
            f"prompt of {prompt_tokens} tokens does not fit the KV cache of any worker "
            f"(the largest holds {max(capacities)} tokens)", status=400, code="prompt_too_long")
