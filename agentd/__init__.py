"""agentd SDK: write agent workflows as ordinary Python.

    import agentd

    @agentd.agent(stateful=True)
    class Classifier:
        def classify(self, question: str) -> str:
            return agentd.llm([{"role": "user", "content": question}], max_tokens=8)

    @agentd.tool
    def lookup(symbol: str) -> dict: ...

    def main(question: str) -> str:
        label = Classifier().classify(question)   # an agentd.Future, returned at once
        return f"{label}"                          # using it waits for the value

Type checkers see a decorated call's declared return type (the value the Future stands
for); `agentd.as_future(x)` gives the Future itself, for its metadata. Likewise they see
`Classifier()` as the plain class; `agentd.as_stub(x)` gives the stub, for its `instances`.

Calls run on a thread pool: in this process (local mode) or inside a daemon sandbox
(daemon mode, `agentctl submit`); see agentd/runtime.py for the differences.
"""

from agentd.context import Candidate, Context, ContextDropped, Generation, SnapshotNotFound
from agentd.future import (
    ALL,
    FIRST,
    DependencyError,
    Future,
    as_future,
    resolve,
    wait,
)
from agentd.managed import ManagedDict, ManagedList
from agentd.runtime import LLMError, LLMUnavailable, current, llm, local_runtime
from agentd.stubs import agent, as_stub, tool

__all__ = [
    "ALL", "FIRST", "Candidate", "Context", "ContextDropped", "DependencyError", "Future",
    "Generation", "LLMError", "LLMUnavailable", "ManagedDict", "ManagedList",
    "SnapshotNotFound", "agent", "as_future", "as_stub", "current", "llm", "local_runtime",
    "resolve", "tool", "wait",
]
