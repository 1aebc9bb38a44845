"""Tagger, SLO templates, length predictor and the request record."""

from __future__ import annotations

import pytest

from scheduling.slo.prediction import (
    CostModel,
    LengthPredictor,
    Perceiver,
    QueuedRequest,
    RequestSpec,
    TaskTagger,
    prompt_bucket,
)
from scheduling.slo.templates import TABLE_6, Slo, SloTable, TaskType, importance_factor, scale_slo

TAGGED = [
    (
        "```python\ndef f(x):\n    return x\n```\nThis function crashes, fix it.",
        TaskType.CODE_GENERATION,
    ),
    ("Write a Python script that renames every file in a folder.", TaskType.CODE_GENERATION),
    ("Translate the following paragraph into French: The weather is nice.", TaskType.TRANSLATION),
    ("Summarize this article in three sentences: ...", TaskType.SUMMARIZATION),
    ("Extract all the dates and names from the contract below.", TaskType.EXTRACTION),
    ("Solve the equation 3x + 5 = 20 for x.", TaskType.MATH_REASONING),
    ("Please paraphrase this sentence so it sounds more formal.", TaskType.PARAPHRASING),
    ("Write a cover letter for a junior data analyst position.", TaskType.LETTER_DRAFTING),
    ("Write an essay on the causes of the French Revolution.", TaskType.ESSAY_GENERATION),
    ("Write a short story about a lighthouse keeper and a storm.", TaskType.LONG_FORM_GENERATION),
    ("Hello! How are you doing today?", TaskType.DIALOGUE),
    ("What is the capital of Australia?", TaskType.QA),
    (
        "Write a literature review of retrieval-augmented generation with citations.",
        TaskType.RESEARCH,
    ),
]


@pytest.mark.parametrize(("prompt", "task"), TAGGED)
def test_tagger_recognises_sample_prompts(prompt: str, task: TaskType) -> None:
    assert TaskTagger().tag(prompt) == task


@pytest.mark.parametrize("prompt", ["", "banana", "Lorem ipsum dolor sit amet."])
def test_tagger_answers_unknown_without_evidence(prompt: str) -> None:
    assert TaskTagger().tag(prompt) == TaskType.UNKNOWN


def test_tagger_answers_unknown_on_a_tie() -> None:
    # Translation and summarisation cues of equal weight: no margin, no guess.
    assert TaskTagger().tag("Translate and summarize.") == TaskType.UNKNOWN


def test_table_6_values_in_seconds() -> None:
    assert TABLE_6[TaskType.QA] == Slo(4.0, 0.07)
    assert TABLE_6[TaskType.RESEARCH] == Slo(13.0, 0.15)
    assert TABLE_6[TaskType.TRANSLATION] == Slo(4.5, 0.08)
    assert set(TABLE_6) == set(TaskType)


def test_importance_factor_spans_plus_minus_twenty_percent() -> None:
    assert importance_factor(0.5) == pytest.approx(1.2)
    assert importance_factor(1.0) == pytest.approx(0.8)
    assert importance_factor(0.75) == pytest.approx(1.0)
    assert importance_factor(0.1) == pytest.approx(1.2)
    assert importance_factor(3.0) == pytest.approx(0.8)


def test_scaled_slo_floors_to_whole_milliseconds() -> None:
    assert scale_slo(TABLE_6[TaskType.QA], 1.0) == Slo(3.2, 0.056)
    # f(0.6) = 1.2 - 0.4 * 0.1 / 0.5 = 1.12: 4500 ms -> 5040 ms, 80 ms -> 89.6 -> 89 ms.
    assert scale_slo(Slo(4.5, 0.08), 0.6) == Slo(5.04, 0.089)


def test_slo_overrides_request_then_tenant_then_table() -> None:
    table = SloTable(tenant_overrides={"gold": {TaskType.QA: Slo(1.0, 0.02)}})
    assert table.resolve(TaskType.QA, 0.75, "gold") == Slo(1.0, 0.02)
    assert table.resolve(TaskType.QA, 0.75, "free") == Slo(4.0, 0.07)
    assert table.resolve(TaskType.QA, 1.0, "gold", override=Slo(9.0, 0.5)) == Slo(9.0, 0.5)


def test_length_predictor_defaults_then_learns_per_cell() -> None:
    p = LengthPredictor(min_samples=3, default_tokens=777)
    assert p.predict(TaskType.QA, 100) == 777
    for n in (10, 20, 30):
        p.observe(TaskType.QA, 100, n)
    assert p.ready(TaskType.QA, 100)
    assert p.predict(TaskType.QA, 100) == 20
    # Another bucket of the same task borrows the task's pooled history.
    assert not p.ready(TaskType.QA, 5000)
    assert p.predict(TaskType.QA, 5000) == 20
    assert p.predict(TaskType.SUMMARIZATION, 100) == 777


def test_length_predictor_tracks_a_shift_through_its_window() -> None:
    p = LengthPredictor(window=5, min_samples=1)
    for _ in range(5):
        p.observe(TaskType.QA, 10, 100)
    for _ in range(5):
        p.observe(TaskType.QA, 10, 400)
    assert p.predict(TaskType.QA, 10) == 400


def test_prompt_buckets_are_monotone() -> None:
    buckets = [prompt_bucket(n) for n in (0, 127, 128, 511, 512, 10_000, 10**6)]
    assert buckets == sorted(buckets)
    assert buckets[0] == buckets[1] != buckets[2]


def _request(**kw: object) -> QueuedRequest:
    base: dict[str, object] = dict(
        request_id="r",
        tenant="t",
        arrival_s=10.0,
        prompt_tokens=100,
        task=TaskType.QA,
        importance=0.75,
        slo=Slo(2.0, 0.05),
        l_pred=100,
        l_upper=150,
        ttft_pred_s=0.5,
        tpot_pred_s=0.02,
    )
    base.update(kw)
    return QueuedRequest(**base)  # type: ignore[arg-type]


def test_request_derived_quantities() -> None:
    r = _request()
    assert r.t_tot == pytest.approx(0.5 + 0.02 * 100)
    assert r.deadline == pytest.approx(10.0 + 2.0 + 0.05 * 100)
    assert r.slack(v_sys=11.0) == pytest.approx(17.0 - 11.0 - 2.5)
    assert r.remaining_s == pytest.approx(r.t_tot)
    resumed = _request(generated_tokens=60)
    assert resumed.remaining_s == pytest.approx(0.02 * 40)


def test_cost_model_moves_toward_observations() -> None:
    c = CostModel(prefill_base_s=0.0, prefill_per_token_s=0.001, tpot_s=0.05, smoothing=0.5)
    c.observe(prompt_tokens=100, prefill_s=0.3, tpot_s=0.03)
    assert c.prefill_per_token_s == pytest.approx(0.002)
    assert c.tpot_s == pytest.approx(0.04)


class _FixedBound:
    def upper(self, prompt_tokens: int, l_pred: int) -> int:
        return l_pred + 50


def test_perceiver_builds_a_tagged_request() -> None:
    perceiver = Perceiver(
        TaskTagger(), LengthPredictor(default_tokens=200), CostModel(), SloTable(), _FixedBound()
    )
    spec = RequestSpec("r1", "acme", 5.0, "What is the boiling point of water?", 12, importance=1.0)
    r = perceiver.perceive(spec)
    assert (r.task, r.l_pred, r.l_upper) == (TaskType.QA, 200, 250)
    assert r.slo == Slo(3.2, 0.056)
    given = perceiver.perceive(
        RequestSpec("r2", "acme", 5.0, "hi", 2, task=TaskType.MATH_REASONING)
    )
    assert given.task == TaskType.MATH_REASONING
