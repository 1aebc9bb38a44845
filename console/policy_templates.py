"""Starting source for a new policy in `agentctl policy edit NAME --layer LAYER`.

Each template is a valid policy of its layer that behaves like a built-in, with the
layer's hooks written out to edit. A layer without a template here (a newer daemon's)
starts from a comment that says what the source must define.
"""

from __future__ import annotations

import re

_KV = '''\
from scheduling.kv.baselines import StickyPolicy


class {cls}(StickyPolicy):
    """Program-level KV placement (scheduling/kv/policy.py: KvPolicy)."""

    name = {name_repr}

    def decide(self, view, now):
        # every check interval: list of Admit / Pause / Restore decisions
        return super().decide(view, now)

    def route(self, view, program_id, now):
        # a program has a ready request: the worker id to send it to, or None to wait
        return super().route(view, program_id, now)
'''
_ORDERING = '''\
from scheduling.slo.ordering import KeyedPolicy


class {cls}(KeyedPolicy):
    """Order of the ready queue (scheduling/slo/ordering.py: OrderingPolicy)."""

    name = {name_repr}

    def key(self, request):
        # smallest key first; request is a scheduling.slo.prediction.QueuedRequest
        return (request.arrival_s,)
'''
_META = '''\
from scheduling.layers import RulesMeta


class {cls}(RulesMeta):
    """Picks the ordering policy (scheduling/layers.py: MetaPolicy)."""

    name = {name_repr}

    def choose(self, view, now):
        # view is a scheduling.slo.views.LongView; return a scheduling.slo.meta.Decision
        return super().choose(view, now)
'''
_ADMISSION = '''\
from scheduling.layers import StateraAdmission


class {cls}(StateraAdmission):
    """Execution controls and admission (scheduling/layers.py: AdmissionPolicy)."""

    name = {name_repr}

    def controls(self, worker, utilisation, n_max, bypass):
        # once per cycle per worker: scheduling.slo.admission.ExecutionControls
        return super().controls(worker, utilisation, n_max, bypass)

    def admit(self, request, worker, fence, controls):
        # whether request may start on worker now: scheduling.slo.admission.AdmissionDecision
        return super().admit(request, worker, fence, controls)
'''
_UNKNOWN = '''\
# A new policy for the {layer!r} layer. Define exactly one subclass of the layer's
# interface (see ARCHITECTURE.md) with:
#     name = {name_repr}
# Imports are limited to scheduling.*, math, dataclasses, typing, collections, heapq,
# itertools, functools, enum and abc.
'''
TEMPLATES = {"kv": _KV, "ordering": _ORDERING, "meta": _META, "admission": _ADMISSION}


def class_name(policy: str) -> str:
    """`my-rule_2` -> `MyRule2`; a name that starts with a digit gets a `Policy` prefix."""
    words = [w for w in re.split(r"[^0-9A-Za-z]+", policy) if w]
    joined = "".join(w[:1].upper() + w[1:] for w in words) or "Policy"
    return joined if joined[0].isalpha() else f"Policy{joined}"


def template(layer: str, name: str) -> str:
    text = TEMPLATES.get(layer, _UNKNOWN)
    return text.format(cls=class_name(name), name_repr=repr(name), layer=layer)
