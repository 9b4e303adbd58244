"""Tool calls in a model's own format: decoded text -> (calls, error or None), one small parser per family.

    parse_hermes('<tool_call>\\n{"name": "add", "arguments": {"a": 2, "b": 40}}\\n</tool_call>')
        -> ([ToolCall("add", {"a": 2, "b": 40})], None)
    parse_hermes('<tool_call>{"name": "add", </tool_call>')
        -> ([], "invalid JSON (Expecting property name enclosed in double quotes, line 1 column 17)")
    parse_hermes("It is 42.") -> ([], None)                       no call: the model answered

Every call found is returned; what is wrong with the others is one error string (the model reads it as a
tool message, rlcore.rollout.tools). Parsers read decoded text: a marker the tokenizer marks special (Llama's
<|python_tag|>, Mistral's [TOOL_CALLS]) may be dropped by the decode, so each parser also reads the call
without it. Formats are registered by name in PARSERS (Toolbox(format=...)); vLLM's own parsers are not used
at run time: their import paths and protocol change between releases.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class ToolCall:
    name: str
    arguments: dict = field(default_factory=dict)


def json_type(value: Any) -> str:
    """The JSON type name of a decoded value: "integer", "string", "null", ..."""
    if value is None:
        return "null"
    for name, kind in (("boolean", bool), ("integer", int), ("number", float), ("string", str), ("array", list),
                       ("object", dict)):
        if isinstance(value, kind):  # bool before int: True is an int in Python, not in JSON
            return name
    return type(value).__name__


def _call(obj: Any, args_keys: tuple[str, ...] = ("arguments",)) -> ToolCall | str:
    """One decoded JSON call -> a ToolCall, or what is wrong with it."""
    if not isinstance(obj, dict):
        return f"a call must be a JSON object, got {json_type(obj)}"
    if "name" not in obj:
        return 'no "name" field'
    if not isinstance(obj["name"], str) or not obj["name"]:
        return f'"name" must be a non-empty string, got {json.dumps(obj["name"])}'
    key = next((k for k in args_keys if k in obj), args_keys[0])
    args = obj.get(key, {})  # a tool without arguments may be called without the field
    if not isinstance(args, dict):
        return f'"{key}" must be a JSON object, got {json_type(args)}'
    return ToolCall(obj["name"], args)


def _json_error(e: json.JSONDecodeError) -> str:
    return f"invalid JSON ({e.msg}, line {e.lineno} column {e.colno})"


def _collect(items: list[ToolCall | str]) -> tuple[list[ToolCall], str | None]:
    errors = [x for x in items if isinstance(x, str)]
    return [x for x in items if isinstance(x, ToolCall)], "; ".join(errors) or None


def parse_hermes(text: str) -> tuple[list[ToolCall], str | None]:
    """Qwen2.5 / Qwen3 / Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one or more blocks.
    A last block without its closing tag is read to the end of the text (models often stop right there)."""
    blocks = re.findall(r"<tool_call>(.*?)(?:</tool_call>|$)", text, re.S)
    items: list[ToolCall | str] = []
    for k, block in enumerate(blocks, 1):
        where = f"tool call {k}: " if len(blocks) > 1 else ""
        try:
            call = _call(json.loads(block))
        except json.JSONDecodeError as e:
            call = _json_error(e)
        items.append(call if isinstance(call, ToolCall) else where + call)
    return _collect(items)


def _json_sequence(body: str, sep: str) -> list[Any] | str:
    """JSON values separated by `sep` (and whitespace) filling `body`, or what is wrong."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while True:
        try:
            value, i = decoder.raw_decode(body, i)
        except json.JSONDecodeError as e:
            return _json_error(e)
        values.append(value)
        rest = body[i:].lstrip()
        if not rest:
            return values
        if not sep or not rest.startswith(sep):
            return f"unexpected text after the call: {rest[:30]!r}"
        if not rest[len(sep):].strip():  # a trailing separator
            return values
        i = len(body) - len(rest[len(sep):].lstrip())


def parse_llama3(text: str) -> tuple[list[ToolCall], str | None]:
    """Llama 3.1 / 3.2 JSON tool calling: {"name": ..., "parameters": {...}} ("arguments" also read), after
    <|python_tag|> or as the whole turn; several separated by ";". Text not starting with "{" is an answer."""
    tag = text.find("<|python_tag|>")
    body = text[tag + len("<|python_tag|>"):] if tag >= 0 else text.lstrip()
    if tag < 0 and not body.startswith("{"):
        return [], None
    for end in ("<|eom_id|>", "<|eot_id|>"):  # present when the action was decoded with special tokens
        body = body.strip().removesuffix(end)
    values = _json_sequence(body.strip(), ";")
    if isinstance(values, str):
        return [], values
    return _collect([_call(v, ("parameters", "arguments")) for v in values])


def parse_mistral(text: str) -> tuple[list[ToolCall], str | None]:
    """Mistral before v11: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]; without the marker, a turn
    that starts with '[{' is read as the list."""
    tag = text.find("[TOOL_CALLS]")
    body = text[tag + len("[TOOL_CALLS]"):].strip() if tag >= 0 else text.lstrip()
    if tag < 0 and not body.startswith("[{"):
        return [], None
    values = _json_sequence(body, "")
    if isinstance(values, str):
        return [], values
    calls = values[0] if isinstance(values[0], list) else values
    return _collect([_call(v) for v in calls] or ["an empty list of calls"])


PARSERS: dict[str, Callable[[str], tuple[list[ToolCall], str | None]]] = {
    "hermes": parse_hermes, "llama3": parse_llama3, "mistral": parse_mistral}

