"""The residency estimate (LRU turnover from reported token counts) and what an unknown
residency means to the policies."""

from __future__ import annotations

from daemon.engines.sim.blocks import BlockPool
from scheduling.kv import KvConfig, KvView, ProgramView, WorkerView, plan_migration
from scheduling.kv.agentd import AgentdPolicy
from scheduling.kv.fairness import reserve_target
from scheduling.kv.residency import ResidencyEstimator, held_tokens
from tests.kv_programs import NOW, P, R, prog

CAP = 1000


def ended(est: ResidencyEstimator, pid: str | None, used: int, prompt: int = 100,
          cached: int = 0, output: int = 0, worker: str = "w0") -> None:
    est.request_ended(pid, worker, prompt, cached, output, used, CAP)


def test_resident_while_tokens_taken_since_stay_below_the_room_ahead() -> None:
    est = ResidencyEstimator()
    # p's 100 tokens freed with 400 used: 500 free tokens lie ahead of them.
    ended(est, "p", used=400)
    assert est.resident("p", "w0", 400) is True
    assert est.resident("p", "w0", 900) is True  # 500 new tokens: the free ones ahead
    assert est.resident("p", "w0", 901) is False  # the next one is p's last block


def test_blocks_freed_after_the_program_count_as_taken_once_reused() -> None:
    est = ResidencyEstimator()
    ended(est, "p", used=400)
    # q's request grew used to 700, then ended: its 300 tokens went behind p, and used
    # fell back, so 300 tokens were taken from the head meanwhile.
    ended(est, "q", used=400, prompt=300)
    assert est.taken_since("p", 400) == 300
    assert est.resident("p", "w0", 600) is True
    assert est.resident("p", "w0", 601) is False


def test_a_hit_on_blocks_behind_the_program_does_not_move_it_up() -> None:
    est = ResidencyEstimator()
    ended(est, "p", used=400)
    ended(est, "q", used=400, prompt=200)  # q's 200 tokens now sit behind p
    # q's next request hits all 200 (used +200) and writes 250 new ones (used +250).
    est.request_hit("q", "w0", 200)
    est.request_hit("q", "w0", 200)  # reported again: counted once
    assert est.taken_since("p", 850) == 450 - 200 + 200  # 200 freed, 250 new, 200 hit behind
    assert est.resident("p", "w0", 850) is True
    # A hit on blocks freed before p (ahead of it) takes them out ahead: p moves up.
    est2 = ResidencyEstimator()
    ended(est2, "a", used=400, prompt=200)
    ended(est2, "p", used=400)
    est2.request_hit("a", "w0", 200)
    assert est2.taken_since("p", 600) == 200


def test_a_program_whose_last_request_ran_elsewhere_is_cold_on_its_worker() -> None:
    est = ResidencyEstimator()
    ended(est, "p", used=0, worker="w1")
    assert est.resident("p", "w1", 0) is True
    assert est.resident("p", "w0", 0) is False
    # Writes on w0 do not touch p's place on w1.
    ended(est, "x", used=0, prompt=900, worker="w0")
    assert est.resident("p", "w1", 0) is True


def test_unknown_until_a_request_ended_and_after_the_program_ended() -> None:
    est = ResidencyEstimator()
    assert est.resident("p", "w0", 0) is None
    ended(est, "p", used=0)
    assert est.resident("p", "w0", None) is None  # usage unknown
    assert est.resident("p", None, 0) is None
    est.forget("p")
    assert est.resident("p", "w0", 0) is None
    ended(est, "p", used=0)
    ended(est, "q", used=0)
    est.forget_except({"q"})
    assert est.resident("p", "w0", 0) is None and est.resident("q", "w0", 0) is True


def test_a_restarted_worker_leaves_its_programs_cold() -> None:
    est = ResidencyEstimator()
    ended(est, "p", used=0)
    est.worker_reset("w0")
    assert est.resident("p", "w0", 0) is False


def test_held_tokens_counts_whole_blocks() -> None:
    assert held_tokens(17, 0, 16) == 32 and held_tokens(16, 0, 16) == 16
    assert held_tokens(0, 0, 16) == 0


def test_the_estimate_follows_a_real_lru_block_pool() -> None:
    # The sim's pool is vLLM's free queue: free a context, allocate others, and the
    # estimate flips exactly when the context's last block is evicted.
    pool, est, bs = BlockPool(64, 16), ResidencyEstimator(), 16
    held = pool.allocate(10)
    for i, b in enumerate(held):
        pool.cache(b, 1000 + i)
    other = pool.allocate(20)
    pool.free(reversed(held))
    used = pool.num_used * bs
    est.request_ended("p", "w0", 160, 0, 0, used, 64 * bs, bs)
    seen = []
    for _ in range(40):
        pool.allocate(1)
        truth = (1000 + 9) in pool.cached
        assert est.resident("p", "w0", pool.num_used * bs) is truth
        seen.append(truth)
    assert seen.index(False) == 34  # the 34 free blocks ahead went first
    pool.free(other)


def view(*programs: ProgramView) -> KvView:
    return KvView((WorkerView("w0", 1000), WorkerView("w1", 1000)), programs, KvConfig())


def test_an_unknown_residency_prices_a_migration_home_as_a_full_recompute() -> None:
    known = view(prog("p", P, 300, kv_resident=True))
    assert plan_migration(known, "p", "w0").recompute_tokens == 0
    unknown = view(prog("p", P, 300))
    assert unknown.program("p").kv_resident is None
    assert plan_migration(unknown, "p", "w0").recompute_tokens == 300


def test_an_unknown_residency_reserves_no_home_worker() -> None:
    # w0 has less room now than w1: only a known-cached program reserves its home w0.
    policy = AgentdPolicy()
    base = (prog("r", R, 400, worker="w0"), prog("s", R, 100, worker="w1"))
    for resident, target in ((True, "w0"), (None, "w1"), (False, "w1")):
        v = view(*base, prog("p", P, 300, pending_request=True, ready_since=NOW,
                             kv_resident=resident))
        plan = policy._plan(v, NOW)
        assert reserve_target(plan, v.program("p")) == target
