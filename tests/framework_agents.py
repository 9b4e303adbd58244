"""recipes/tooladd_agent.py with its agent written with LangChain (ainvoke or astream), or with stream=True, for real
runs: `recipe=tests/framework_agents.py` with AGENT=langchain_ainvoke (the default), langchain_astream or
openai_streamed in the environment. The same tools and messages, so the same prompts the warm start saw; LangChain
sends them with its own client over the rank's loopback HTTP server."""
import importlib.util
import json
import os
from pathlib import Path

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI

_spec = importlib.util.spec_from_file_location("tooladd_agent", Path(__file__).parents[1] / "recipes" / "tooladd_agent.py")
recipe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recipe)


async def _agent(client, row, stream: bool) -> float:
    llm = ChatOpenAI(model="policy", base_url=str(client.base_url), api_key=client.api_key,
                     max_retries=0).bind_tools(recipe.TOOLS)
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
    cfg = recipe.config()
    cfg.rollout.agent = globals()[os.environ.get("AGENT", "langchain_ainvoke")]
    return cfg
