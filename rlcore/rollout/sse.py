"""Streamed answers (`stream: true`): an answer of the agent endpoint as the server-sent events OpenAI sends.

    chat_chunks(answer, include_usage=True)
        -> data: {"object": "chat.completion.chunk", "choices": [{"delta": {"role": "assistant", "content": ""}}]}
           data: {... "delta": {"content": "It is 85."}}            (the text, when there is any)
           data: {... "delta": {"tool_calls": [{"index": 0, "id", "type", "function": {"name", "arguments"}}]}}
           data: {... "delta": {}, "finish_reason": "tool_calls"}
           data: {... "choices": [], "usage": {...}}                 (include_usage only)
           data: [DONE]

The events come when the call is done, not token by token: the engine hands rlcore a request's tokens when it
finishes (the same sample, ids and logprobs as without streaming, recorded the same way), and an agent in
training reads the whole answer before it acts. So a streamed call costs what a plain one does, plus building
the events (17 us for a tool call's answer, measured) and reading them: the client rlcore hands an agent takes them
as chunk objects in process (rlcore.rollout.wire.Chunks, ~0.05 ms a call), a client of the agent's own parses them
from the HTTP answer. What streaming gives up is the time to the first token, which no training step waits on.
Each tool call is one delta with its index, id, name and whole arguments, as OpenAI sends a short call.
"""
from __future__ import annotations

import json


class Events(list):
    """(event name or None, payload) pairs in order; `done`: end with `data: [DONE]` (chat and completions; the
    Responses API ends with its response.completed event instead)."""

    def __init__(self, items=(), done: bool = True):
        super().__init__(items)
        self.done = done

    def encode(self) -> bytes:
        lines = [(f"event: {name}\n" if name else "") + f"data: {json.dumps(payload)}\n\n" for name, payload in self]
        return ("".join(lines) + ("data: [DONE]\n\n" if self.done else "")).encode()


def chat_chunks(answer: dict, include_usage: bool) -> Events:
    """A chat.completion -> its chat.completion.chunk events."""
    (choice,) = answer["choices"]
    message = choice["message"]
    head = {"id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"],
            "model": answer["model"]} | ({"usage": None} if include_usage else {})

    def chunk(delta: dict, finish=None) -> tuple[None, dict]:
        return None, head | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
    out = Events([chunk({"role": "assistant", "content": ""})])
    if message.get("content"):
        out.append(chunk({"content": message["content"]}))
    for j, call in enumerate(message.get("tool_calls") or []):
        out.append(chunk({"tool_calls": [{"index": j} | call]}))
    out.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        out.append((None, head | {"choices": [], "usage": answer["usage"]}))
    return out


def completion_chunks(answer: dict, include_usage: bool) -> Events:
    """A text_completion -> its streamed text_completion events: the text, then the usage (include_usage)."""
    head = {"id": answer["id"], "object": "text_completion", "created": answer["created"], "model": answer["model"]}
    out = Events([(None, head | {"choices": answer["choices"]} | ({"usage": None} if include_usage else {}))])
    if include_usage:
        out.append((None, head | {"choices": [], "usage": answer["usage"]}))
    return out
