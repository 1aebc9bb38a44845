"""Tool-using agent loops of real frameworks, pointed at an agentd daemon.

Each runs one agent with one tool (the weather in a city) until the framework ends the
loop, and returns what a test needs to see: the calls the tool got (their arguments
parsed by the framework), what it answered, and the conversation. The same loops run on
the sim worker and on SmolLM2 under vLLM (tests/integration/test_frameworks*.py); the
README's "Use agentd from your framework" shows them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from tests.daemon_process import DaemonProcess


@dataclass
class Loop:
    cities: list[str] = field(default_factory=list)  # what the tool was called with
    answer: str = ""  # the framework's final output
    requests: list[Any] = field(default_factory=list)  # per model call: usage, or messages

    def weather(self, city: str) -> str:
        self.cities.append(city)
        return f"It is sunny in {city}."


def openai_agents_loop(d: DaemonProcess, model: str, *, first_choice: str | None = None,
                       max_tokens: int = 64, stream: bool = False) -> Loop:
    """The OpenAI Agents SDK over chat completions. `first_choice` forces the first turn
    ("required"); the SDK resets it after a tool call (reset_tool_choice), so the model
    then answers the tool's result with tool_choice "auto"."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # no export to OpenAI's servers
    loop = Loop()

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return loop.weather(city)

    client = AsyncOpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0, timeout=300)
    agent = Agent(
        name="forecaster", instructions="Answer questions about the weather with the tool.",
        tools=[get_weather], model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        model_settings=ModelSettings(tool_choice=first_choice, max_tokens=max_tokens,
                                     temperature=0))

    async def run() -> Any:
        if not stream:
            return await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
        result = Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=4)
        async for _ in result.stream_events():
            pass
        return result

    result = asyncio.run(run())
    loop.answer = str(result.final_output)
    loop.requests = [r.usage for r in result.raw_responses]
    return loop


def langgraph_loop(d: DaemonProcess, model: str, *, first_choice: str | None = None,
                   max_tokens: int = 64) -> Loop:
    """LangGraph's ReAct loop with LangChain's ChatOpenAI: the prebuilt agent, or, with
    `first_choice`, the same graph written out, its first model call forced."""
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    loop = Loop()

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return loop.weather(city)

    llm = ChatOpenAI(model=model, base_url=f"{d.url}/v1", api_key=d.token,  # type: ignore[arg-type]
                     max_completion_tokens=max_tokens, temperature=0, max_retries=0,
                     timeout=300)
    tools = [get_weather]

    def agent(state: MessagesState) -> dict[str, Any]:
        answered = any(isinstance(m, ToolMessage) for m in state["messages"])
        choice = first_choice if first_choice and not answered else None
        return {"messages": [llm.bind_tools(tools, tool_choice=choice).invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    question: Any = {"messages": [("user", "What is the weather in Paris?")]}
    state = graph.compile().invoke(question, {"recursion_limit": 8})
    loop.answer = str(state["messages"][-1].content)
    loop.requests = state["messages"]
    return loop
