"""Native tool calls: Python functions as tools, the model's calls parsed per family, run, answered as chat.

A recipe declares tools as plain functions with type hints and a Google-style docstring (the convention of
transformers' chat templates; `transformers.utils.get_json_schema` builds the JSON schema the template shows
the model), and picks the tool-call format of its model family:

    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.

        Args:
            a: the first
            b: the second
        \"\"\"
        return a + b

    class Adder(ToolEnv):                      # rollout.env = Adder (one instance per trajectory)
        toolbox = Toolbox([add], format="hermes")
        max_turns = 4

The model (Qwen2.5, Hermes format) ends a turn with
    <tool_call>\\n{"name": "add", "arguments": {"a": 2, "b": 40}}\\n</tool_call>
and the observation is [{"role": "tool", "name": "add", "content": "42"}], which rlcore.rollout.chat renders
through the model's chat template. A bad call is answered, never raised, and counted in `ToolEnv.stats`:
    {"name": "sub", ...}                 error: unknown tool 'sub'; tools: add
    {"name": "add", "arguments": {"a": "2", "b": 40}}
                                         error: add: argument 'a' must be integer, got string; expected
                                         add(a: integer, b: integer)      (one line)
    add raising ValueError("x")          error: add raised ValueError: x
    <tool_call>{"name": "add", </tool_call>
                                         error: malformed tool call: invalid JSON (Expecting property name
                                         enclosed in double quotes, line 1 column 17)
A turn without a call is the final answer: the episode ends.

Whatever the model writes, a turn's answer is bounded: at most rollout.max_tool_calls calls run (the rest are
answered with one line, tool/too_many_calls), none starts once the turn's deadline has passed
(rollout.turn_deadline_s; one line, tool/deadline), every message is cut to `max_chars` and every name or
value a message repeats to a few dozen characters, so a turn's observation holds at most
max_tool_calls + 2 messages of at most max_chars + 40 characters each.

A ready-made tool, `python(code: str) -> str`, runs the model's program in the rank's sandbox
(rlcore.sandbox.shared(), with the limits of the config's `sandbox` section) and answers with what the program
printed, its traceback, or a line saying why it stopped: `[timeout: stopped after 5 s]`,
`[memory: the program ran out of memory (512 MiB)]`, `[output truncated]`. Its program is stopped at the
turn's deadline too (`[timeout: the turn's time ran out]`).

Startup: `Toolbox(...)` checks the declarations and `check_template(tokenizer, model_path)` that the model's
chat template renders the tools; prompts are rendered with `apply_chat_template(..., tools=toolbox.schemas)`
(rlcore.preflight.checks). The parsers of each family's call format are in rlcore.rollout.toolcall.

Why one file of ~350 lines: the native tool path end to end (schemas, parsing the call, running it with its
limits, ToolEnv, the python tool) reads in order in one file.
"""
from __future__ import annotations

import asyncio
import copy
import inspect
import json
from dataclasses import astuple, dataclass, fields
from typing import Any, Callable

from rlcore.config.errors import one_line
from rlcore.rollout.env import Env, Step, limits, time_left
from rlcore.rollout.observation import clean
from rlcore.rollout.toolcall import PARSERS, ToolCall, brief, json_type, parse
from rlcore.sandbox import pool as sandbox


@dataclass
class ToolStats:
    """Counts over tool calls; add them up across turns and trajectories (`a + b`, `sum(stats, ToolStats())`)."""
    calls: int = 0  # attempted calls, bad ones included (what did not parse in a turn counts one)
    malformed: int = 0  # turns whose call text did not parse (bad JSON, no name, arguments not an object)
    unknown_tool: int = 0
    bad_arguments: int = 0  # missing, unexpected or wrongly typed arguments
    tool_raised: int = 0
    too_many_calls: int = 0  # calls not run: past the turn's rollout.max_tool_calls
    deadline: int = 0  # calls not run, or still running, when the turn's deadline passed

    @property
    def bad(self) -> int:
        return self.malformed + self.unknown_tool + self.bad_arguments + self.tool_raised + self.too_many_calls

    def __add__(self, other: ToolStats) -> ToolStats:
        return ToolStats(*(a + b for a, b in zip(astuple(self), astuple(other))))

    def metrics(self, prefix: str = "tool/") -> dict[str, int]:
        return {prefix + f.name: getattr(self, f.name) for f in fields(self)}


# ---- arguments against the schema ------------------------------------------------------------------------

def _type_error(value: Any, schema: dict) -> str | None:
    """What is wrong with a JSON value under a (get_json_schema) schema: type, nullable, enum, array items."""
    types = schema.get("type")
    if types is not None:
        allowed = ([types] if isinstance(types, str) else list(types)) + (["null"] if schema.get("nullable") else [])
        got = json_type(value)
        if got not in allowed and not (got == "integer" and "number" in allowed) and "any" not in allowed:
            return f"must be {' or '.join(allowed)}, got {got}"
    if "enum" in schema and value not in schema["enum"]:
        return f"must be one of {', '.join(json.dumps(v) for v in schema['enum'])}, got {brief(json.dumps(value))}"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            if (err := _type_error(item, schema["items"])) is not None:
                return f"item {i} {err}"
    return None


def _signature(schema: dict) -> str:
    """'add(a: integer, b?: number)': the call as the model should write it (? marks optional arguments)."""
    params, required = schema["parameters"].get("properties", {}), schema["parameters"].get("required", [])
    kinds = {k: p.get("type", "any") for k, p in params.items()}
    args = [f"{k}{'' if k in required else '?'}: {t if isinstance(t, str) else ' | '.join(t)}"
            for k, t in kinds.items()]
    return f"{schema['name']}({', '.join(args)})"


def check_arguments(arguments: dict, schema: dict) -> str | None:
    """The first problem with a call's arguments under the tool's function schema, or None."""
    params = schema["parameters"].get("properties", {})
    missing = [k for k in schema["parameters"].get("required", []) if k not in arguments]
    unexpected = [k for k in arguments if k not in params]
    if missing:
        return f"missing required argument '{missing[0]}'"
    if unexpected:
        return f"unexpected argument '{brief(unexpected[0])}'"
    for k, v in arguments.items():
        if (err := _type_error(v, params[k])) is not None:
            return f"argument '{k}' {err}"
    return None


# ---- declarations, execution and the environment ----------------------------------------------------------

HINT = ("tools need a type hint on every argument and a Google-style docstring: a description, then an Args: "
        "section with one line per argument (transformers.utils.get_json_schema)")


def tool_schema(fn: Any, position: int) -> dict:
    """The JSON schema of one declared tool; a ValueError naming the tool says what the declaration lacks."""
    from transformers.utils.chat_template_utils import (DocstringParsingException, TypeHintParsingException,
                                                        get_json_schema)
    if not callable(fn):
        raise ValueError(f"tool {position} ({one_line(repr(fn))[:60]}) is not callable; {HINT}")
    name = getattr(fn, "__name__", type(fn).__name__)
    if not inspect.getdoc(fn):
        raise ValueError(f"tool '{name}' has no docstring; {HINT}")
    for p in inspect.signature(fn).parameters.values():
        if p.annotation is inspect.Parameter.empty and p.name != "self":
            raise ValueError(f"tool '{name}': argument '{p.name}' has no type hint; {HINT}")
    try:
        return get_json_schema(fn)
    except (DocstringParsingException, TypeHintParsingException) as e:
        # transformers says "Cannot generate JSON schema for f because <reason>": keep the reason.
        raise ValueError(f"tool '{name}': {one_line(e).split(' because ', 1)[-1]}; {HINT}") from None


class Toolbox:
    """Declared tools, their schemas and a call format; shared read-only by every trajectory (thread-safe as
    long as the tools themselves are). `async def` tools run to completion on the calling thread, which must
    not be running an event loop (rlcore's environment workers are not). Results longer than `max_chars`
    characters are cut, so one runaway tool output cannot fill the context."""

    def __init__(self, tools: list[Callable], format: str = "hermes", max_chars: int = 2000):
        if format not in PARSERS:
            raise ValueError(f"unknown tool-call format '{format}'; valid: {', '.join(PARSERS)}")
        self.format, self.parse, self.max_chars = format, PARSERS[format], max_chars
        self.schemas = [tool_schema(fn, i) for i, fn in enumerate(tools)]
        self.functions: dict[str, Callable] = {}
        for fn, schema in zip(tools, self.schemas):
            name = schema["function"]["name"]
            if name in self.functions:
                raise ValueError(f"two tools are named '{name}'; tool names must be unique")
            self.functions[name] = fn
        self._by_name = {s["function"]["name"]: s["function"] for s in self.schemas}

    @property
    def names(self) -> list[str]:
        return list(self.functions)

    def bind(self, owner: Any) -> Toolbox:
        """A copy whose tools are `owner`'s attributes of the same names: tools declared as methods of a class
        (their schemas made once, from the class), called on one instance. The schemas are shared, not rebuilt."""
        bound = copy.copy(self)
        bound.functions = {name: getattr(owner, name) for name in self.functions}
        return bound

    def check_template(self, tokenizer, model_path: str) -> None:
        """Raise a one-line ValueError unless the tokenizer's chat template shows the model every tool."""
        from jinja2 import TemplateError
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"the tokenizer of {model_path} has no chat template, so the model cannot be shown "
                             f"its tools; native tool calls need a template that renders tools")
        probe = [{"role": "user", "content": "Hi."}]
        try:
            text = tokenizer.apply_chat_template(probe, tools=self.schemas, tokenize=False, add_generation_prompt=True)
        except (TemplateError, TypeError, ValueError) as e:
            raise ValueError(f"the chat template of {model_path} fails when rendering tools ({one_line(e)})") from None
        missing = [n for n in self.names if n not in text]
        if missing:
            raise ValueError(f"the chat template of {model_path} does not render tools: tool '{missing[0]}' is "
                             f"absent from a prompt rendered with tools=; use the model's tool-calling template")

    def call(self, call: ToolCall) -> tuple[str, str | None]:
        """Run one call: (message content, kind of failure or None). Never raises for the tool's own errors."""
        if call.name not in self.functions:
            known = ", ".join(self.names)
            return self._cut(f"error: unknown tool '{brief(call.name)}'; tools: {known}"), "unknown_tool"
        schema = self._by_name[call.name]
        if (err := check_arguments(call.arguments, schema)) is not None:
            return self._cut(f"error: {call.name}: {err}; expected {_signature(schema)}"), "bad_arguments"
        try:
            value = self.functions[call.name](**call.arguments)
            if inspect.iscoroutine(value):  # an async def tool: rlcore's env worker threads run no event loop
                value = asyncio.run(_until_deadline(value))
            if value is _LATE:
                return "error: stopped: the turn's time ran out", "deadline"
            # a circular or otherwise unprintable result is the tool's failure too, told to the model
            value = value if isinstance(value, str) else json.dumps(value, default=str)
        except Exception as e:  # the tool's failure is the model's observation, not the run's
            return self._cut(f"error: {call.name} raised {type(e).__name__}: {one_line(e)}"), "tool_raised"
        return self._cut(value), None

    def _cut(self, text: str) -> str:
        """At most max_chars characters (and a note of how many more), lone surrogates replaced."""
        if len(text) > self.max_chars:
            text = text[:self.max_chars] + f"... [{len(text) - self.max_chars} more characters]"
        return clean(text)

    def run(self, calls: list[ToolCall], parse_error: str | None = None) -> tuple[list[dict], ToolStats]:
        """Tool messages for a turn's calls (in order, then the parse error if any) and their counts, within
        the call's limits (rlcore.rollout.env.limits()): the first max_tool_calls calls, each started only
        before the deadline; one message says how many were not run, and why."""
        stats = ToolStats(calls=len(calls) + (parse_error is not None), malformed=int(parse_error is not None))
        cap = limits().max_tool_calls
        messages = []
        for k, call in enumerate(calls[:cap]):
            if time_left() <= 0:
                stats.deadline += min(len(calls), cap) - k
                messages.append({"role": "tool", "content": f"error: {_calls(min(len(calls), cap) - k)} not run: "
                                                            f"the turn's time ran out"})
                break
            content, kind = self.call(call)
            if kind is None and time_left() <= 0:  # it answered, but only when the time was up
                kind = "deadline"
            if kind:
                setattr(stats, kind, getattr(stats, kind) + 1)
            messages.append({"role": "tool", "name": brief(call.name), "content": content})
        if len(calls) > cap:
            stats.too_many_calls = len(calls) - cap
            messages.append({"role": "tool", "content": f"error: {_calls(len(calls) - cap, 'more ')} not run: at "
                                                        f"most {cap} per turn"})
        if parse_error is not None:
            messages.append({"role": "tool", "content": self._cut(f"error: malformed tool call: {parse_error}")})
        return messages, stats


def _calls(n: int, more: str = "") -> str:
    return f"{n} {more}tool call was" if n == 1 else f"{n} {more}tool calls were"


_LATE = object()  # what an async tool "returns" when the turn's deadline cancelled it


async def _until_deadline(coroutine):
    """An async tool's coroutine, cancelled at the turn's deadline."""
    left = time_left()
    try:
        return await asyncio.wait_for(coroutine, None if left == float("inf") else max(left, 0.0))
    except TimeoutError:
        if time_left() > 0:  # the tool's own timeout, not the turn's
            raise
        return _LATE


def declared_tools(env: Any) -> Toolbox | None:
    """The Toolbox an environment (class or instance) declares as `toolbox`, or None: its tools go into every
    prompt (rlcore.preflight.checks) and its chat template is checked at startup (rlcore.rollout.envs.make_envs)."""
    toolbox = getattr(env, "toolbox", None)
    return toolbox if isinstance(toolbox, Toolbox) else None


def tool_stats(envs: list) -> ToolStats:
    """The summed counts of the environments that keep ToolStats (ToolEnv's); others count nothing."""
    return sum((e.stats for e in envs if isinstance(getattr(e, "stats", None), ToolStats)), ToolStats())


def tool_calls(prompts: list[str], completions: list[str], envs: list, **_) -> list[float]:
    """Attempted tool calls per trajectory, as a reward function: weight 0 logs it, a negative weight is a cost."""
    return [float(env.stats.calls) for env in envs]


def bad_tool_calls(prompts: list[str], completions: list[str], envs: list, **_) -> list[float]:
    """Calls per trajectory that failed (malformed, unknown tool, bad arguments, the tool raised, past the turn's
    cap), likewise."""
    return [float(env.stats.bad) for env in envs]


def python(code: str) -> str:
    """Run a Python program and return what it printed; each call starts afresh, so print() every value you need.

    Args:
        code: the whole program, e.g. "print(12 * 4 - 6)"
    """
    box, left = sandbox.shared(), time_left()
    if left <= 0:
        return "[not run: the turn's time ran out]"
    limits = box.config
    # Within the turn's deadline: the program is stopped when the turn's time is up, so a trajectory the
    # loop gives up on leaves no program running and its sandbox worker free.
    result = box.run(code, min(left, limits.timeout_s))
    text = "".join(s if s.endswith("\n") else s + "\n" for s in (result.stdout, result.stderr) if s)
    # What the model reads has no timings in it, so a rollout stays reproducible (rlcore.sandbox.Result.text
    # shows the seconds). A truncated output already ends with "[output truncated]".
    if result.status == "timeout" and result.exit_code != -24 and left < limits.timeout_s:
        text += "[timeout: the turn's time ran out]"
    elif result.status == "timeout":
        text += (f"[timeout: stopped after {limits.cpu_s:g} s of CPU time]" if result.exit_code == -24 else
                 f"[timeout: stopped after {limits.timeout_s:g} s]")
    elif result.status == "memory":
        text += f"[memory: the program ran out of memory ({limits.memory_mb} MiB)]"
    elif result.status == "killed":
        text += "[killed: the program was stopped by a signal]"
    elif result.status == "error" and not result.stderr:
        text += f"[exit code {result.exit_code}]"
    return text or "[no output: print() the values you want to see]"


class ToolEnv(Env):
    """An environment that runs the model's tool calls (set `toolbox` in a subclass). A turn with calls, or with
    a call that does not parse, is answered with tool messages; a turn without one ends the episode, and
    `stats` holds the trajectory's counts. Override `step` (calling super) to add a reward."""

    toolbox: Toolbox
    max_turns = 4

    def __init__(self, row: dict | None = None):
        if not isinstance(getattr(self, "toolbox", None), Toolbox):
            raise TypeError(f"{type(self).__name__} needs a class attribute toolbox = Toolbox([...], format=...)")
        self.row = row
        self.stats = ToolStats()

    def step(self, action: str, action_ids: list[int]) -> Step:
        calls, error = parse(self.toolbox.format, action)
        if not calls and error is None:
            return Step(done=True)
        messages, stats = self.toolbox.run(calls, error)
        self.stats += stats
        return Step(messages)
