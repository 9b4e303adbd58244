"""Addition with a native tool call: the demo's problems asked as a chat, with an `add` tool in the Hermes format.

    python -m rlcore.tasks.tooladd    # build once into $RLCORE_CACHE/tooladd-v2; prints the warm start

The prompt is rlcore.tasks.tiny's Hermes chat template rendered with tools=: the system turn shows add's JSON schema,
the user turn is the problem ("47+38="). The model answers directly ("85<|im_end|>") or calls the tool:

    <tool_call>\\n{"name": "add", "arguments": {"a": 47, "b": 38}}\\n</tool_call><|im_end|>     model
    \\n<|im_start|>user\\n<tool_response>\\n85\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n  tool
    85<|im_end|>                                                                                model

The reward is arithmetic_exact on the last model turn; ToolEnv.stats count the calls.

Tokens: a pure character tokenizer makes the prompt 550 tokens (the schema line alone is 300 characters), and
rlcore.tasks.tiny's model has 64 positions (this task's, 96). Like BPE merges of frequent strings, the task's
tokenizer adds one token per fixed line of the rendered conversation (the template's text, the schema, role
headers, the call's JSON around its numbers), found by rendering a tool conversation: the prompt becomes 28
tokens and a whole tool-route conversation 55. Numbers and the problem stay character by character.

Warm start (one SFT from random init, like rlcore.tasks.tiny's and calculator.py's combined): LEARN_STEPS on right
answers, then HABIT_STEPS on the correct / forgot-the-carry mixture (rlcore.tasks.tiny.SLOPPY), each step with
COPY_ROWS tool-route rows besides. Those carry loss on the call and on the copied answer, none on the prompt or
the tool's text; the <tool_call> token gets a weight that makes the call TOOL_SHARE of the first-token targets.
The start calls the tool on 7% of samples and copies its answer (100% right when it calls), but greedily answers
directly, with the habit (23.4% held-out): RL has two routes to the right answer. It builds in ~90 s.
"""
from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import torch

from rlcore.algorithms.sft import sft_loss
from rlcore.rewards import arithmetic_exact
from rlcore.rollout.tools import Toolbox, ToolEnv
from rlcore.tasks import tiny
from rlcore.tasks import encode_segments, play
from rlcore.tasks.tiny import cache_dir, carries, prepare_cached, sample_problem, sloppy_answer

VERSION = "tooladd-v2"  # bump when anything below (or rlcore.tasks.tiny's problems) changes the build
SEED = 0
VOCAB_SIZE = 128  # the chat tokenizer's 106 ids and the folded lines, padded up
POSITIONS = 96  # max_position_embeddings: a tool-route conversation is 55 tokens
MAX_NEW_TOKENS = 16  # per turn: a call is 11 tokens, an answer 3-4
MAX_TOTAL_TOKENS = 32  # after the prompt: call, tool answer (12) and answer
LEARN_STEPS = 400  # optimizer steps on right answers (and tool routes)
HABIT_STEPS = 300  # then on the right / forgot-the-carry mixture, learning rate decaying 10x
BATCH = 32  # direct-answer problems per step
COPY_ROWS = 16  # tool-route rows per step
TOOL_SHARE = 0.1  # the call's share of the first-token probability the warm start aims at
LR = 1e-3  # AdamW peak learning rate


def model_dir() -> Path:
    return cache_dir() / VERSION / "model"


def train_file() -> Path:
    return cache_dir() / VERSION / "train.jsonl"


def eval_file() -> Path:
    return cache_dir() / VERSION / "eval.jsonl"


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


class AddEnv(ToolEnv):
    """A call, then an answer. The recipe declares its own `add` (with latency) under the same schema."""
    toolbox = Toolbox([add], format="hermes")
    max_turns = 2


# ---- tokenizer and model --------------------------------------------------------------------------------

def conversation(a: int, b: int, call: bool) -> list[dict]:
    """A solved problem as chat messages: the tool route, or the direct answer."""
    user = {"role": "user", "content": f"{a}+{b}="}
    if not call:
        return [user, {"role": "assistant", "content": str(a + b)}]
    return [user, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}]},
        {"role": "tool", "name": "add", "content": str(a + b)}, {"role": "assistant", "content": str(a + b)}]


def folded_lines(tokenizer, schemas: list[dict]) -> list[str]:
    """The fixed lines (longer than one character) of a rendered tool conversation: its text between the
    special tokens, the tags and the numbers, cut after each newline, in order of appearance."""
    text = tokenizer.apply_chat_template(conversation(47, 38, call=True), tools=schemas, tokenize=False)
    pieces = re.split(r"<\|im_start\|>|<\|im_end\|>|</?tool_call>|\d+", text)
    lines = [line for piece in pieces for line in piece.splitlines(keepends=True) if len(line) > 1]
    return list(dict.fromkeys(lines))


def build_tokenizer():
    """rlcore.tasks.tiny's chat tokenizer (characters, ChatML specials, tool-call tags, the Hermes template) plus
    one token per fixed line of the task's conversation."""
    tok = tiny.build_chat_tokenizer()
    tok.add_tokens(folded_lines(tok, AddEnv.toolbox.schemas))
    return tok


def model_config(tokenizer):
    config = tiny.tiny_config("qwen2")
    config.vocab_size, config.max_position_embeddings = VOCAB_SIZE, POSITIONS
    config.bos_token_id, config.eos_token_id, config.pad_token_id = None, tokenizer.eos_token_id, tokenizer.pad_token_id
    return config


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    """The prompt as rlcore.data renders it (data.chat_template=true, the environment's tools)."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tools=AddEnv.toolbox.schemas,
                                        add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


# ---- warm start -------------------------------------------------------------------------------------------

def segments(tokenizer, a: int, b: int, call: bool, answer: str, call_weight: float = 1.0,
             weight: float = 1.0) -> list[tuple[str, float]]:
    """A conversation as SFT segments: the model's tokens (the call, the answer, their <|im_end|>) carry loss;
    the prompt and the tool's answer do not. The "\\n" the template writes after a model's <|im_end|> opens the
    next segment, as in a rollout (rlcore.rollout.chat)."""
    conv = conversation(a, b, call)
    text = tokenizer.apply_chat_template(conv, tools=AddEnv.toolbox.schemas, tokenize=False)
    prompt, rest = text.split("<|im_start|>assistant\n", 1)
    rows = [(prompt + "<|im_start|>assistant\n", 0.0)]
    if call:
        turn, rest = rest.split("<|im_end|>", 1)
        obs, _ = rest.rsplit("<|im_start|>assistant\n", 1)
        rows += [("<tool_call>", call_weight), (turn.removeprefix("<tool_call>") + "<|im_end|>", 1.0),
                 (obs + "<|im_start|>assistant\n", 0.0)]
    return rows + [(answer + "<|im_end|>", weight)]


def warm_start(model, tokenizer, seed: int = SEED) -> list[float]:
    """LEARN_STEPS, then HABIT_STEPS with the sloppy habit; COPY_ROWS tool routes in every step. The call
    weight w gives <tool_call> TOOL_SHARE of the first-token targets: COPY_ROWS * w / (BATCH + COPY_ROWS * w)."""
    rng = random.Random(seed)
    w = TOOL_SHARE * BATCH / (COPY_ROWS * (1 - TOOL_SHARE))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses = []
    model.train()
    for step in range(LEARN_STEPS + HABIT_STEPS):
        habit = step >= LEARN_STEPS
        rows = []
        for _ in range(BATCH):
            a, b = sample_problem(rng, heldout=False)
            right, sloppy = str(a + b), sloppy_answer(a, b)
            mix = [(right, 1 - tiny.SLOPPY), (sloppy, tiny.SLOPPY)] if habit and sloppy != right else [(right, 1.0)]
            rows += [segments(tokenizer, a, b, False, ans, weight=weight) for ans, weight in mix]
        for _ in range(COPY_ROWS):
            a, b = sample_problem(rng, heldout=False)
            rows.append(segments(tokenizer, a, b, True, str(a + b), call_weight=w))
        if habit:
            for group in opt.param_groups:
                group["lr"] = LR * (1 - 0.9 * (step - LEARN_STEPS) / HABIT_STEPS)
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
    """Greedy accuracy and tool-call rate on rows, and how often a call ended right; with samples > 0 the same
    at temperature 1 over `samples` draws per row."""
    def measure(rows, prefix, **kw):
        trajs = play(model, tokenizer, rows, AddEnv, max_new_tokens=MAX_NEW_TOKENS,
                     max_total_tokens=MAX_TOTAL_TOKENS, encode_prompt=lambda p: prompt_ids(tokenizer, p), **kw)
        right = arithmetic_exact([], [t.turns[-1] for t in trajs], [r["answer"] for r in rows])
        called = [t.env.stats.calls > 0 for t in trajs]
        carry = [carries(*map(int, r["prompt"].rstrip("=").split("+"))) for r in rows]
        out = {f"{prefix}accuracy": sum(right) / len(rows), f"{prefix}calls": sum(called) / len(rows),
               f"{prefix}right_when_called": sum(r for r, c in zip(right, called) if c) / max(sum(called), 1),
               f"{prefix}bad_calls": sum(t.env.stats.bad for t in trajs) / len(rows)}
        idx = [i for i, c in enumerate(carry) if not c]
        out[f"{prefix}accuracy_no_carry"] = sum(right[i] for i in idx) / max(len(idx), 1)
        return out

    out = measure(rows, "greedy_")
    return out | (measure(rows * samples, "sampled_", temperature=1.0, seed=seed) if samples else {})


# ---- the cache ------------------------------------------------------------------------------------------------

def save(model, tokenizer, out_dir: Path) -> None:
    from transformers import GenerationConfig
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)  # with chat_template.jinja
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(out_dir)


def build(out_dir: Path) -> dict:
    from transformers import AutoModelForCausalLM
    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same bytes on every machine, whatever its core count
    try:
        torch.manual_seed(SEED)
        tokenizer = build_tokenizer()
        model = AutoModelForCausalLM.from_config(model_config(tokenizer))
        losses = warm_start(model, tokenizer)
        eval_rows = tiny.problem_set(tiny.EVAL_SIZE, tiny.SEED + 1, heldout=True)  # rlcore.tasks.tiny's held-out set
        measured = evaluate(model, tokenizer, eval_rows, samples=2)
    finally:
        torch.set_num_threads(threads)
    save(model, tokenizer, out_dir / "model")
    for name, rows in (("train.jsonl", tiny.problem_set(tiny.TRAIN_SIZE, tiny.SEED + 2, heldout=False)),
                       ("eval.jsonl", eval_rows)):
        (out_dir / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = {"version": VERSION, "warm_start_steps": LEARN_STEPS + HABIT_STEPS, "final_loss": losses[-1],
            **{k: round(v, 4) for k, v in measured.items()}, "build_seconds": round(time.perf_counter() - t0, 1)}
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def prepare(cfg=None) -> None:
    """Build the cache once; with the run's Config, check that its environment shows the model the tools
    the warm start was trained with (they are in every prompt)."""
    if cfg is not None and cfg.rollout.env:
        from rlcore.rewards import resolve
        from rlcore.rollout.tools import declared_tools
        box = declared_tools(resolve(cfg.rollout.env, "rollout.env"))
        if box is None or box.schemas != AddEnv.toolbox.schemas:
            raise ValueError("rollout.env: the tooladd warm start was trained with the tool schema of "
                             "rlcore.tasks.tooladd.add in every prompt; declare a Toolbox with the same "
                             "signature and docstring (add(a: int, b: int) -> int, 'Add two integers.')")
    prepare_cached(VERSION, build)


COLUMNS = "tooladd-columns-v1"  # the files below; bump when they change


def columns_file(name: str) -> Path:
    """train.jsonl or eval.jsonl with each problem in columns `a` and `b` and an empty prompt (prepare_columns)."""
    return cache_dir() / COLUMNS / name


def prepare_columns(cfg=None) -> None:
    """prepare(cfg), then the task's files for an environment that writes the problem into the prompt itself
    (recipes/trl_tooladd.py): {"prompt": "", "a": 47, "b": 38, "answer": "85"} for {"prompt": "47+38=", ...}."""
    prepare(cfg)

    def build(out_dir: Path) -> None:
        for name, source in (("train.jsonl", train_file()), ("eval.jsonl", eval_file())):
            rows = [json.loads(line) for line in source.read_text().splitlines()]
            split = [r["prompt"].removesuffix("=").split("+") for r in rows]
            (out_dir / name).write_text("".join(json.dumps({"prompt": "", "a": int(a), "b": int(b),
                                                            "answer": r["answer"]}) + "\n"
                                                for r, (a, b) in zip(rows, split)))
        (out_dir / "meta.json").write_text(json.dumps({"version": COLUMNS, "from": VERSION}) + "\n")

    prepare_cached(COLUMNS, build)


if __name__ == "__main__":
    prepare()
    meta = json.loads((cache_dir() / VERSION / "meta.json").read_text())
    print(f"model: {model_dir()}\ntrain: {train_file()}\neval:  {eval_file()}")
    print("warm start: " + ", ".join(f"{k} {v}" for k, v in meta.items() if k != "version"))
