"""Financial analyst: fan out to stock, bond and news agents in parallel, then summarise.

    agentctl submit examples/analyst --entry main:main --args '{"ticker": "ACME"}' --follow
"""

from __future__ import annotations

import agentd


@agentd.tool
def market_data(ticker: str) -> dict[str, float]:
    """A stand-in for a market-data API: deterministic numbers per ticker."""
    seed = sum(ord(c) for c in ticker)
    return {"price": 50 + seed % 100, "pe": 10 + seed % 25, "yield_pct": 1 + seed % 7}


@agentd.agent(max_instances=2)
class StockAgent:
    def analyse(self, ticker: str, data: dict[str, float]) -> str:
        note = agentd.llm(f"Stock view on {ticker} at price {data['price']}", max_tokens=8)
        return f"stock: {ticker} price {data['price']} P/E {data['pe']} ({note})"


@agentd.agent(max_instances=2)
class BondAgent:
    def analyse(self, ticker: str, data: dict[str, float]) -> str:
        note = agentd.llm(f"Bond view on {ticker} yielding {data['yield_pct']}%", max_tokens=8)
        return f"bonds: yield {data['yield_pct']}% ({note})"


@agentd.agent(max_instances=2)
class NewsAgent:
    def analyse(self, ticker: str) -> str:
        note = agentd.llm(f"Recent news about {ticker}", max_tokens=8)
        return f"news: {note}"


@agentd.agent(stateful=True)
class Summariser:
    def summarise(self, ticker: str, parts: list[str]) -> str:
        agentd.llm("Summarise: " + " | ".join(parts), max_tokens=12)
        return f"{ticker}: " + "; ".join(parts)


def main(ticker: str, timeout_s: float = 60.0) -> dict[str, object]:
    data = market_data(ticker)  # a Future; the agents below depend on it
    parts = [StockAgent().analyse(ticker, data), BondAgent().analyse(ticker, data),
             NewsAgent().analyse(ticker)]
    _, pending = agentd.wait(parts, timeout=timeout_s)
    if pending:
        raise TimeoutError(f"{len(pending)} analyses did not finish in {timeout_s}s")
    summary = Summariser().summarise(ticker, parts)  # depends on all three
    reports = agentd.ManagedDict("analyst_reports")
    reports[ticker] = str(summary)
    return {"ticker": ticker, "summary": str(summary), "parts": [str(p) for p in parts],
            "futures": [agentd.as_future(f).id for f in [*parts, summary]]}
