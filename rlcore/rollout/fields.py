"""What the agent endpoint (rlcore.rollout.endpoint) accepts in a request, field by field, and why: the contract
docs/agents.md lists, to be read against OpenAI's API reference.

A field is served when the tokens the engine samples for it are drawn from the distribution the trainer
recomputes: the run's temperature, no truncation of the vocabulary (top_p, top_k, min_p), no penalties, no
constrained decoding. Fields that only label, store or route a call change nothing the model sees and are
accepted and ignored. Everything else is refused with an OpenAI-style 400 naming the field and why.

    check(req, CHAT_FIELDS, temperature=1.0, max_new_tokens=64)
        -> Asked(max_tokens=64, stop=["Observation:"], stream=False, include_usage=False, tool_choice="auto")
"""
from __future__ import annotations

import json
from dataclasses import dataclass

MODEL = "policy"  # the model name the endpoint serves
MAX_STOPS = 16  # stop strings per call (OpenAI takes 4; ReAct-style agents send 2 or 3)
MAX_STOP_CHARS = 256  # characters of one stop string

# Accepted and ignored: they label, store or route a call, or ask for what the endpoint does anyway.
IGNORED = {
    "store": "calls are recorded for training whatever it says; nothing is stored for later retrieval",
    "metadata": "labels only", "user": "labels only", "safety_identifier": "labels only",
    "service_tier": "one engine, one tier", "prompt_cache_key": "the engine caches prefixes by their tokens",
    "seed": "each call's seed derives from the trajectory's (exact resume)",
    "parallel_tool_calls": "true: every call the model writes is returned; false: the first only",
}
# Accepted with these values only: others change the sampled distribution (or the answer's shape).
NEUTRAL = {"top_p": (1, 1.0), "top_k": (0, -1), "min_p": (0, 0.0), "frequency_penalty": (0, 0.0),
           "presence_penalty": (0, 0.0), "repetition_penalty": (1, 1.0), "logit_bias": ({},), "n": (1,),
           "echo": (False,), "logprobs": (False,), "top_logprobs": (0,), "response_format": ({"type": "text"},)}
REFUSED = {"n": "one sample per call: a trajectory is one conversation",
           "echo": "echo is not served", "logprobs": "logprobs are not returned (the endpoint records them)",
           "top_logprobs": "logprobs are not returned (the endpoint records them)",
           "response_format": "a JSON format needs constrained decoding, which changes the sampled distribution",
           "": "it changes the sampled distribution, so the recorded logprobs would differ from the trainer's"}
SAMPLING = {"model", "max_tokens", "max_completion_tokens", "stop", "stream", "stream_options", "temperature"}
CHAT_FIELDS = SAMPLING | set(IGNORED) | set(NEUTRAL) | {"messages", "tools", "tool_choice", "reasoning_effort"}
COMPLETION_FIELDS = CHAT_FIELDS - {"messages", "tools", "tool_choice", "parallel_tool_calls", "reasoning_effort",
                                   "response_format"} | {"prompt", "suffix"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    def body(self) -> dict:
        kind = {401: "authentication_error", 429: "rate_limit_error"}.get(self.status, "invalid_request_error")
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


@dataclass
class Asked:
    """What a checked request asks of the engine and of the answer."""
    max_tokens: int
    stop: list[str]
    stream: bool = False
    include_usage: bool = False
    tool_choice: str | dict = "auto"  # "auto", "none", "required" or {"type": "function", "function": {"name"}}


def check(req: dict, allowed: set[str], temperature: float, max_new_tokens: int) -> Asked:
    """Refuse what would change the sampled distribution; -> what the request asks."""
    for key in req:
        if key not in allowed:
            raise APIError(400, f"unsupported parameter '{key}'", param=key, code="unsupported_parameter")
    if req.get("model") != MODEL:
        raise APIError(400, f"unknown model {req.get('model')!r}; this endpoint serves '{MODEL}'",
                       param="model", code="model_not_found")
    t = req.get("temperature")
    if t is not None and t != temperature:
        raise APIError(400, f"temperature is pinned to the run's {temperature:g} (rollout.temperature): "
                            f"the trainer recomputes the sampled tokens' logprobs at that temperature",
                       param="temperature", code="pinned_parameter")
    for key, ok in NEUTRAL.items():
        value = req.get(key)
        # a bool is an int in Python, not in JSON: top_p=true is no 1
        if value is not None and (value not in ok or isinstance(value, bool) != isinstance(ok[0], bool)):
            raise APIError(400, f"{key}={json.dumps(value)} is refused: {REFUSED.get(key, REFUSED[''])}; accepted: "
                                f"{' or '.join(json.dumps(v) for v in ok)}", param=key, code="refused_parameter")
    if req.get("suffix"):
        raise APIError(400, "suffix is not served (no fill-in-the-middle)", param="suffix", code="refused_parameter")
    cap = req.get("max_completion_tokens", req.get("max_tokens")) or max_new_tokens
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
        raise APIError(400, f"max_tokens must be a whole number >= 1 (got {json.dumps(cap)})", param="max_tokens")
    stream = req.get("stream") or False
    if not isinstance(stream, bool):
        raise APIError(400, f"stream must be true or false (got {json.dumps(stream)})", param="stream")
    options = req.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage", "include_obfuscation"}:
        raise APIError(400, "stream_options may hold include_usage (and include_obfuscation, ignored)",
                       param="stream_options")
    if options and not stream:
        raise APIError(400, "stream_options is only allowed when stream is true", param="stream_options")
    return Asked(cap, stops(req.get("stop")), stream, bool(options.get("include_usage")),
                 req.get("tool_choice") or "auto")


def stops(stop) -> list[str]:
    """The `stop` field as a list of strings (the engine stops on each, vLLM's own `stop`)."""
    out = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(out, list) or not all(isinstance(s, str) and s for s in out):
        raise APIError(400, "stop must be a string or a list of non-empty strings", param="stop")
    if len(out) > MAX_STOPS:
        raise APIError(400, f"stop holds {len(out)} strings; this endpoint takes at most {MAX_STOPS}", param="stop")
    if any(len(s) > MAX_STOP_CHARS for s in out):
        raise APIError(400, f"a stop string is longer than {MAX_STOP_CHARS} characters", param="stop")
    return out


def cut(text: str, stop: list[str]) -> str:
    """The answer's text as OpenAI returns it: up to the first stop string, which is left out (the tokens that
    formed it stay in the trajectory, as sampled)."""
    ends = [i for i in (text.find(s) for s in stop) if i >= 0]
    return text[:min(ends)] if ends else text
