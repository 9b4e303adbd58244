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

During RL the model writes these texts, so no text may stop the run: every parser is linear in the text (no
backtracking regex), reads at most MAX_CALL_CHARS characters of one call and at most MAX_DEPTH levels of
nesting, refuses NaN, infinities and integers too long to convert; `parse` runs one format and turns any
error a parser still raises into the error string. Errors and echoed names are cut (`brief`), so what the model reads
back is short whatever it wrote.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

MAX_CALL_CHARS = 2 ** 18  # characters of one call's text that are read; a longer call is an error
MAX_DEPTH = 64  # nesting of [ and { in a call; json's C scanner raises RecursionError near 1000
MAX_ERRORS = 3  # errors of one turn spelled out; the rest are counted
ECHO_CHARS = 64  # characters of a model-written name or value that an error message repeats


@dataclass
class ToolCall:
    name: str
    arguments: dict = field(default_factory=dict)


def brief(text: str, limit: int = ECHO_CHARS) -> str:
    """Model-written text as an error message may repeat it: at most `limit` characters, and lone surrogates
    (a JSON escape such as "\\ud800" decodes to one; tokenizers refuse them) replaced by "?"."""
    text = text if len(text) <= limit else text[:limit] + "..."
    return text.encode("utf-8", "replace").decode("utf-8")


def _show(value: Any) -> str:
    """A decoded JSON value as JSON, cut for an error message (values are shallow: see MAX_DEPTH)."""
    return brief(json.dumps(value))


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
        return f'"name" must be a non-empty string, got {_show(obj["name"])}'
    key = next((k for k in args_keys if k in obj), args_keys[0])
    args = obj.get(key, {})  # a tool without arguments may be called without the field
    if not isinstance(args, dict):
        return f'"{key}" must be a JSON object, got {json_type(args)}'
    return ToolCall(obj["name"], args)


def _json_error(e: ValueError) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"invalid JSON ({e.msg}, line {e.lineno} column {e.colno})"
    return f"invalid JSON ({brief(str(e))})"  # e.g. an integer of more than 4300 digits


def _not_finite(text: str) -> float:
    raise ValueError(f"{text} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to inf
        raise ValueError(f"{brief(text, 24)} is out of range")
    return value


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in a decoded value (iterative: the value may be deep)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d)
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


_DECODER = json.JSONDecoder(parse_constant=_not_finite, parse_float=_finite)
_SPACE = re.compile(r"\s*")
_TOO_DEEP = f"invalid JSON (nested deeper than {MAX_DEPTH} levels)"


def _decoded(decode: Callable[[], Any]) -> tuple[Any, str | None]:
    """(decode(), None), or (None, what is wrong): a JSON error, NaN, 1e400, an integer past the digit limit,
    or nesting past what the C scanner takes (RecursionError) or past MAX_DEPTH. What passes is shallow, so
    printing, pickling (the TP group's all_gather_object) and the tools never recurse deeply on it."""
    try:
        value = decode()
    except RecursionError:
        return None, _TOO_DEEP
    except ValueError as e:
        return None, _json_error(e)
    return (None, _TOO_DEEP) if _depth(value) > MAX_DEPTH else (value, None)


def _too_long(body: str) -> str | None:
    if len(body) > MAX_CALL_CHARS:
        return f"the call is {len(body)} characters long; at most {MAX_CALL_CHARS} are read"
    return None


def _collect(items: list[ToolCall | str]) -> tuple[list[ToolCall], str | None]:
    errors = [x for x in items if isinstance(x, str)]
    more = f"; and {len(errors) - MAX_ERRORS} more errors" if len(errors) > MAX_ERRORS else ""
    return [x for x in items if isinstance(x, ToolCall)], "; ".join(errors[:MAX_ERRORS]) + more or None


def _blocks(text: str, opener: str, closer: str) -> list[str]:
    """The text inside each opener ... closer pair; a last opener without its closer reads to the end. A scan
    with str.find: linear in the text, whatever it holds (no regex to backtrack)."""
    blocks, i = [], text.find(opener)
    while i >= 0:
        start = i + len(opener)
        end = text.find(closer, start)
        if end < 0:
            blocks.append(text[start:])
            break
        blocks.append(text[start:end])
        i = text.find(opener, end + len(closer))
    return blocks


def parse_hermes(text: str) -> tuple[list[ToolCall], str | None]:
    """Qwen2.5 / Qwen3 / Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one or more blocks.
    A last block without its closing tag is read to the end of the text (models often stop right there)."""
    blocks = _blocks(text, "<tool_call>", "</tool_call>")
    items: list[ToolCall | str] = []
    for k, block in enumerate(blocks, 1):
        where = f"tool call {k}: " if len(blocks) > 1 else ""
        err = _too_long(block)
        value, err = (None, err) if err else _decoded(lambda: _DECODER.decode(block))
        call = _call(value) if err is None else err
        items.append(call if isinstance(call, ToolCall) else where + call)
    return _collect(items)


def _json_sequence(body: str, sep: str) -> list[Any] | str:
    """JSON values separated by `sep` (and whitespace) filling `body`, or what is wrong. Indices only, no
    slices of the rest: a body of many short values stays linear."""
    if (err := _too_long(body)) is not None:
        return err
    values, i = [], _SPACE.match(body).end()
    while True:
        pair, err = _decoded(lambda: _DECODER.raw_decode(body, i))
        if err is not None:
            return err
        values.append(pair[0])
        i = _SPACE.match(body, pair[1]).end()
        if i == len(body):
            return values
        if not sep or not body.startswith(sep, i):
            return f"unexpected text after the call: {brief(body[i:i + 30], 30)!r}"
        i = _SPACE.match(body, i + len(sep)).end()
        if i == len(body):  # a trailing separator
            return values


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


# A forced call (tool_choice "required", or one function named) is the format's call opener written after the
# generation prompt, as prompt tokens the model did not sample (no loss on them); the model writes the rest of
# the call itself, from the distribution the trainer recomputes. Named: the opener and the function's name.
OPENERS = {"hermes": ("<tool_call>\n", '<tool_call>\n{{"name": {name}, "arguments": '),
           "llama3": ('{"name": "', '{{"name": {name}, "parameters": '),
           "mistral": ("[TOOL_CALLS]", '[TOOL_CALLS][{{"name": {name}, "arguments": ')}


def forced_opener(tool_choice, tools: list | None, format: str) -> str:
    """The text a request's tool_choice writes after the generation prompt: "" for "auto" and "none"; raises
    rlcore.rollout.fields.APIError (a 400) for a choice that names no declared function."""
    from rlcore.rollout.fields import APIError

    if tool_choice in ("auto", "none"):
        return ""
    names = [t.get("function", {}).get("name") for t in tools or [] if isinstance(t, dict)]
    if tool_choice == "required":
        if not names:
            raise APIError(400, 'tool_choice="required" needs tools', param="tool_choice")
        return OPENERS[format][0]
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str):
        raise APIError(400, f'tool_choice must be "auto", "none", "required" or {{"type": "function", "function": '
                            f'{{"name": ...}}}} (got {brief(json.dumps(tool_choice))})', param="tool_choice")
    if name not in names:
        raise APIError(400, f"tool_choice names the function {brief(name)!r}, which is not in tools "
                            f"({', '.join(map(str, names)) or 'none declared'})", param="tool_choice")
    return OPENERS[format][1].format(name=json.dumps(name))


def parse(format: str, text: str) -> tuple[list[ToolCall], str | None]:
    """PARSERS[format](text) for any text: whatever a parser still raises on it becomes the error string."""
    try:
        return PARSERS[format](text)
    except Exception as e:  # the model wrote the text: its failure to parse is the model's observation, never the run's
        return [], f"the tool call could not be read ({type(e).__name__}: {brief(str(e))})"
