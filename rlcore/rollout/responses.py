"""The Responses API (`POST /v1/responses`, the OpenAI Agents SDK's default model) over the endpoint's chat route:
a request becomes the chat call it stands for, and the chat answer becomes a response object (or its events).

    input "47+38="                                   -> messages [user "47+38="]
    instructions "Use tools."                        -> a system message first
    items  {"type": "function_call", "call_id", "name", "arguments"}  -> the assistant's tool_calls
           {"type": "function_call_output", "call_id", "output"}      -> a tool message
    previous_response_id                             -> that response's conversation (this trajectory's), then input
    tools  {"type": "function", "name", "parameters"} -> chat tools; tool_choice {"type": "function", "name"} too
    answer -> output [{"type": "message", "content": [{"type": "output_text"}]}, {"type": "function_call"}, ...]

So everything the chat route guarantees holds here: token ids recorded as sampled, a conversation that extends the
last call continuing its sequence, forced calls, the same refusals (in the same error shape). Responses are kept
per trajectory for previous_response_id, whatever `store` says, and dropped with the trajectory.
"""
from __future__ import annotations

import json
import time

from rlcore.rollout.fields import IGNORED, MODEL, APIError
from rlcore.rollout.sse import Events

# Fields of /v1/responses: handed to the chat route under its own name, or checked here.
AS_CHAT = {"model": "model", "temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_tokens",
           "stream": "stream", "parallel_tool_calls": "parallel_tool_calls"}
OWN = {"input", "instructions", "tools", "tool_choice", "previous_response_id", "include", "truncation", "text",
       "reasoning"}
FIELDS = set(AS_CHAT) | OWN | set(IGNORED) - {"seed"}


def to_chat(req: dict, stored: dict[str, list[dict]]) -> dict:
    """A /v1/responses body -> the chat completions body it stands for (raises APIError for what is not served);
    `stored`: this trajectory's responses by id, each the conversation it ended."""
    for key in req:
        if key not in FIELDS:
            raise APIError(400, f"unsupported parameter '{key}'", param=key, code="unsupported_parameter")
    if req.get("include"):
        raise APIError(400, f"include={json.dumps(req['include'])} is refused: the endpoint returns no extra output "
                            f"data", param="include")
    if req.get("truncation") not in (None, "disabled"):
        raise APIError(400, "truncation must be \"disabled\": the endpoint never drops context", param="truncation")
    if (req.get("text") or {}).get("format", {"type": "text"}) != {"type": "text"}:
        raise APIError(400, "text.format other than text needs constrained decoding, which changes the sampled "
                            "distribution", param="text")
    reasoning = req.get("reasoning") or {}
    if set(reasoning) - {"effort"}:
        raise APIError(400, "reasoning may hold effort only (passed to the chat template)", param="reasoning")
    messages = []
    previous = req.get("previous_response_id")
    if previous is not None:
        if previous not in stored:
            raise APIError(400, f"previous_response_id {json.dumps(previous)} is not a response of this trajectory",
                           param="previous_response_id", code="previous_response_not_found")
        messages = [m for m in stored[previous] if m.get("role") != "system"]
    if req.get("instructions"):
        messages.insert(0, {"role": "system", "content": req["instructions"]})
    messages += items_to_messages(req.get("input"))
    chat = {AS_CHAT[k]: v for k, v in req.items() if k in AS_CHAT} | {"messages": messages}
    chat |= {k: v for k, v in req.items() if k in IGNORED}
    if reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    if req.get("tools"):
        chat["tools"] = [function_tool(t) for t in req["tools"]]
    choice = req.get("tool_choice")
    if isinstance(choice, dict):
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None:
        chat["tool_choice"] = choice
    return chat


def function_tool(tool) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        raise APIError(400, f"only function tools are served (got {json.dumps(tool)[:80]})", param="tools")
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


def items_to_messages(given) -> list[dict]:
    """`input` (a string or items) -> chat messages; an assistant message followed by function calls is one
    assistant turn, as the chat route answered it."""
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise APIError(400, "input must be a string or a non-empty list of items", param="input")
    out: list[dict] = []
    for item in given:
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and item.get("role") in ("user", "system", "developer", "assistant"):
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": text(item.get("content"))})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
            if out and out[-1]["role"] == "assistant" and "tool_call_id" not in out[-1]:
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": output if isinstance(output, str) else text(output)})
        else:
            raise APIError(400, f"input item of type {json.dumps(kind)} is not served (message, function_call and "
                                f"function_call_output are)", param="input")
    return out


def text(content) -> str:
    """Message content: a string, or parts (input_text / output_text / text) whose text is joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in ("input_text", "output_text", "text")
                                         for p in content):
        return "".join(p.get("text", "") for p in content)
    raise APIError(400, "content must be text (a string, or input_text / output_text parts)", param="input")


def to_response(answer: dict, req: dict, rid: str) -> dict:
    """A chat.completion -> the response object of the Responses API."""
    (choice,) = answer["choices"]
    message, output = choice["message"], []
    if message.get("content"):
        output.append({"type": "message", "id": f"msg_{rid}", "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": message["content"], "annotations": []}]})
    for j, call in enumerate(message.get("tool_calls") or []):
        output.append({"type": "function_call", "id": f"fc_{rid}_{j}", "call_id": call["id"], "status": "completed",
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"]})
    cut = choice["finish_reason"] == "length"
    usage = answer["usage"]
    return {"id": rid, "object": "response", "created_at": int(time.time()), "model": MODEL,
            "status": "incomplete" if cut else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
            "output": output, "instructions": req.get("instructions"), "metadata": req.get("metadata") or {},
            "previous_response_id": req.get("previous_response_id"), "tools": req.get("tools") or [],
            "tool_choice": req.get("tool_choice", "auto"), "parallel_tool_calls": req.get("parallel_tool_calls", True),
            "temperature": req.get("temperature"), "top_p": req.get("top_p"), "max_output_tokens":
            req.get("max_output_tokens"), "text": {"format": {"type": "text"}}, "truncation": "disabled",
            "reasoning": None, "store": req.get("store", True), "user": req.get("user"),
            "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                      "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


def events(response: dict) -> Events:
    """A finished response -> the events a streamed one sends (all at once, when the call is done: rlcore.rollout.sse),
    ending with response.completed (or response.incomplete)."""
    out = Events(done=False)

    def emit(kind: str, **fields) -> None:
        out.append((kind, {"type": kind, "sequence_number": len(out)} | fields))
    emit("response.created", response=response | {"status": "in_progress", "output": [], "usage": None})
    emit("response.in_progress", response=response | {"status": "in_progress", "output": [], "usage": None})
    for i, item in enumerate(response["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            emit("response.output_item.added", output_index=i, item=item | {"status": "in_progress", "content": []})
            emit("response.content_part.added", item_id=item["id"], output_index=i, content_index=0,
                 part=part | {"text": ""})
            emit("response.output_text.delta", item_id=item["id"], output_index=i, content_index=0, delta=part["text"],
                 logprobs=[])
            emit("response.output_text.done", item_id=item["id"], output_index=i, content_index=0, text=part["text"],
                 logprobs=[])
            emit("response.content_part.done", item_id=item["id"], output_index=i, content_index=0, part=part)
        else:
            emit("response.output_item.added", output_index=i, item=item | {"status": "in_progress", "arguments": ""})
            emit("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                 delta=item["arguments"])
            emit("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                 arguments=item["arguments"])
        emit("response.output_item.done", output_index=i, item=item)
    emit("response.incomplete" if response["status"] == "incomplete" else "response.completed", response=response)
    return out
