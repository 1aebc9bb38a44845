"""A prompt no healthy worker's KV can hold is refused at submit, with a 400."""

from __future__ import annotations

import pytest

from daemon.core.fit import refuse_unservable
from daemon.errors import CoreError
from daemon.state import WorkerState


def worker(wid: str, capacity: int, status: str = "healthy") -> WorkerState:
    return WorkerState(wid, wid.encode(), "sim", "m", capacity, 16, 8, 0, "h", 0.0, 0.0,
                       status=status)


def test_a_prompt_the_largest_healthy_worker_holds_passes() -> None:
    refuse_unservable(4095, [worker("a", 4096), worker("b", 1024)])
    refuse_unservable(10**6, [])  # no healthy worker yet: the limit is unknown


def test_a_prompt_no_healthy_worker_holds_is_refused_naming_the_sizes() -> None:
    with pytest.raises(CoreError, match=r"prompt of 4096 tokens .* 4096 tokens") as err:
        refuse_unservable(4096, [worker("a", 4096), worker("big", 10**6, status="gone")])
    assert err.value.status == 400 and err.value.code == "prompt_too_long"
