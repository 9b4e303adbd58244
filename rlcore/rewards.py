"""Reward functions: `reward(prompts, completions, **columns) -> list[float]`, one score per sample.

`columns` are the dataset's other fields as lists aligned with the samples (e.g. `answer=[...]`).
A recipe lists RewardSpec(fn, weight) entries; the step's reward is their weighted sum. `fn` is a
callable, "module:function", or "path/to/file.py:function" (so a fork can keep its reward beside it).

Built-ins: `arithmetic_exact` (the completion is exactly the answer) and `gsm8k` (final number).
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import re
from pathlib import Path
from typing import Callable

import torch


class RewardError(RuntimeError):
    """A reward function failed on a step's samples (message: one line naming the function and sample)."""


def arithmetic_exact(prompts: list[str], completions: list[str], answer: list, **_) -> list[float]:
    """1.0 when the completion, stripped, is exactly the answer: "85" vs answer "85" -> 1.0, "085" -> 0.0."""
    return [float(c.strip() == str(a).strip()) for c, a in zip(completions, answer)]


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_number(text: str) -> float | None:
    """The number after the last "####", else the last number in the text; commas and $ ignored.

    "so 3 + 4 = 7. #### 1,234" -> 1234.0;  "The answer is $72." -> 72.0;  "no idea" -> None."""
    tail = text.rsplit("####", 1)[1] if "####" in text else text
    found = _NUMBER.findall(tail.replace("$", ""))
    if not found:
        return None
    return float(found[0 if "####" in text else -1].replace(",", ""))


def gsm8k(prompts: list[str], completions: list[str], answer: list, **_) -> list[float]:
    """GSM8K: 1.0 when the completion's final number equals the reference's ("... #### 72")."""
    out = []
    for completion, ref in zip(completions, answer):
        got, want = final_number(completion), final_number(str(ref))
        out.append(float(got is not None and want is not None and abs(got - want) < 1e-6))
    return out


def resolve(fn) -> Callable:
    """A callable as is; "module:function" or "path/to/file.py:function" imported."""
    if callable(fn):
        return fn
    if not isinstance(fn, str) or ":" not in fn:
        raise ValueError(f"rewards: fn {fn!r} must be a callable, 'module:function' or 'file.py:function'")
    where, _, name = fn.rpartition(":")
    try:
        if where.endswith(".py"):
            path = Path(where).expanduser()
            if not path.is_file():
                raise ValueError(f"rewards: file '{where}' in fn {fn!r} does not exist")
            spec = importlib.util.spec_from_file_location(f"rlcore_reward_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ImportError as e:
        raise ValueError(f"rewards: cannot import '{where}' for fn {fn!r}: {e}") from None
    if not callable(getattr(module, name, None)):
        raise ValueError(f"rewards: '{where}' has no function '{name}' (fn {fn!r})")
    return getattr(module, name)


def _short(text: str, n: int = 40) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def score(fns: list[tuple[Callable, float]], prompts: list[str], completions: list[str],
          columns: dict[str, list]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weighted sum of every reward function. Returns (total [N], {function name: scores [N]})."""
    n = len(prompts)
    total = torch.zeros(n, dtype=torch.float32)
    per_fn = {}
    for fn, weight in fns:
        name = getattr(fn, "__name__", repr(fn))
        try:
            scores = fn(prompts, completions, **columns)
        except Exception as e:  # a user function: report which one and where, then stop the step
            i = _first_failing(fn, prompts, completions, columns)
            where = f"sample {i} (prompt {_short(prompts[i])}, completion {_short(completions[i])})" if i is not None \
                else f"a batch of {n} samples"
            raise RewardError(f"reward function '{name}' raised on {where}: {type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}") from None
        if not hasattr(scores, "__len__") or len(scores) != n:
            got = len(scores) if hasattr(scores, "__len__") else type(scores).__name__
            raise RewardError(f"reward function '{name}' returned {got} scores for {n} samples")
        values = []
        for i, s in enumerate(scores):
            if isinstance(s, bool) or not isinstance(s, (int, float)) and not torch.is_tensor(s):
                raise RewardError(f"reward function '{name}' returned {s!r} (not a number) for sample {i}")
            if not math.isfinite(float(s)):
                raise RewardError(f"reward function '{name}' returned {float(s)} (NaN or inf) for sample {i} "
                                  f"(prompt {_short(prompts[i])}, completion {_short(completions[i])})")
            values.append(float(s))
        per_fn[name] = torch.tensor(values, dtype=torch.float32)
        total += weight * per_fn[name]
    return total, per_fn


def _first_failing(fn, prompts, completions, columns) -> int | None:
    """Re-run sample by sample to name the one that fails (only after the batch call raised)."""
    for i in range(len(prompts)):
        try:
            fn(prompts[i:i + 1], completions[i:i + 1], **{k: v[i:i + 1] for k, v in columns.items()})
        except Exception:  # the same user error as above; we only want its position
            return i
    return None
