"""The core's answers to the dispatch step's questions (scheduling/dispatch.py's `Layers`),
read from its live state: requests and programs, the SLO stack's fence, the KV policy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from daemon.state import RESIDENT, ProgramState, RequestStatus, WorkerState
from scheduling.slo.admission import AdmissionDecision

if TYPE_CHECKING:
    from daemon.core.core import Core


class CoreLayers:
    def __init__(self, core: Core) -> None:
        self.core = core

    def queued(self, request_id: str) -> bool:
        req = self.core.requests.get(request_id)
        return req is not None and req.status == RequestStatus.QUEUED

    def home(self, request_id: str) -> str | None:
        return home(self._program(request_id), self.core.workers)

    def admits(self, request_id: str, worker: str) -> AdmissionDecision:
        return self.core.slo.admit(request_id, self.core.workers[worker])

    def route(self, request_id: str) -> str | None:
        worker = self.core.kv.route(self._program(request_id))
        return worker if worker in self.core.workers else None

    def has_room(self, worker: str) -> bool:
        return self.core.slo.has_room(worker)

    def _program(self, request_id: str) -> ProgramState:
        return self.core.programs[self.core.requests[request_id].program_id]


def home(program: ProgramState, workers: dict[str, WorkerState]) -> str | None:
    """The healthy worker holding the program's KV, which its next request goes to."""
    worker = workers.get(program.worker_id or "")
    if program.status in RESIDENT and worker is not None and worker.healthy:
        return worker.id
    return None
