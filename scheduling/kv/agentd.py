"""agentd's own KV policy: ThunderAgent plus a few additions, each behind a flag."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import partial
from typing import Any

from scheduling.kv.balance import lasting_gap, rebalance
from scheduling.kv.decisions import Decision, placements
from scheduling.kv.fairness import serve_overdue
from scheduling.kv.ledger import Ledger, decay
from scheduling.kv.plan import Plan, pause_order, restore_order
from scheduling.kv.release import make_room
from scheduling.kv.thunder import ThunderAgentPolicy
from scheduling.kv.view import RESIDENT, WAITING, KvView, ProgramStatus, ProgramView


@dataclass(frozen=True)
class AgentdOptions:
    """Each flag turns one addition on or off for an ablation (`python -m bench.kv --tune`
    runs them, as the daemon's [kv_options]). Why each default was chosen, with the runs
    and numbers behind it, is in bench/README.md ("Tuning notes"): options are tuned on
    the tuning seeds and the traces' dev halves only, never on what is reported.

    fair_resume: the wait bound of `scheduling/kv/fairness.py` instead of
        ThunderAgent's force-resume: the oldest waiting program is swapped in once
        it waited `force_resume_s` per waiting program per worker, and no placement
        counts the room of a marked program whose request still runs as free. The
        fixed bound makes every overdue program overcommit a worker: under heavy load
        the engine then does little but recompute.
    overdue_first: every program past `force_resume_s` is placed before all others,
        oldest first, and reserves a worker until it fits (strict FIFO among late
        programs). Off by default: it replaces shortest-first by FIFO under load
        and leaves reserved room idle.
    hold_s: after a request ends, a program keeps its room for `hold_s`. Tool times
        are heavy-tailed, so a tool that has not ended after a few seconds is likely to
        run long; recomputing a long context costs about as much GPU time as holding it
        idle for tens of seconds, and a released program's blocks stay in vLLM's LRU for
        a while and are reused if it returns by then.
    release_on_demand: past its hold a program keeps its full room until a waiting
        program needs it; then it is paused, longest acting first. ThunderAgent
        instead lends a decaying share of an acting program's room to newcomers
        while it stays admitted, so its return overcommits the worker and pauses
        another program.
    predicted_hold: hold a program for its own predicted tool time (mean of its past
        tools, capped at `hold_s`) instead of `hold_s`. Off by default: the
        synthetic agents' tool times are independent draws, so a program's mean
        says little about its next tool.
    fleet_prior: with `predicted_hold`, a program with no tool history yet is
        predicted the fleet-wide mean of the programs' mean tool times
        (`config.default_tool_time_s` before any tool was seen); else `hold_s`.
    longest_acting_first: among acting programs, pause the one acting longest
        first (its tool is the likeliest to run on, and vLLM's LRU frees the
        oldest blocks first, so it has the least cache left to lose), not the
        shortest; among reasoning ones, mark the one whose request has run longest
        (its room is likely to free soonest). ThunderAgent pauses shortest first
        to minimise recompute.
    cached_first: among paused programs with a ready request, restore those whose
        blocks are still cached (`kv_resident` is True) first; waiting costs them
        their cache, while the others have nothing left to lose.
    spread_admission: a new program goes to the fitting worker with the most room
        left (spreading load, so no worker idles at low load); restores keep best fit.
    migration_cost: a restore goes to the fitting worker where the fewest tokens
        must be recomputed (its blocks still cached there, or its prefix group
        resident), then its last worker (vLLM evicts a freed request's tail first,
        so its prefix may survive there), best fit breaking ties. ThunderAgent
        assumes all KV is gone.
    balance_route: the ready request of an acting program goes to the least-used
        worker instead of its own when its own worker's KV use exceeds that worker's
        by more than this fraction, and by more than the request's context, so the
        move narrows the gap (0 = never). With no program paused there is no restore
        to rebalance the workers, and with a few programs per worker their requests'
        KV comes and goes in large steps. The gap is the one before the request, so a
        long context, whose move recomputes the most, is not moved on a narrower gap
        than a short one.
    lasting_balance: `balance_route` moves a request only when the admitted demand
        (the ledger: every resident program's context, acting ones included) of its
        worker also exceeds the target's by more than `balance_route`. A move
        recomputes the program's whole context on the target, and with a few programs
        per worker most usage gaps are requests that happen to run at once and end
        soon. Off by default: gating leaves the momentary gaps, trading KV balance for
        prefix hits.
    share_prefix: programs of one prefix group on one worker hold the shared prefix
        once (vLLM's prefix cache dedups it), so demand and placement cost count it once.
        Off by default: counting the prefix per program is the only slack the ledger
        leaves for running requests' decode growth, and without it the engine
        preempts and the LRU drops acting programs' blocks.
    smooth_admission: at most `admits_per_tick` new programs per worker per step,
        and only into room left after reserving `growth_reserve` of capacity, so a
        burst of arrivals does not fill a worker that running contexts will outgrow.
        Off by default: it keeps newcomers (short contexts, many per GB of KV) out
        behind long-context programs at high load.
    cold_with_new: a paused program whose blocks are no longer cached (the view's
        `kv_resident` is False; None, unknown, is not demoted) has nothing left to
        lose by waiting, just like a program that never started: it queues with the
        new programs, shortest context first, behind paused programs whose blocks are
        still cached (their wait costs them their cache). ThunderAgent restores every
        paused program with a ready request before any new one, so under load a long
        recompute goes before a shorter first prompt, and the room it takes evicts the
        cache of a program that would have hit. Waiting stays bounded by `fair_resume`.
    home_cached: a paused program whose blocks are still cached on its last worker
        (`kv_resident` is True) is restored there, releasing room there if needed,
        rather than on another worker where it would recompute everything; only
        when nothing can be released there may release on demand seat it elsewhere. `migration_cost`
        alone sends it to any worker with room when its own is full.
    new_wait: a program that never started never takes the room of a started one
        (release on demand only serves paused programs): it has no cache to lose.
        Off by default: the room it leaves goes to cold restores, which recompute anyway.
    thrash_slack: a worker is thrashing only when its demand exceeds the high
        watermark by this fraction of capacity; up to it, the engine's LRU evicts
        the tails of the programs acting longest instead of a whole program being
        paused and its room given away. Off by default.
    headroom: placements (admission, restore, release on demand, a rebalanced
        request) fill a worker only up to the low watermark less this fraction of
        capacity, while thrashing is still judged at the high watermark. Admitted
        contexts grow every step (output plus the next tool result); when placements
        fill a worker to the thrash line, each step's growth pauses a whole program
        (usually cold by the time it is restored) to make room for a small overshoot,
        and its room is refilled at once, so under load every growth step rotates one
        program. The gap absorbs several steps of growth per pause instead.
    """

    fair_resume: bool = True
    overdue_first: bool = False
    hold_s: float = 15.0
    release_on_demand: bool = True
    predicted_hold: bool = False
    fleet_prior: bool = False
    longest_acting_first: bool = True
    cached_first: bool = True
    spread_admission: bool = True
    migration_cost: bool = True
    balance_route: float = 0.12
    lasting_balance: bool = False
    share_prefix: bool = False
    smooth_admission: bool = False
    admits_per_tick: int = 4
    growth_reserve: float = 0.05
    cold_with_new: bool = True
    home_cached: bool = True
    new_wait: bool = False
    thrash_slack: float = 0.0
    headroom: float = 0.015


class AgentdPolicy(ThunderAgentPolicy):
    """ThunderAgent with a queue-scaled wait bound, a hold window then release on
    demand, cache-aware pause and restore order (cold paused programs queue with new
    ones, cached ones go home), spread admission, migration-cost aware restore and
    request rebalancing; see `AgentdOptions` for each one."""

    name = "agentd"

    def __init__(self, options: AgentdOptions | None = None) -> None:
        self.options = options or AgentdOptions()
        self.share_prefix = self.options.share_prefix
        # The last queue placement routing computed, with the view and time it is for:
        # one dispatch step routes every parked request against the same view.
        self._placed: tuple[float, KvView, dict[str, str]] | None = None
        # The fleet's mean tool time of the last view asked: a plan asks it twice (its
        # ledger's weights and the queue), and each time walked every live program.
        self._prior: tuple[KvView, float] | None = None

    def decide(self, view: KvView, now: float) -> list[Decision]:
        plan = self._plan(view, now)
        self._relieve(plan)
        if self.options.fair_resume:
            serve_overdue(plan, now, self.choose_worker, True, self.options.overdue_first)
        else:
            self._force_resume(plan, now)
        self._place_queue(plan, now, release=self.options.release_on_demand)
        return plan.decisions

    def route(self, view: KvView, program_id: str, now: float) -> str | None:
        program = view.program(program_id)
        if program.status is ProgramStatus.ACTING and program.pending_request:
            if self.options.balance_route > 0:
                return self._rebalance(view, program, now)
            return view.home_worker(program)
        if program.status in RESIDENT or not program.waiting:
            return view.home_worker(program) if program.status in RESIDENT else None
        return self._queue_placements(view, now).get(program_id)

    def _queue_placements(self, view: KvView, now: float) -> dict[str, str]:
        """Where the waiting programs go now. Placing only, as ThunderAgent's route: nothing
        may rely on pauses not yet applied. The queue is placed in order, so a program's
        place does not depend on those after it: one placement answers every program."""
        placed = self._placed
        if placed is not None and placed[0] == now and placed[1] == view:
            return placed[2]
        plan = self._plan(view, now)
        if self.options.fair_resume:
            serve_overdue(plan, now, self.choose_worker, False, self.options.overdue_first)
        self._place_queue(plan, now, release=False, routing=True)
        result = placements(plan.decisions)
        self._placed = (now, view, result)
        return result

    def weight(self, program: ProgramView, view: KvView, now: float) -> float:
        return self._weight(program, view, now, self._fleet_prior(view))

    def pause_key(self, program: ProgramView, view: KvView, now: float) -> Any:
        return self._pause_key(program, now, self._fleet_prior(view))

    def held(self, program: ProgramView, view: KvView, now: float) -> bool:
        """Is an ACTING `program` still inside its hold window?"""
        return self._held(program, now, self._fleet_prior(view))

    def restore_key(self, program: ProgramView) -> Any:
        """`restore_order`, with still-cached programs first within a rank; with
        `cold_with_new` a cold paused program ranks with the new ones."""
        rank, tokens, pid = restore_order(program)
        if self.options.cold_with_new and rank == 0 and program.kv_resident is False:
            rank = 1
        return (rank, self.options.cached_first and program.kv_resident is not True, tokens, pid)

    def fits(self, plan: Plan, worker_id: str, program: ProgramView) -> bool:
        low = self.place_watermark(plan.view)
        if worker_id in plan.reserved:
            return False
        room = (plan.ledger.room_now(worker_id, low) if self.options.fair_resume
                else plan.ledger.room(worker_id, low))
        if room < plan.ledger.cost(worker_id, program):
            return False
        if not self.options.smooth_admission or program.status is not ProgramStatus.QUEUED:
            return True
        if plan.admitted[worker_id] >= self.options.admits_per_tick:
            return False
        reserve = plan.ledger.limit(worker_id, self.options.growth_reserve)
        return room - reserve >= plan.ledger.cost(worker_id, program)

    def choose_worker(self, plan: Plan, program: ProgramView) -> str | None:
        fitting = [
            w for w in plan.ledger.worker_ids()
            if plan.ledger.is_healthy(w) and self.fits(plan, w, program)
        ]
        if program.status is ProgramStatus.QUEUED and self.options.spread_admission:
            return roomiest_fit(plan, fitting, program)
        home = plan.view.home_worker(program)
        if (self.options.home_cached and program.kv_resident is True and home is not None
                and not plan.view.crosses_node(program, home)):  # cached on its node only
            return home if home in fitting else None
        if not self.options.migration_cost:
            return super().choose_worker(plan, program)
        return min(fitting, key=lambda w: _restore_score(plan, w, program), default=None)

    def _place_queue(self, plan: Plan, now: float, release: bool,
                     routing: bool = False) -> None:
        """The global queue in `restore_key` order; a waiting program that fits
        nowhere may, with `release`, take the room of programs past their hold.

        `routing`: placing only to answer `route`, which is asked about programs with a
        request waiting (`waiting`) alone. The paused programs without one that come after
        the last of those in the order (all of them, in the built-in order: a program idle
        in a tool, or a chat program held for its next turn, ranks last) cannot move any
        answer, so they are not placed: with thousands of them, placing each on every
        worker was most of a route's cost."""
        prior = self._fleet_prior(plan.view)
        queue = sorted((p for p in plan.view.programs if p.status in WAITING),
                       key=self.restore_key)
        if routing:
            end = len(queue)
            while end and not queue[end - 1].waiting:
                end -= 1
            del queue[end:]
        for program in queue:
            if program.program_id not in plan.handled:
                worker_id = self.choose_worker(plan, program)
                if worker_id is None and release and self._may_release_for(program):
                    worker_id = make_room(plan, program, lambda p: self._held(p, now, prior),
                                          partial(_score_on, plan, program),
                                          self.place_watermark(plan.view))
                if worker_id is not None:
                    queued = program.status is ProgramStatus.QUEUED
                    plan.place(program, worker_id, "admit" if queued else "restore")

    def thrash_watermark(self, view: KvView) -> float:
        return view.config.high_watermark + self.options.thrash_slack

    def place_watermark(self, view: KvView) -> float:
        """Placements fill a worker up to capacity times this."""
        return view.config.low_watermark - self.options.headroom

    def _may_release_for(self, program: ProgramView) -> bool:
        if self.options.new_wait and program.status is ProgramStatus.QUEUED:
            return False
        return program.waiting

    def _rebalance(self, view: KvView, program: ProgramView, now: float) -> str | None:
        threshold = self.options.balance_route
        target = rebalance(view, program, threshold,
                           lambda w: self._fits_now(view, w, program, now))
        home = view.home_worker(program)
        if not self.options.lasting_balance or target is None or target == home:
            return target
        assert home is not None  # rebalance moves only from a healthy home
        gap = lasting_gap(self._plan(view, now).ledger, home, target)
        return target if gap > threshold else home

    def _fits_now(self, view: KvView, worker_id: str, program: ProgramView, now: float) -> bool:
        plan = self._plan(view, now)
        if program.worker_id == worker_id:
            return True
        low = self.place_watermark(view)
        return plan.ledger.room_now(worker_id, low) >= plan.ledger.cost(worker_id, program)

    def _plan(self, view: KvView, now: float) -> Plan:
        prior = self._fleet_prior(view)
        ledger = Ledger(view, lambda p: self._weight(p, view, now, prior), self.share_prefix)
        return Plan(view, ledger, lambda p: self._pause_key(p, now, prior))

    def _fleet_prior(self, view: KvView) -> float:
        """`fleet_tool_mean(view)`, once per view (a view never changes)."""
        cached = self._prior
        if cached is None or cached[0] is not view:
            cached = self._prior = (view, fleet_tool_mean(view))
        return cached[1]

    def _weight(self, program: ProgramView, view: KvView, now: float, prior: float) -> float:
        if program.status is not ProgramStatus.ACTING or program.acting_since is None:
            return 1.0
        if self.options.release_on_demand:
            return 1.0
        elapsed = now - program.acting_since - self._hold(program, prior)
        return decay(elapsed, view.config.decay_lambda)

    def _pause_key(self, program: ProgramView, now: float, prior: float) -> Any:
        """ACTING before REASONING; with `longest_acting_first`, within each the one
        whose last request ended longest ago first, those inside the hold window
        after all others. For a REASONING program that is the request running
        longest (counting its tool), likely the nearest its end, so a marked
        program's room frees soonest; a first request counts as just started."""
        reasoning, tokens, pid = pause_order(program)
        if not self.options.longest_acting_first:
            return (reasoning, self._held(program, now, prior), 0.0, tokens, pid)
        since = now if program.acting_since is None else program.acting_since
        recent = now - since < self._hold(program, prior)
        return (reasoning, recent, since, tokens, pid)

    def _held(self, program: ProgramView, now: float, prior: float) -> bool:
        if program.status is not ProgramStatus.ACTING or program.acting_since is None:
            return False
        return now - program.acting_since < self._hold(program, prior)

    def _hold(self, program: ProgramView, prior: float) -> float:
        """Seconds after its request ends (or its tool starts) that a program keeps
        its room: `hold_s`, or with `predicted_hold` its predicted tool time."""
        if not self.options.predicted_hold:
            return self.options.hold_s
        mean = program.tool_time_mean_s
        if mean is None:
            mean = prior if self.options.fleet_prior else self.options.hold_s
        return min(mean, self.options.hold_s)


def fleet_tool_mean(view: KvView) -> float:
    """Mean of the live programs' mean tool times; the configured default before
    any tool was observed. The prediction for a program without history."""
    means = [p.tool_time_mean_s for p in view.programs if p.tool_time_mean_s is not None]
    return statistics.fmean(means) if means else view.config.default_tool_time_s


def roomiest_fit(plan: Plan, fitting: list[str], program: ProgramView) -> str | None:
    """The fitting worker with the most room left after placing `program`."""
    low = plan.view.config.low_watermark

    def leftover(worker_id: str) -> tuple[float, str]:
        return (plan.ledger.room(worker_id, low) - plan.ledger.cost(worker_id, program), worker_id)

    return max(fitting, key=leftover, default=None)


def recompute_tokens(plan: Plan, worker_id: str, program: ProgramView) -> int:
    """Tokens `program` must prefill again if it next runs on `worker_id`."""
    if program.status is ProgramStatus.QUEUED:
        return 0
    if plan.view.crosses_node(program, worker_id):
        return program.context_tokens
    prefix = program.context_tokens - plan.ledger.cached_prefix(worker_id, program)
    home = program.recompute_at_home() if program.worker_id == worker_id else None
    return prefix if home is None else min(home, prefix)


def _score_on(plan: Plan, program: ProgramView, worker_id: str) -> tuple[int, bool, float, str]:
    """Where to make room: least recompute, then its last worker, then most room now."""
    recompute, away, _, _ = _restore_score(plan, worker_id, program)
    room = plan.ledger.room_now(worker_id, plan.view.config.low_watermark)
    return (recompute, away, -room, worker_id)


def _restore_score(plan: Plan, worker_id: str, program: ProgramView
                   ) -> tuple[int, bool, float, str]:
    low = plan.view.config.low_watermark
    leftover = plan.ledger.room(worker_id, low) - plan.ledger.cost(worker_id, program)
    away = worker_id != program.worker_id
    return (recompute_tokens(plan, worker_id, program), away, leftover, worker_id)
