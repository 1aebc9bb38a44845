"""Financial analyst: fan out to stock, bond and news agents in parallel, then summarise;
follow-up questions in the same session are answered from the stored report.

The report (the agents' findings and the model's one-line overview) is kept in the
session's managed state, so a later run with `question` and the same session answers
from it without fanning out again. Run it on a daemon with the simulated engine
(`make run ENGINE=sim` does the same):

    agentd start --engine sim
    agentctl submit examples/analyst --args '{"ticker": "ACME"}' --session s1 --follow
    agentctl submit examples/analyst --args '{"ticker": "ACME", "question": "Buy?"}' \\
        --session s1 --follow

or on the real SmolLM2 worker (vLLM CPU): `make model` installs vLLM and converts the
model into ~/.cache/agentd/models/SmolLM2-135M-Instruct (`make run` does both steps):

    agentd start --engine vllm --model ~/.cache/agentd/models/SmolLM2-135M-Instruct
    agentctl submit examples/analyst --args '{"ticker": "ACME"}' --session s1 --follow

(same follow-up command). agentctl reads the daemon's address and token from
--url/--token, $AGENTD_URL/$AGENTD_TOKEN, or http://127.0.0.1:8420 and
~/.config/agentd/token.
"""

from __future__ import annotations

from typing import Any

import agentd


@agentd.tool
def market_data(ticker: str) -> dict[str, float]:
    """A stand-in for a market-data API: deterministic numbers per ticker."""
    seed = sum(ord(c) for c in ticker)
    return {"price": 50 + seed % 100, "pe": 10 + seed % 25, "yield_pct": 1 + seed % 7}


def one_line(text: str) -> str:
    return " ".join(text.split())


@agentd.agent(max_instances=2)
class StockAgent:
    def analyse(self, ticker: str, data: dict[str, float]) -> str:
        note = agentd.llm(f"Stock view on {ticker} at price {data['price']}", max_tokens=8)
        return f"stock: {ticker} price {data['price']} P/E {data['pe']} ({one_line(note)})"


@agentd.agent(max_instances=2)
class BondAgent:
    def analyse(self, ticker: str, data: dict[str, float]) -> str:
        note = agentd.llm(f"Bond view on {ticker} yielding {data['yield_pct']}%", max_tokens=8)
        return f"bonds: yield {data['yield_pct']}% ({one_line(note)})"


@agentd.agent(max_instances=2)
class NewsAgent:
    def analyse(self, ticker: str) -> str:
        note = agentd.llm(f"Recent news about {ticker}", max_tokens=8)
        return f"news: {one_line(note)}"


@agentd.agent(stateful=True)
class Summariser:
    def summarise(self, ticker: str, parts: list[str]) -> str:
        overview = agentd.llm("Summarise for an investor in one sentence: " + " | ".join(parts),
                              max_tokens=12)
        return f"{ticker}: " + "; ".join(parts) + f". Overview: {one_line(overview)}"

    def follow_up(self, ticker: str, report: str, question: str) -> str:
        return one_line(agentd.llm(
            [{"role": "system", "content": f"You are a financial analyst. Your report on "
                                           f"{ticker}: {report}"},
             {"role": "user", "content": question}], max_tokens=12))


def analyse(ticker: str, timeout_s: float) -> tuple[list[Any], Any]:
    """The fan-out: the parts' futures and the summary's."""
    data = market_data(ticker)  # a Future; the agents below depend on it
    parts = [StockAgent().analyse(ticker, data), BondAgent().analyse(ticker, data),
             NewsAgent().analyse(ticker)]
    _, pending = agentd.wait(parts, timeout=timeout_s)
    if pending:
        raise TimeoutError(f"{len(pending)} analyses did not finish in {timeout_s}s")
    return parts, Summariser().summarise(ticker, parts)  # depends on all three


def main(ticker: str, question: str = "", timeout_s: float = 120.0) -> dict[str, object]:
    reports = agentd.ManagedDict("analyst_reports")
    result: dict[str, object] = {"ticker": ticker}
    futures: list[Any] = []
    if question and ticker in reports:  # a follow-up: the session already has the report
        summary = str(reports[ticker])
    else:
        parts, future = analyse(ticker, timeout_s)
        summary = str(future)
        reports[ticker] = summary
        result["parts"] = [str(p) for p in parts]
        futures += [*parts, future]
    result["summary"] = summary
    if question:
        answer = Summariser().follow_up(ticker, summary, question)
        result.update(question=question, answer=str(answer))
        futures.append(answer)
    result["futures"] = [agentd.as_future(f).id for f in futures]
    return result
