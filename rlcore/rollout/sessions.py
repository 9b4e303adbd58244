"""What the agent endpoint records per trajectory (rlcore.rollout.endpoint): each call's exact token ids, joined
into training sequences, and the messages it compares to tell an extended conversation from a rewritten one.

    calls      prompt [p p p] -> [a a];  prompt [p p p a a o o] -> [b];  prompt [p q] -> [c]
    sequences  p p p | a a o o b (sampled 1 1 0 0 1)   and   p q | c (a rewritten history: a new sequence)
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import secrets
import threading
from dataclasses import dataclass, field


@dataclass
class Call:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str


@dataclass
class Sequence:
    """One training sequence: prompt ids, then everything after them with the model's tokens flagged."""
    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


def sequences(calls: list[Call]) -> list[Sequence]:
    """Recorded calls -> training sequences. A call whose prompt extends the previous sequence (its prompt and
    every token since) continues it; the other calls each open a new one:

        call 1  prompt [p p p]         completion [a a]
        call 2  prompt [p p p a a o o] completion [b]   -> one sequence p p p | a a o o b, sampled 1 1 0 0 1
        call 3  prompt [p q]           completion [c]   -> a second sequence p q | c (history rewritten)
    """
    out: list[Sequence] = []
    for c in calls:
        lps = c.logprobs or [0.0] * len(c.completion_ids)  # greedy calls carry no logprobs
        s = out[-1] if out else None
        full = s.prompt_ids + s.tokens if s else None
        if s is None or c.prompt_ids[:len(full)] != full:
            out.append(Sequence(list(c.prompt_ids)))
            s, extra = out[-1], []
        else:
            extra = c.prompt_ids[len(full):]
        s.tokens += extra + c.completion_ids
        s.sampled += [0] * len(extra) + [1] * len(c.completion_ids)
        s.logprobs += [0.0] * len(extra) + list(lps)
    return out


@dataclass
class Request:
    """One engine call an agent asked for, as every rank of the engine's group must submit it."""
    index: int  # the trajectory
    call: int  # its k-th call
    prompt_ids: list[int]
    max_tokens: int
    stop: list[str]  # stop strings: the engine stops where one appears (the tokens that formed it are kept)


class Session:
    """One trajectory's conversation with the endpoint."""

    def __init__(self, index: int):
        self.index = index
        self.token = secrets.token_urlsafe(24)
        self.calls: list[Call] = []
        self.started = 0  # calls accepted (some may still be in the engine)
        self.pending: dict[int, cf.Future] = {}
        self.last: tuple | None = None  # (normalised messages, normalised reply, tools, prompt + completion ids)
        self.failed: str | None = None  # the first refusal, or why the trajectory ended early
        self.responses: dict[str, list[dict]] = {}  # /v1/responses answers by id: the chat messages each ended
        self.closed = False
        self.lock = threading.Lock()


def _text(content) -> str:
    """Message content: a string, or a list of parts whose text parts are joined."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _arguments(args):
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            return args
    return args


def template_message(m: dict) -> dict:
    """An OpenAI message as chat templates take it: text content, tool-call arguments as a JSON object."""
    out = {k: v for k, v in m.items() if v is not None}
    if "content" in m or m.get("role") != "assistant":
        out["content"] = _text(m.get("content"))
    if m.get("tool_calls"):
        out["tool_calls"] = [{"type": "function", "function": {"name": c["function"]["name"],
                                                               "arguments": _arguments(c["function"]["arguments"])}}
                             for c in m["tool_calls"]]
    return out


def normalise(m: dict) -> tuple:
    """What makes two messages the same turn (ids and None fields aside): an SDK re-sends the reply it got."""
    calls = tuple((c["function"]["name"], json.dumps(_arguments(c["function"]["arguments"]), sort_keys=True))
                  for c in m.get("tool_calls") or ())
    return m.get("role"), _text(m.get("content")), calls, m.get("name") if m.get("role") == "tool" else None
