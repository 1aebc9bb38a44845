"""The core's answers to the dispatch step's questions (scheduling/dispatch.py's `Layers`),
read from its live state: requests and programs, the SLO stack's fence, the KV policy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from daemon.state import RESIDENT, ProgramState, RequestState, RequestStatus, WorkerState
from scheduling.slo.admission import AdmissionDecision

if TYPE_CHECKING:
    from daemon.kv.loop import KvControl
    from daemon.slo.stack import SloControl


class CoreLayers:
    def __init__(self, requests: dict[str, RequestState], programs: dict[str, ProgramState],
                 workers: dict[str, WorkerState], slo: SloControl, kv: KvControl) -> None:
        self.requests, self.programs, self.workers = requests, programs, workers
        self.slo, self.kv = slo, kv

    def queued(self, request_id: str) -> bool:
        req = self.requests.get(request_id)
        return req is not None and req.status == RequestStatus.QUEUED

    def home(self, request_id: str) -> str | None:
        return home(self._program(request_id), self.workers)

    def admits(self, request_id: str, worker: str) -> AdmissionDecision:
        return self.slo.admit(request_id, self.workers[worker])

    def route(self, request_id: str, now: float) -> str | None:
        worker = self.kv.route(self._program(request_id), now)
        return worker if worker in self.workers else None

    def has_room(self, worker: str) -> bool:
        return self.slo.has_room(worker)

    def _program(self, request_id: str) -> ProgramState:
        return self.programs[self.requests[request_id].program_id]


def home(program: ProgramState, workers: dict[str, WorkerState]) -> str | None:
    """The healthy worker holding the program's KV, which its next request goes to."""
    worker = workers.get(program.worker_id or "")
    if program.status in RESIDENT and worker is not None and worker.healthy:
        return worker.id
    return None
