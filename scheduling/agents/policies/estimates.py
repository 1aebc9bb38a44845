"""What the default policies expect of an agent type's calls, from the view alone.

Instances of one type are taken to be alike: an instance's own mean service time says
which calls it happened to run more than how fast it is (one that just served short
calls looks ten times faster), so a call is priced at the type's mean wherever it
waits. Service times are heavy-tailed: a call that has run past the mean is expected
to run about as long again.
"""

from __future__ import annotations

from scheduling.agents.policy import ControlView, FutureStatus, FutureView, InstanceView

DEFAULT_SERVICE_S = 1.0  # an agent type nobody has timed yet


def mean_service(instances: list[InstanceView]) -> float:
    """The type's mean service time, over the instances that have completed calls."""
    timed = [i.mean_service_s for i in instances if i.completed]
    return sum(timed) / len(timed) if timed else DEFAULT_SERVICE_S


def remaining_s(f: FutureView, service: float, now: float) -> float:
    """A running call's expected time left."""
    ran = now - (f.started_at if f.started_at is not None else now)
    return max(service - ran, ran)


def running_s(view: ControlView, instance_id: str, service: float, now: float) -> float:
    """The expected time left of the calls running on the instance, summed."""
    return sum(remaining_s(f, service, now) for f in view.futures_at(instance_id)
               if f.status is FutureStatus.RUNNING)


def backlog_s(view: ControlView, inst: InstanceView, service: float, now: float) -> float:
    """Expected work the instance holds, per slot: its running calls' time left plus
    the type's mean for each call queued or waiting for a dependency (it runs there)."""
    held = running_s(view, inst.instance_id, service, now) + (inst.queued + inst.waiting) * service
    return held / max(1, inst.slots)
