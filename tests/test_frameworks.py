"""Agents written with the frameworks people use, unchanged, through the endpoint: the OpenAI Agents SDK (its
chat-completions model and its default Responses model), LangChain (ainvoke and astream) and smolagents
(ToolCallingAgent, which forces tool calls and stops on "Observation:"). Each is the tool task's agent in ~10
lines (tests/framework_agents.py), on the scripted engine of tests/test_endpoint.py (several rollouts on one event
loop, as the run keeps it); tests/test_agents.py trains them on the real engine. The adapters are docs/agents.md's
"Your framework"."""
import framework_agents
import pytest

from rlcore.rollout.endpoint import Endpoint
from rlcore.rollout.wire import InProcess

from test_endpoint import ROWS, run, tok  # noqa: F401  (tok: the fixture)

MAX_LEN = 4096  # the frameworks' own system prompts and tool schemas, in the tool task's tokenizer


@pytest.mark.parametrize("framework", ["agents_chat", "agents_responses", "langchain_ainvoke", "langchain_astream",
                                       "langchain_http"])
def test_a_framework_agent_runs_unchanged_for_several_rollouts(tok, framework, monkeypatch):
    """Three rollouts, one event loop (the run's): no agent fails, the tool is called, the answer read. The
    framework's own HTTP clients and caches made on the first rollout serve the next. LangChain on the handed
    client never leaves the process: neither the HTTP server nor the openai client's own path (the InProcess
    transport) sees a call; with its own client every call goes over HTTP."""
    ways = []
    for cls, name in ((Endpoint, "handle"), (InProcess, "handle_async_request")):
        monkeypatch.setattr(cls, name, lambda *a, _f=getattr(cls, name), _n=name: ways.append(_n) or _f(*a))
    agent = getattr(framework_agents, framework)
    for _ in range(3):
        trajs, stats, engine, endpoint = run(tok, agent, ROWS, max_len=MAX_LEN, max_calls=6)
        assert stats.failed == 0, stats.first_error
        assert [x.env_reward for x in trajs] == [1.0, 1.0]
        assert stats.calls == 4 and all(sum(x.sampled) > 0 for x in trajs)
    if framework.startswith("langchain"):
        assert ways == (["handle"] * 12 if framework == "langchain_http" else [])


def test_smolagents_forces_its_calls_and_stops_on_its_strings(tok):
    """smolagents' ToolCallingAgent sends tool_choice="required" and stop ["Observation:", "Calling tools:"] on
    every step: served (the forced call's opener is prompt), no agent fails; it replays its history as text, so each
    call opens a new sequence."""
    for _ in range(2):
        trajs, stats, engine, endpoint = run(tok, framework_agents.smolagents_tools, ROWS, max_len=MAX_LEN, max_calls=6)
        assert stats.failed == 0, stats.first_error
        adds = [c for c in engine.calls if c[0] == "add"]
        assert adds and all(c[5] == ["Observation:", "Calling tools:"] for c in adds[:2])
        opener = tok.encode("<tool_call>\n", add_special_tokens=False)  # tool_choice="required", as prompt tokens
        assert all(c[2][-len(opener):] == opener for c in adds[:2])
        assert all(sum(x.sampled) > 0 for x in trajs)
