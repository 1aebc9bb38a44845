"""The operator policies the swap benchmark alternates between: two valid versions per
layer that behave differently, so every activation really changes what runs."""

from __future__ import annotations

KV = ('''\
from scheduling.kv.baselines import StickyPolicy


class BenchKv(StickyPolicy):
    """Version A: session affinity."""

    name = "bench-kv"
''', '''\
from scheduling.kv.baselines import VllmDefaultPolicy


class BenchKv(VllmDefaultPolicy):
    """Version B: least-loaded worker for every request."""

    name = "bench-kv"
''')

ORDERING = ('''\
from scheduling.slo.ordering import KeyedPolicy


class BenchOrdering(KeyedPolicy):
    """Version A: arrival order."""

    name = "bench-ordering"

    def key(self, request):
        return (request.arrival_s,)
''', '''\
from scheduling.slo.ordering import KeyedPolicy


class BenchOrdering(KeyedPolicy):
    """Version B: shortest predicted output first, then arrival."""

    name = "bench-ordering"

    def key(self, request):
        return (request.l_pred, request.arrival_s)
''')

META = ('''\
from scheduling.layers import RulesMeta


class BenchMeta(RulesMeta):
    """Version A: the rule map with its default thresholds."""

    name = "bench-meta"
''', '''\
from scheduling.layers import RulesMeta
from scheduling.slo.meta import RuleThresholds


class BenchMeta(RulesMeta):
    """Version B: the rule map, waiting for more completions before it reacts."""

    name = "bench-meta"

    def __init__(self):
        super().__init__(RuleThresholds(min_completions=50))
''')

ADMISSION = ('''\
from scheduling.layers import StateraAdmission


class BenchAdmission(StateraAdmission):
    """Version A: the Statera fence and loops as built in."""

    name = "bench-admission"
''', '''\
from scheduling.layers import StateraAdmission


class BenchAdmission(StateraAdmission):
    """Version B: the Statera fence with a lower concurrency floor."""

    name = "bench-admission"

    def __init__(self):
        super().__init__(n_min=2)
''')

# layer -> (policy name, (source A, source B))
SOURCES: dict[str, tuple[str, tuple[str, str]]] = {
    "kv": ("bench-kv", KV),
    "ordering": ("bench-ordering", ORDERING),
    "meta": ("bench-meta", META),
    "admission": ("bench-admission", ADMISSION),
}
