"""Reward functions, and the machinery that finds them and adds them up.

A reward function scores a batch of completions:

    def reward(prompts: list[str], completions: list[str], **columns) -> list[float]

`completions` are the decoded responses without special tokens; `columns` are the prompt dataset's other
fields as lists aligned with `prompts` (e.g. answer=["68", ...]); take what you need and ignore the rest with
**kwargs. A recipe lists them as RewardSpec(fn, weight) with fn a callable, "module:function",
"path/to/file.py:function" or a built-in's name ("arithmetic_exact", "gsm8k"); the step's reward is the
weighted sum. Any mistake in a reward function (an exception, a wrong-length list, a NaN) stops the run with
a one-line RewardError that names the function and the sample.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
import importlib
import importlib.util
import math
import numbers
import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from rlcore.config.errors import describe
from rlcore.distributed.collectives import agree
from rlcore.distributed.parallel import device_type
from rlcore.models import build as models
from rlcore.train import packing

if TYPE_CHECKING:
    from rlcore.run import Run

NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")


class RewardError(RuntimeError):
    """A reward function misbehaved; the message is one line naming the function and the sample."""


def arithmetic_exact(prompts: list[str], completions: list[str], answer: list, **_) -> list[float]:
    """1.0 if the stripped completion is exactly the answer: "68" for answer "68"; " 68\\n" too; "068" not."""
    return [float(c.strip() == str(a).strip()) for c, a in zip(completions, answer)]


def final_number(text: str) -> float | None:
    """The number a GSM8K-style text ends on: the first number after the last "####" if there is one, else
    the last number anywhere; commas and "$" are dropped. "so #### 1,234" -> 1234.0, "is $72." -> 72.0."""
    _, sep, tail = text.rpartition("####")
    found = NUMBER.findall(tail)
    pick = found[0] if sep and found else (NUMBER.findall(text) or [None])[-1]
    return None if pick is None else float(pick.replace(",", "").replace("$", ""))


def gsm8k(prompts: list[str], completions: list[str], answer: list[str], **_) -> list[float]:
    """1.0 if the completion's final number equals the answer's (GSM8K answers end in "#### 72")."""
    scores = []
    for c, a in zip(completions, answer):
        got, want = final_number(c), final_number(str(a))
        scores.append(float(got is not None and want is not None and math.isclose(got, want, abs_tol=1e-6)))
    return scores


BUILTINS = {"arithmetic_exact": arithmetic_exact, "gsm8k": gsm8k}


def resolve(fn, what: str = "reward") -> Callable:
    """A callable, "module:function", "path/to/file.py:function", or a built-in's name -> the function.
    `what` names the setting in error messages (e.g. "rollout.env", which resolves the same way)."""
    return fn if callable(fn) else _resolve_spec(str(fn), what)


def _resolve_spec(spec: str, what: str) -> Callable:
    if spec in BUILTINS and what.startswith("reward"):
        return BUILTINS[spec]
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ValueError(f"{what} '{spec}' is not a built-in ({', '.join(BUILTINS)}) nor of the form "
                         f"'module:function' or 'path/to/file.py:function'")
    if where.endswith(".py") and not Path(where).expanduser().is_file():
        raise ValueError(f"{what} '{spec}': file '{where}' does not exist")
    try:
        module = _load(where)
    except Exception as e:  # the user's file failed to run, or the module is not there: keep the cause
        how = f"running '{where}' failed: " if where.endswith(".py") else f"cannot import module '{where}' ("
        raise ValueError(f"{what} '{spec}': {how}{describe(e)}{'' if where.endswith('.py') else ')'}") from e
    found = getattr(module, name, None)
    if not callable(found):
        raise ValueError(f"{what} '{spec}': '{where}' has no function '{name}'")
    return found


@functools.lru_cache(maxsize=None)  # a file runs once, however many settings name it
def _load(where: str):
    if not where.endswith(".py"):
        return importlib.import_module(where)
    path = Path(where).expanduser()
    module_spec = importlib.util.spec_from_file_location(f"rlcore_user_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def fn_name(fn) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _short(text: str, n: int = 40) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def score(specs, prompts: list[str], completions: list[str],
          columns: dict[str, list]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weighted sum of every reward over the batch.

    specs: [(fn, weight), ...] or [RewardSpec, ...] (fn as for `resolve`). Returns (total [N] float32,
    {name: that function's unweighted scores [N]}); a name that repeats gets "#2", "#3"... appended.
    Example: specs [(exact, 1.0), (short, 0.5)], exact -> [1, 0], short -> [1, 1] gives total [1.5, 0.5].
    """
    n = len(prompts)
    if len(completions) != n or any(len(v) != n for v in columns.values()):
        lengths = {k: len(v) for k, v in columns.items()}
        raise ValueError(f"score(): {n} prompts, {len(completions)} completions, columns {lengths}: must be equal")
    total = torch.zeros(n, dtype=torch.float32)
    per_fn: dict[str, torch.Tensor] = {}
    for spec in specs:
        fn, weight = (spec.fn, spec.weight) if hasattr(spec, "fn") else spec
        fn = resolve(fn)
        name = fn_name(fn)
        values = _call(fn, name, prompts, completions, columns)
        key, k = name, 1
        while key in per_fn:
            k += 1
            key = f"{name}#{k}"
        per_fn[key] = torch.tensor(values, dtype=torch.float32)
        total += weight * per_fn[key]
    return total, per_fn


def _call(fn, name: str, prompts: list[str], completions: list[str], columns: dict[str, list]) -> list[float]:
    n = len(prompts)
    try:
        values = fn(prompts, completions, **columns)
    except Exception as e:  # a user function: say which one and on which sample, then stop the step
        where = f"a batch of {n} samples (no single sample fails alone)"
        for i in range(n):  # a batch call cannot say which sample raised: re-run them one by one
            try:
                fn(prompts[i:i + 1], completions[i:i + 1], **{k: v[i:i + 1] for k, v in columns.items()})
            except Exception as e_i:
                e, where = e_i, f"sample {i} (prompt {_short(prompts[i])}, completion {_short(completions[i])})"
                break
        raise RewardError(f"reward function '{name}' raised on {where}: {type(e).__name__}: "
                          f"{_one_line(str(e))}") from None
    if not hasattr(values, "__len__") or len(values) != n:
        got = len(values) if hasattr(values, "__len__") else f"a {type(values).__name__}, not a list of"
        raise RewardError(f"reward function '{name}' returned {got} scores for {n} samples")
    out = []
    for i, v in enumerate(values):
        if torch.is_tensor(v) and v.numel() == 1:
            v = v.item()
        if not isinstance(v, numbers.Real):  # bools pass, as 1.0 / 0.0
            raise RewardError(f"reward function '{name}' returned {repr(v)[:30]} (not a number) for "
                              f"sample {i} (prompt {_short(prompts[i])})")
        if not math.isfinite(v):
            raise RewardError(f"reward function '{name}' returned {v} (NaN or inf) for sample {i} "
                              f"(prompt {_short(prompts[i])}, completion {_short(completions[i])})")
        out.append(float(v))
    return out


# ---- scoring a step's rollouts: reward functions and reward models together -----------------------------

@dataclass
class RewardModel:
    """A frozen sequence classifier scoring (prompt, completion) texts with its own tokenizer."""
    path: str
    model: torch.nn.Module
    tokenizer: object


def reward_inputs(rows: list[dict], prompt_column: str) -> tuple[list[str], dict[str, list]]:
    """Dataset rows -> (prompt texts, every other column as a list) for the reward functions."""
    columns = {k: [r[k] for r in rows] for k in rows[0] if k not in (prompt_column, "prompt_ids")}
    return [r[prompt_column] for r in rows], columns


def score_rollouts(run: Run, rows: list[dict], completions: list[str], extra: dict[str, list] | None = None
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weighted reward per sequence [B] from the reward functions plus the reward models, and each one's
    unweighted scores by name. `extra` adds columns (multi-turn: transcripts, turns, envs). Any rank's
    reward-function error stops every rank before the update."""
    prompts, columns = reward_inputs(rows, run.cfg.data.prompt_column)
    columns |= extra or {}
    error, total, parts = None, torch.zeros(len(rows)), {}
    try:
        if run.rollout.reward_fns:
            total, parts = score(run.rollout.reward_fns, prompts, completions, columns)
    except RewardError as e:
        error = str(e)
    agree(error)
    for i, (rm, weight) in enumerate(run.rollout.reward_models):
        parts[f"model{i}"] = reward_model_scores(run, rm, prompts, completions)
        total = total + weight * parts[f"model{i}"]
    return total, parts


@torch.no_grad()
def reward_model_scores(run: Run, rm: RewardModel, prompts: list[str], completions: list[str]) -> torch.Tensor:
    """[B] scores from a reward model: prompt + completion re-tokenized with the reward model's tokenizer
    (through its chat template, as a user and an assistant turn, when the data uses one)."""
    if run.cfg.data.chat_template and rm.tokenizer.chat_template:
        ids = [rm.tokenizer.apply_chat_template([{"role": "user", "content": p}, {"role": "assistant", "content": c}],
                                                tokenize=True) for p, c in zip(prompts, completions)]
        ids = [x["input_ids"] if hasattr(x, "keys") else x for x in ids]
    else:
        ids = [rm.tokenizer(p + c).input_ids for p, c in zip(prompts, completions)]
    dev, t, pad = device_type(), run.cfg.train, rm.tokenizer.pad_token_id or 0
    out = torch.zeros(len(ids))  # [B]
    for index in packing.micro_batches([len(x) for x in ids], t.micro_batch_size, t.max_tokens_per_micro_batch):
        if index is None:  # a dummy: this rank runs as many forwards as the others (FSDP2)
            d = packing.dummy(dev)
            models.sequence_scores(rm.model, d.input_ids, None, d.position_ids, last=d.last)
            continue
        chunk = [ids[i] for i in index]
        L = max(map(len, chunk))
        input_ids = torch.tensor([x + [pad] * (L - len(x)) for x in chunk], device=dev)
        attention_mask = torch.tensor([[1] * len(x) + [0] * (L - len(x)) for x in chunk], device=dev)
        if t.max_tokens_per_micro_batch:
            p = packing.pack(input_ids, attention_mask)
            out[index] = models.sequence_scores(rm.model, p.input_ids, None, p.position_ids, last=p.last).cpu()
        else:
            out[index] = models.sequence_scores(rm.model, input_ids, attention_mask).cpu()
    return out
