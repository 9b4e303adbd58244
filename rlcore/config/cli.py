"""Command line → Config: load a recipe, apply `dotted.key=value` overrides, save what ran.

    torchrun --nproc-per-node 2 launch/train.py recipe=demo optim.lr=3e-6 algorithm.clip_low=0.3
    torchrun --nproc-per-node 2 launch/train.py recipe=../forks/my_grpo.py rewards.0.weight=0.5

A recipe is NAME (recipes/NAME.py) or a path to any .py file defining `config() -> Config`.
Override values are parsed by the declared type of the field, never eval'd:
    int "3"      float "1e-3"     bool true/false/1/0/yes/no     str as given
    X | None "none"/"null"        list[X] "[1,2]" or "1,2" ("[]" empty)
    Any       by the type of the value the recipe put there (a scalar)
Every mistake raises ConfigError with a one-line message naming the key and what would be valid.
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.util
import json
import os
import re
import sys
import tempfile
import types
import typing
from pathlib import Path
from collections.abc import Iterable
from typing import Any, Literal, Union

from rlcore.config import Config
from rlcore.config.errors import describe

_NONE = ("none", "null")
_BOOLS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


class ConfigError(ValueError):
    """A bad recipe or override. The message is one line: the field or file, and what would be valid."""


def did_you_mean(name: str, choices: Iterable[str], prefix: str = "") -> str:
    """`did you mean 'lr'?` for the closest choice, or "" when none is close.

    `prefix` is put before the suggestion, so a leaf can be matched among its siblings and
    still be shown whole: did_you_mean("lrr", ["lr", "eps"], "optim.") -> "did you mean 'optim.lr'?"
    """
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f"did you mean '{prefix}{close[0]}'?" if close else ""


# ---------------------------------------------------------------------------------------------- recipes

def available_recipes(recipes_dir: str | Path) -> list[str]:
    """Recipe names in recipes_dir; files starting with `_` are shared helpers, not recipes."""
    return sorted(p.stem for p in Path(recipes_dir).glob("*.py") if not p.name.startswith("_"))


# The recipes that come with rlcore (recipes/ beside the package): a NAME not found where the caller looks is
# looked up here, so a fork saved anywhere can start from `load_recipe("demo")`.
BUILTIN_RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def load_recipe(spec: str, recipes_dir: str | Path = BUILTIN_RECIPES) -> Config:
    """Run `config()` of a recipe: any .py file (a fork may live anywhere), or NAME: recipes_dir/NAME.py, else
    rlcore's own recipes/NAME.py."""
    if spec.endswith(".py") or os.sep in spec or "/" in spec:
        path = Path(spec).expanduser()
        if path.suffix != ".py" or not path.is_file():
            raise ConfigError(f"recipe file {str(path)!r} is not an existing .py file")
    else:
        folders = [Path(recipes_dir)] + ([BUILTIN_RECIPES] if Path(recipes_dir).resolve() != BUILTIN_RECIPES else [])
        found = [f / f"{spec}.py" for f in folders if spec in available_recipes(f)]
        if not found:
            names = [available_recipes(f) for f in folders]
            hint = did_you_mean(spec, sorted(set().union(*names)))
            listed = ", ".join(names[0]) or "none in " + str(recipes_dir)
            if len(folders) > 1:
                listed += f"; built in: {', '.join(names[1]) or 'none in ' + str(BUILTIN_RECIPES)}"
            raise ConfigError(f"unknown recipe {spec!r}{'; ' + hint if hint else ''} (available: {listed})")
        path = found[0]
    path = path.resolve()
    # A name unique per file, so two recipes called grpo.py (repo and fork) never share a module;
    # registered in sys.modules because dataclasses and get_type_hints look the module up there.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    stem = re.sub(r"\W", "_", path.stem)
    module_name = f"rlcore_recipe_{stem}_{digest}"
    spec_ = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec_)
    sys.modules[module_name] = module
    try:
        spec_.loader.exec_module(module)
    except Exception as e:  # the user's recipe failed to run: name the file and the cause
        del sys.modules[module_name]
        raise ConfigError(f"recipe {str(path)!r} failed to run: {describe(e)}") from e
    if not callable(getattr(module, "config", None)):
        raise ConfigError(f"recipe {str(path)!r} defines no config() function returning a Config")
    try:
        cfg = module.config()
    except Exception as e:
        raise ConfigError(f"recipe {str(path)!r}: config() raised {describe(e)}") from e
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise ConfigError(f"config() in {str(path)!r} must return a dataclass instance such as "
                          f"rlcore.config.Config, got {type(cfg).__name__}")
    return cfg


# ---------------------------------------------------------------------------------------------- overrides

def _field_types(cls: type) -> dict[str, Any]:
    # Annotations are strings (`from __future__ import annotations`); resolve them in the class's module.
    # A class whose annotations cannot be resolved is typed by its runtime values instead (Any).
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError):
        return {}


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (Union, types.UnionType) and any(typing.get_origin(a) is Literal
                                                                for a in typing.get_args(tp)):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))  # int | Literal["auto"]: int or one of auto
    return tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")


def _is_section(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _parse(text: str, tp: Any) -> Any:
    """`text` as a value of type `tp`: ValueError when it is not one, TypeError when `tp` has no text form."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if type(None) in args and text.strip().lower() in _NONE:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _parse(text, arg)
            except ValueError:
                continue
        raise ValueError(text)
    if origin in (list, tuple):
        inner = text.strip()
        inner = inner[1:-1] if inner[:1] + inner[-1:] in ("[]", "()") else inner
        items = [s.strip() for s in inner.split(",")] if inner.strip() else []
        if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[float, int]: one type per slot
            if len(items) != len(args):
                raise ValueError(text)
            return tuple(_parse(s, a) for s, a in zip(items, args))
        values = [_parse(s, args[0] if args else str) for s in items]
        return tuple(values) if origin is tuple else values
    if origin is Literal:
        for arg in args:
            if str(arg) == text:
                return arg
        raise ValueError(text)
    if tp is bool:
        if text.strip().lower() not in _BOOLS:
            raise ValueError(text)
        return _BOOLS[text.strip().lower()]
    if tp in (int, float, str):
        return tp(text)  # int("1.5") raises; float("1e-3") and float("3") do not
    raise TypeError(f"has type {_type_name(tp)}")


def _child(obj: Any, part: str, path: str) -> Any:
    """obj.part (dataclass field) or obj[part] (list index), with a one-line error naming `path`."""
    key = f"{path}.{part}" if path else part
    if _is_section(obj):
        names = [f.name for f in dataclasses.fields(obj)]
        if part not in names:
            prefix = f"{path}." if path else ""
            hint = did_you_mean(part, names, prefix) or f"valid keys: {', '.join(names)}"
            raise ConfigError(f"unknown config key {key!r}; {hint}")
        return getattr(obj, part)
    if isinstance(obj, list):
        if not part.isdigit() or int(part) >= len(obj):
            valid = f"valid indices 0..{len(obj) - 1}" if obj else "it is empty"
            raise ConfigError(f"config key {key!r}: {path!r} is a list of {len(obj)} items, {valid}")
        return obj[int(part)]
    raise ConfigError(f"config key {key!r}: {path!r} is a {type(obj).__name__}, it has no sub-keys")


def apply_override(cfg: Any, override: str) -> None:
    """Apply one `dotted.key=value` to cfg in place."""
    key, eq, text = override.partition("=")
    key = key.strip()
    if not eq or not key:
        raise ConfigError(f"expected key=value (e.g. optim.lr=1e-5), got {override!r}")
    *parents, leaf = key.split(".")
    obj, path = cfg, ""
    for part in parents:
        obj = _child(obj, part, path)
        path = f"{path}.{part}" if path else part
    current = _child(obj, leaf, path)
    if _is_section(current) and getattr(current, "SHORTHAND", ""):  # plan=true is plan.show=true
        return apply_override(cfg, f"{key}.{current.SHORTHAND}={text}")
    if _is_section(current):
        subkeys = ", ".join(f"{key}.{f.name}" for f in dataclasses.fields(current))
        raise ConfigError(f"config key {key!r} is a section, not a value; set one of: {subkeys}")
    tp = Any if isinstance(obj, list) else _field_types(type(obj)).get(leaf, Any)
    if tp is Any:  # nothing declared (algorithm: Any, a list item): typed by the recipe's value
        if not isinstance(current, (bool, int, float, str)):
            held = "None" if current is None else type(current).__name__
            raise ConfigError(f"config key {key!r} holds {held}, which only the recipe can set")
        tp = type(current)
    inner = typing.get_args(tp)[0] if typing.get_origin(tp) is list and typing.get_args(tp) else None
    if (isinstance(current, list) and any(map(_is_section, current))) or dataclasses.is_dataclass(inner):
        raise ConfigError(f"config key {key!r} is a list of sections, set in the recipe only; "
                          f"override one item's field instead, e.g. {key}.0.<field>=...")
    try:
        value = _parse(text, tp)
    except TypeError as e:
        raise ConfigError(f"config key {key!r} {e}, which only the recipe can set") from e
    except ValueError as e:
        raise ConfigError(f"config key {key!r} expects {_type_name(tp)}, got {text!r}") from e
    if isinstance(obj, list):
        obj[int(leaf)] = value
    else:
        # object.__setattr__ also sets fields of frozen dataclasses (an algorithm may be frozen):
        # overrides are applied once, before anything reads the config.
        object.__setattr__(obj, leaf, value)


def apply_overrides(cfg: Any, overrides: list[str]) -> Any:
    """Apply `dotted.key=value` overrides in order (the last one wins); returns the same cfg."""
    for override in overrides:
        apply_override(cfg, override)
    return cfg


def parse_argv(argv: list[str], recipes_dir: str | Path) -> Config:
    """Script args → Config: exactly one `recipe=NAME_OR_PATH` anywhere, the rest are overrides."""
    recipes = [a.partition("=")[2] for a in argv if a.startswith("recipe=")]
    if len(recipes) != 1:
        available = ", ".join(available_recipes(recipes_dir)) or f"none in {str(recipes_dir)!r}"
        got = "missing" if not recipes else f"given {len(recipes)} times"
        raise ConfigError(f"recipe=NAME is required exactly once ({got}); available: {available}")
    cfg = load_recipe(recipes[0], recipes_dir)
    return apply_overrides(cfg, [a for a in argv if not a.startswith("recipe=")])


# ---------------------------------------------------------------------------------------------- saving

def _to_json(value: Any, declared: Any) -> Any:
    if _is_section(value):
        types_ = _field_types(type(value))
        out = {f.name: _to_json(getattr(value, f.name), types_.get(f.name, Any))
               for f in dataclasses.fields(value)}
        # Name the class when the field's type does not (e.g. algorithm: Any holds a GRPO).
        if type(value) is not declared and type(value) not in typing.get_args(declared):
            out["_target"] = f"{type(value).__module__}.{type(value).__qualname__}"
        return out
    if isinstance(value, (list, tuple)):
        args = typing.get_args(declared)
        return [_to_json(v, args[0] if args else Any) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_json(v, Any) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if callable(value):  # reward functions, classes: "module:qualname", the same form recipes may use
        name = getattr(value, "__qualname__", type(value).__qualname__)
        return f"{getattr(value, '__module__', type(value).__module__)}:{name}"
    return str(value)  # Path, torch.dtype, enums: readable, never a JSON error


def config_to_dict(cfg: Any) -> dict:
    """JSON-safe dict of a config: sections → dicts, algorithm classes → `_target`, callables → names."""
    return _to_json(cfg, type(cfg))


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the config as JSON atomically: a crash leaves the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(config_to_dict(cfg), indent=2) + "\n"  # fails here, before any file exists
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; a config is for everyone to read
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):  # only after a failed write: os.replace consumed it otherwise
            os.remove(tmp)
