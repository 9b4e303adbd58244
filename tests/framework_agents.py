"""recipes/tooladd_agent.py with its agent written with a framework, for real runs: `recipe=tests/framework_agents.py`
with AGENT in the environment. LangChain (langchain_ainvoke, the default, and langchain_astream on the handed
client; langchain_http with a client of its own over the rank's loopback HTTP server) and the openai client
streaming (openai_streamed) send the recipe's own tools and messages, so the prompts the warm start saw. The OpenAI
Agents SDK (agents_responses, agents_chat) and smolagents (smolagents_tools) send their own system prompts and tool
schemas: they get a long-context copy of the warm start."""
import importlib.util
import json
import os
from pathlib import Path

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI

_spec = importlib.util.spec_from_file_location("tooladd_agent", Path(__file__).parents[1] / "recipes" / "tooladd_agent.py")
recipe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recipe)


def chat_model(client, over_http: bool = False) -> ChatOpenAI:
    """LangChain's chat model on the handed client (its calls answered in process, as the bare client's are), or
    with a client of its own over the rank's loopback HTTP server."""
    if over_http:
        return ChatOpenAI(model="policy", base_url=str(client.base_url), api_key=client.api_key, max_retries=0)
    return ChatOpenAI(model="policy", api_key=client.api_key, root_async_client=client,
                      async_client=client.chat.completions)


async def _agent(client, row, stream: bool, over_http: bool = False) -> float:
    llm = chat_model(client, over_http).bind_tools(recipe.TOOLS)
    messages = [HumanMessage(row["prompt"])]
    for turn in range(2):
        if stream:
            reply = None
            async for chunk in llm.astream(messages):
                reply = chunk if reply is None else reply + chunk
        else:
            reply = await llm.ainvoke(messages)
        if not reply.tool_calls or turn == 1:
            return float((reply.content or "").strip() == row["answer"])
        call = reply.tool_calls[0]
        try:
            result = str(await recipe.add(**call["args"]))
        except (TypeError, ValueError):  # a malformed call: no answer
            return 0.0
        messages += [reply, ToolMessage(result, tool_call_id=call["id"])]
    return 0.0


async def langchain_ainvoke(client, row) -> float:
    return await _agent(client, row, stream=False)


async def langchain_astream(client, row) -> float:
    return await _agent(client, row, stream=True)


async def langchain_http(client, row) -> float:
    """LangChain with its own client, over HTTP (ainvoke)."""
    return await _agent(client, row, stream=False, over_http=True)


async def openai_streamed(client, row) -> float:
    """The recipe's own agent with stream=True: the answer and the tool call rebuilt from the chunks."""
    messages = [{"role": "user", "content": row["prompt"]}]
    for turn in range(2):
        stream = await client.chat.completions.create(model="policy", messages=messages, tools=recipe.TOOLS,
                                                      stream=True)
        content, calls = "", {}
        async for chunk in stream:
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for t in choice.delta.tool_calls or []:
                    calls.setdefault(t.index, {"id": t.id, "type": "function",
                                               "function": {"name": t.function.name, "arguments": ""}})
                    calls[t.index]["function"]["arguments"] += t.function.arguments or ""
        if not calls or turn == 1:
            return float(content.strip() == row["answer"])
        call = calls[0]
        try:
            result = str(await recipe.add(**json.loads(call["function"]["arguments"])))
        except (TypeError, ValueError):
            return 0.0
        messages += [{"role": "assistant", "content": content or None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": result}]
    return 0.0


def config():
    """recipes/tooladd_agent.py with AGENT's agent; a framework's own prompts get the long-context copy of the warm
    start, a short batch (smolagents, whose prompts are ~4,000 tokens: half of it) and one call more per
    trajectory."""
    cfg = recipe.config()
    name = os.environ.get("AGENT", "langchain_ainvoke")
    cfg.rollout.agent = globals()[name]
    if name in FRAMEWORKS:
        cfg.model.path = str(long_context_model())
        cfg.rollout.max_model_len = LONG if name == "smolagents_tools" else 1024
        cfg.rollout.max_turns = 4
        cfg.rollout.prompts_per_step = 2 if name == "smolagents_tools" else 4
        cfg.rollout.group_size, cfg.rollout.max_new_tokens = 4, 24
        cfg.data.eval_path = ""
    return cfg


# ---- the frameworks' own prompts: the Agents SDK (~400 tokens a call here) and smolagents (~4,000) -------------

LONG = 8192  # the model's context for them: the warm start's weights with max_position_embeddings raised (RoPE)


def long_context_model() -> Path:
    """The tool task's warm start with a context of LONG tokens, built once beside it (every rank may try: the
    folder appears whole, by a rename)."""
    import shutil
    import tempfile

    from rlcore.tasks import tooladd
    tooladd.prepare()
    target = tooladd.model_dir().parent / f"model-context{LONG}"
    if not target.exists():
        tmp = Path(tempfile.mkdtemp(dir=target.parent))
        shutil.copytree(tooladd.model_dir(), tmp / "m")
        config = json.loads((tmp / "m" / "config.json").read_text())
        (tmp / "m" / "config.json").write_text(json.dumps(config | {"max_position_embeddings": LONG}))
        try:
            (tmp / "m").rename(target)
        except OSError:  # another rank's copy is there already
            pass
        shutil.rmtree(tmp, ignore_errors=True)
    return target


async def agents_responses(client, row) -> float:
    """The OpenAI Agents SDK with its default model (the Responses API)."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    set_tracing_disabled(True)
    model = OpenAIResponsesModel(model="policy", openai_client=client)
    result = await Runner.run(Agent(name="adder", tools=[function_tool(add)], model=model), row["prompt"], max_turns=3)
    return float(str(result.final_output).strip() == row["answer"])


async def agents_chat(client, row) -> float:
    """The OpenAI Agents SDK over chat completions (OpenAIChatCompletionsModel)."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
    result = await Runner.run(Agent(name="adder", tools=[function_tool(add)], model=model), row["prompt"], max_turns=3)
    return float(str(result.final_output).strip() == row["answer"])


async def smolagents_tools(client, row) -> float:
    """smolagents' ToolCallingAgent (tool_choice="required", stop strings), synchronous: in a thread."""
    import asyncio

    from smolagents import OpenAIServerModel, ToolCallingAgent, tool
    model = OpenAIServerModel(model_id="policy", api_base=str(client.base_url), api_key=client.api_key)
    runner = ToolCallingAgent(tools=[tool(add)], model=model, max_steps=2, verbosity_level=-1)
    return float(str(await asyncio.to_thread(runner.run, row["prompt"])).strip() == row["answer"])


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


FRAMEWORKS = {"agents_responses", "agents_chat", "smolagents_tools"}
