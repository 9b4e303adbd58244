"""Agents written with the frameworks people use, unchanged, through the endpoint: the OpenAI Agents SDK (its
chat-completions model and its default Responses model), LangChain (ainvoke and astream) and smolagents
(ToolCallingAgent, which forces tool calls and stops on "Observation:"). Each is the tool task's agent in ~10
lines, on the scripted engine of tests/test_endpoint.py (several rollouts on one event loop, as the run keeps
it); tests/test_agents.py trains them on the real engine. The adapters are docs/agents.md's "Your framework"."""
import asyncio

import pytest

from test_endpoint import ROWS, TOOLS, run, tok, tool_agent  # noqa: F401  (tok: the fixture)

MAX_LEN = 4096  # the frameworks' own system prompts and tool schemas, in the tool task's tokenizer


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def agents_sdk(responses: bool):
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool, \
        set_tracing_disabled

    set_tracing_disabled(True)
    tool = function_tool(add)

    async def agent(client, row):
        model = (OpenAIResponsesModel if responses else OpenAIChatCompletionsModel)(model="policy",
                                                                                    openai_client=client)
        result = await Runner.run(Agent(name="adder", tools=[tool], model=model), row["prompt"], max_turns=3)
        return float(str(result.final_output).strip() == row["answer"])
    return agent


def langchain(stream: bool):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    async def agent(client, row):
        llm = ChatOpenAI(model="policy", base_url=str(client.base_url), api_key=client.api_key,
                         max_retries=0).bind_tools(TOOLS)
        messages = [HumanMessage(row["prompt"])]
        for _ in range(2):
            if stream:
                reply = None
                async for chunk in llm.astream(messages):
                    reply = chunk if reply is None else reply + chunk
            else:
                reply = await llm.ainvoke(messages)
            if not reply.tool_calls:
                return float(reply.content == row["answer"])
            call = reply.tool_calls[0]
            messages += [reply, ToolMessage(str(add(**call["args"])), tool_call_id=call["id"])]
        return 0.0
    return agent


def smolagents_agent():
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    async def agent(client, row):
        model = OpenAIServerModel(model_id="policy", api_base=str(client.base_url), api_key=client.api_key)
        runner = ToolCallingAgent(tools=[tool(add)], model=model, max_steps=2, verbosity_level=-1)
        answer = await asyncio.to_thread(runner.run, row["prompt"])  # smolagents is synchronous
        return float(str(answer).strip() == row["answer"])
    return agent


@pytest.mark.parametrize("framework", ["agents_chat", "agents_responses", "langchain_ainvoke", "langchain_astream"])
def test_a_framework_agent_runs_unchanged_for_several_rollouts(tok, framework):
    """Three rollouts, one event loop (the run's): no agent fails, the tool is called, the answer read. The
    framework's own HTTP clients and caches made on the first rollout serve the next."""
    agent = {"agents_chat": lambda: agents_sdk(False), "agents_responses": lambda: agents_sdk(True),
             "langchain_ainvoke": lambda: langchain(False), "langchain_astream": lambda: langchain(True)}[framework]()
    for _ in range(3):
        trajs, stats, engine, endpoint = run(tok, agent, ROWS, max_len=MAX_LEN, max_calls=6)
        assert stats.failed == 0, stats.first_error
        assert [x.env_reward for x in trajs] == [1.0, 1.0]
        assert stats.calls == 4 and all(sum(x.sampled) > 0 for x in trajs)


def test_smolagents_forces_its_calls_and_stops_on_its_strings(tok):
    """smolagents' ToolCallingAgent sends tool_choice="required" and stop ["Observation:", "Calling tools:"] on
    every step: served (the forced call's opener is prompt), no agent fails; it replays its history as text, so each
    call opens a new sequence."""
    for _ in range(2):
        trajs, stats, engine, endpoint = run(tok, smolagents_agent(), ROWS, max_len=MAX_LEN, max_calls=6)
        assert stats.failed == 0, stats.first_error
        adds = [c for c in engine.calls if c[0] == "add"]
        assert adds and all(c[5] == ["Observation:", "Calling tools:"] for c in adds[:2])
        opener = tok.encode("<tool_call>\n", add_special_tokens=False)  # tool_choice="required", as prompt tokens
        assert all(c[2][-len(opener):] == opener for c in adds[:2])
        assert all(sum(x.sampled) > 0 for x in trajs)
