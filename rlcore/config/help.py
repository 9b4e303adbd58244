"""`--help` for a recipe: every config key with its type, the recipe's value and the comment written
where the field is declared (rlcore/config/sections.py, or an algorithm's own module), grouped by section.

    python launch/train.py recipe=demo --help
    python launch/train.py recipe=demo rollout.group_size=4 --help     # values after the overrides

The docs are read from the source, so the comment beside a field (or the comment lines just above it)
is the one place a field is documented.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import textwrap
import tokenize
import typing
from pathlib import Path
from typing import Any


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field: comment} for the annotated fields of `cls` and its dataclass bases: the comment at the end of
    the field's line or, where it has none, the comment lines directly above it."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # defined without a file (a REPL): no comments to read
            continue
        lines = source.splitlines()
        comments = {tok.start[0]: tok.string.lstrip("#").strip()
                    for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
        body = ast.parse(source).body[0].body
        for node in body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            beside = [comments[n] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1) if n in comments]
            above, line = [], node.lineno - 1
            while not beside and line >= 1 and lines[line - 1].strip().startswith("#"):
                above.insert(0, comments[line])
                line -= 1
            docs[node.target.id] = " ".join(above + beside)
    return docs


def _type_name(tp: Any) -> str:
    if tp is Any:
        return "any"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "").replace("NoneType", "None")


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError):
        return {}


def _value(value: Any) -> str:
    if callable(value) and not isinstance(value, type) and hasattr(value, "__qualname__"):
        return f"{value.__module__}:{value.__qualname__}"
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return repr(value)


def keys(cfg: Any, prefix: str = "") -> list[tuple[str, str, str, str, str]]:
    """(section, dotted key, type, value, doc) for every leaf of a config, recursing into sections,
    lists of sections and dataclass values such as the algorithm."""
    rows, hints, docs = [], _hints(type(cfg)), field_docs(type(cfg))
    for f in dataclasses.fields(cfg):
        key, value = prefix + f.name, getattr(cfg, f.name)
        section = prefix.rstrip(".") or "run"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            kind = f" ({type(value).__module__}.{type(value).__qualname__})" if f.name == "algorithm" else ""
            rows.append((key, key, "section" + kind, "", docs.get(f.name, "")))
            rows += keys(value, key + ".")
        elif isinstance(value, list) and value and all(dataclasses.is_dataclass(v) for v in value):
            rows.append((key, key, f"section ({len(value)} x {type(value[0]).__qualname__})", "",
                         docs.get(f.name, "")))
            for i, item in enumerate(value):
                rows += keys(item, f"{key}.{i}.")
        else:
            rows.append((section, key, _type_name(hints.get(f.name, Any)), _value(value), docs.get(f.name, "")))
    return rows


def render(cfg: Any, recipe: str) -> str:
    """The `--help` text of one recipe: a header per section, then per key `key = value  (type)` and its doc."""
    out, section = [f"Config keys of recipe {recipe} (set any with key=value; lists as [a,b]):"], None
    for sec, key, tp, value, doc in keys(cfg):
        if tp.startswith("section"):
            out += ["", f"[{key}]{tp[len('section'):]}" + (f"  {doc}" if doc else "")]
            section = key
            continue
        if not (sec == section or key.startswith(f"{section}.")):
            out += ["", f"[{sec}]"]
            section = sec
        out.append(f"  {key} = {value}  ({tp})")
        if doc:
            out.append(f"      {doc}")
    return "\n".join(out) + "\n"


def help_text(argv: list[str], recipes_dir: str | Path, usage: str) -> str:
    """What `--help` prints for these script args: the entry point's usage, or with recipe=NAME that
    recipe's keys after the other overrides. A bad recipe or override raises ConfigError as a run would."""
    from rlcore.config.cli import parse_argv

    argv = [a for a in argv if a not in ("--help", "-h")]
    recipe = next((a.partition("=")[2] for a in argv if a.startswith("recipe=")), None)
    return (usage if recipe is None else render(parse_argv(argv, recipes_dir), recipe)).rstrip()
