"""The interface every KV policy implements, built-in or operator-written."""

from __future__ import annotations

from abc import ABC, abstractmethod

from scheduling.kv.decisions import Decision, Pause, Restore
from scheduling.kv.view import KvView


class KvPolicy(ABC):
    """Program-level KV placement: who is admitted where, who is paused.

    Policies keep no state between calls; everything they need is in the view, so
    one can be swapped for another between two steps without losing anything.
    """

    @property
    @abstractmethod
    def name(self) -> str:
        """The policy's name; a subclass sets it as a class attribute. A property here so
        that a wrapper (the daemon's guard) may answer with the name of what it wraps."""

    @abstractmethod
    def decide(self, view: KvView, now: float) -> list[Decision]:
        """Called every `config.check_interval_s`, and after a release or a new
        arrival when the daemon wants the freed room used at once."""

    @abstractmethod
    def route(self, view: KvView, program_id: str, now: float) -> str | None:
        """Called when a program has a ready request. Returns the worker to send
        it to; for a QUEUED or PAUSED program that also admits/restores it there.
        None means: wait in the global queue for a later `decide`."""

    def on_request_end(self, view: KvView, program_id: str, now: float) -> list[Decision]:
        """Called once a request finished and the view shows it (status ACTING).
        Carries out a pause that `MarkPauseAfterRequest` deferred."""
        program = view.program(program_id)
        if not program.pause_marked or program.worker_id is None:
            return []
        pause: list[Decision] = [Pause(program_id, program.worker_id, "marked")]
        if program.migrate_to is None:
            return pause
        return [*pause, Restore(program_id, program.migrate_to, "migrate")]
