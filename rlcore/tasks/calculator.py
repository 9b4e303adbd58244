"""Addition with a calculator tool: the demo's task (rlcore.tasks.tiny), plus a tool the model may call.

    python -m rlcore.tasks.calculator    # build once into $RLCORE_CACHE/calculator-v1-...; prints the warm start

The model answers "47+38=" directly ("85" then EOS), or calls the tool by writing "?" (a stop token: the turn
ends there). The tool answers "85=" (the exact sum: environment tokens, never trained on) and the model must
then copy the answer:

    <bos> 4 7 + 3 8 = | ? | 8 5 = | 8 5 <eos>      model turns "?" and "85"; the tool's "85=" between

A call with anything before the "?" ("7?") is malformed: the tool answers "?=" and the model has one more turn.
The reward is arithmetic_exact on the last model turn. `tool_calls` counts calls; a negative weight on it is a
cost per call. The tool's text has no spaces: the tokenizer transformers loads from the saved tiny model
(Qwen2Tokenizer, byte-level) drops them, so " 85=" would reach the trained model as "85=".

Warm start: rlcore.tasks.tiny's (addition, then the forget-the-carry habit: greedy 17% on held-out problems), then
TOOL_STEPS more steps on the same habit mixture plus COPY_ROWS tool-route sequences per step. Those carry loss
on the "?" and on the copied answer and EOS, none on the problem or the tool's text (an interleaved mask). The
copy gets full weight on every tool row, so the model learns to read the tool well; the "?" gets a weight
that makes the call TOOL_SHARE of the first-token targets. The start then calls the tool on about one sample
in ten and copies its answer (98% right), but greedily answers directly, with the habit: RL has two routes.
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

from rlcore.algorithms.sft import sft_loss
from rlcore.rewards import arithmetic_exact
from rlcore.rollout.env import Env, Step
from rlcore.tasks import tiny
from rlcore.tasks import encode_segments, play
from rlcore.tasks.tiny import cache_dir, carries, prepare_cached, sample_problem, sloppy_answer

VERSION = f"calculator-v1-{tiny.VERSION}"  # bump when anything below (or rlcore.tasks.tiny) changes the build
SEED = 0
MAX_TURNS = 2  # a call and an answer
TOOL_STEPS = 600  # optimizer steps after tiny's warm start, habit mixture + tool route
BATCH = 32  # habit problems per step (as rlcore.tasks.tiny)
COPY_ROWS = 32  # tool-route rows per step
TOOL_SHARE = 0.1  # the call's share of the first-token probability the warm start aims at
LR = 1e-3  # AdamW learning rate of the tool phase, decaying 10x linearly


def model_dir() -> Path:
    return cache_dir() / VERSION / "model"


def train_file() -> Path:
    return cache_dir() / VERSION / "train.jsonl"


def eval_file() -> Path:
    return cache_dir() / VERSION / "eval.jsonl"


def operands(prompt: str) -> tuple[int, int]:
    a, b = prompt.rstrip("=").split("+")
    return int(a), int(b)


class CalculatorEnv(Env):
    """One problem; the tool reads its operands from the row's prompt."""

    max_turns = MAX_TURNS
    stop = ("?",)

    def __init__(self, row: dict):
        self.sum = sum(operands(row["prompt"]))
        self.calls = 0

    def step(self, action: str, action_ids: list[int]) -> Step:
        if not action.endswith("?"):
            return Step(done=True)  # an answer (ended by EOS): scored by the reward function
        self.calls += 1
        return Step(f"{self.sum}=" if action == "?" else "?=")


def tool_calls(prompts: list[str], completions: list[str], turns: list[list[str]], **_) -> list[float]:
    """The number of tool calls in each trajectory (model turns ending in "?"); weigh it negatively as a cost."""
    return [float(sum(t.endswith("?") for t in ts)) for ts in turns]


# ---- warm start -------------------------------------------------------------------------------------------

def tool_route(a: int, b: int, call_weight: float) -> list[tuple[str, float]]:
    return [(f"{a}+{b}=", 0.0), ("?", call_weight), (f"{a + b}=", 0.0), (f"{a + b}<eos>", 1.0)]


def tool_phase(model, tokenizer, seed: int = SEED) -> list[float]:
    """TOOL_STEPS on tiny's habit mixture plus COPY_ROWS tool-route rows per step. The call weight w gives the
    "?" a TOOL_SHARE of the first-token targets: COPY_ROWS * w / (BATCH + COPY_ROWS * w) = TOOL_SHARE."""
    rng = random.Random(seed + 100)
    w = TOOL_SHARE * BATCH / (COPY_ROWS * (1 - TOOL_SHARE))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses = []
    model.train()
    for step in range(TOOL_STEPS):
        rows = []
        for _ in range(BATCH):
            a, b = sample_problem(rng, heldout=False)
            right, sloppy = str(a + b), sloppy_answer(a, b)
            answers = [(right, 1 - tiny.SLOPPY), (sloppy, tiny.SLOPPY)] if sloppy != right else [(right, 1.0)]
            rows += [[(f"{a}+{b}=", 0.0), (ans + "<eos>", weight)] for ans, weight in answers]
        rows += [tool_route(*sample_problem(rng, heldout=False), w) for _ in range(COPY_ROWS)]
        for group in opt.param_groups:
            group["lr"] = LR * (1 - 0.9 * step / TOOL_STEPS)
        input_ids, loss_mask = encode_segments(tokenizer, rows)
        logits = model(input_ids=input_ids, attention_mask=input_ids != tokenizer.pad_token_id).logits
        loss, _ = sft_loss(logits, input_ids, loss_mask)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses


# ---- measures -------------------------------------------------------------------------------------------------

def evaluate(model, tokenizer, rows: list[dict], samples: int = 0, seed: int = 0) -> dict:
    """Greedy accuracy and tool-call rate on rows, each also on the problems with and without a carry; with
    samples > 0 the same at temperature 1 over `samples` draws per row, and how often a call ended right."""
    def measure(rows, prefix, **kw):
        trajs = play(model, tokenizer, rows, CalculatorEnv, max_new_tokens=5, max_total_tokens=16, **kw)
        right = arithmetic_exact([], [t.turns[-1] for t in trajs], [r["answer"] for r in rows])
        called = [t.env.calls > 0 for t in trajs]
        carry = [carries(*operands(r["prompt"])) for r in rows]
        out = {f"{prefix}accuracy": sum(right) / len(rows)}
        for name, keep in (("carry", True), ("no_carry", False)):
            idx = [i for i, c in enumerate(carry) if c == keep]
            out[f"{prefix}calls_{name}"] = sum(called[i] for i in idx) / max(len(idx), 1)
            out[f"{prefix}accuracy_{name}"] = sum(right[i] for i in idx) / max(len(idx), 1)
        out[f"{prefix}right_when_called"] = sum(r for r, c in zip(right, called) if c) / max(sum(called), 1)
        return out

    out = measure(rows, "greedy_")
    return out | (measure(rows * samples, "sampled_", temperature=1.0, seed=seed) if samples else {})


# ---- the cache ------------------------------------------------------------------------------------------------

def build(out_dir: Path) -> dict:
    from transformers import AutoModelForCausalLM
    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same bytes on every machine, whatever its core count
    try:
        torch.manual_seed(tiny.SEED)
        model, tokenizer = AutoModelForCausalLM.from_config(tiny.tiny_config("qwen2")), tiny.build_tokenizer()
        tiny.warm_start(model, tokenizer)
        losses = tool_phase(model, tokenizer)
        eval_rows = tiny.problem_set(tiny.EVAL_SIZE, tiny.SEED + 1, heldout=True)  # rlcore.tasks.tiny's held-out set
        measured = evaluate(model, tokenizer, eval_rows, samples=8)
    finally:
        torch.set_num_threads(threads)
    tiny._save(model, out_dir / "model")
    for name, rows in (("train.jsonl", tiny.problem_set(tiny.TRAIN_SIZE, tiny.SEED + 2, heldout=False)),
                       ("eval.jsonl", eval_rows)):
        (out_dir / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = {"version": VERSION, "tool_phase_steps": TOOL_STEPS, "final_loss": losses[-1],
            **{k: round(v, 4) for k, v in measured.items()}, "build_seconds": round(time.perf_counter() - t0, 1)}
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def prepare(cfg=None) -> None:
    """Build the cache once (`cfg`, the run's Config from the prepare hook, is unused)."""
    prepare_cached(VERSION, build)


if __name__ == "__main__":
    prepare()
    meta = json.loads((cache_dir() / VERSION / "meta.json").read_text())
    print(f"model: {model_dir()}\ntrain: {train_file()}\neval:  {eval_file()}")
    print("warm start: " + ", ".join(f"{k} {v}" for k, v in meta.items() if k != "version"))
