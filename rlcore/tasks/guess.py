"""Guess the digit: a game an environment plays with the model, over up to 4 turns.

    python -m rlcore.tasks.guess     # build once into $RLCORE_CACHE/guess-v1; prints the warm start's numbers

A hidden secret 0-9 sits in the dataset row; the prompt is the fixed "?", so the task exists only through
interaction. Each turn the model writes one token (max_new_tokens=1, no stop tokens) and the environment
answers "+" (the secret is higher), "-" (lower), "=" (hit: reward 1, done) or "?" (not a digit: a wasted
turn). One game, secret 6:

    <bos> ?  5  +  8  -  6            model turns 5, 8, 6; environment turns +, -; the final "=" is not appended

Baselines over 4 turns: uniform random guessing 34%, random but consistent with the feedback 76%, bisection
100% (a 4-level tree of guesses covers 15 >= 10 secrets).

Warm start: an SFT on uniform-random games (guesses independent of the feedback, loss on the guesses only).
It teaches the format and nothing about the secret: sampled success starts at 37% (uniform: 34%), and the
greedy policy repeats one digit whatever the feedback ("3333": 10%), since the near-uniform logits tie-break
the same way at every turn. RL has to learn to use "+" and "-". A start on random-but-consistent games would
already use the feedback (76% sampled) and leave less to learn.

The measure: greedy success over all ten secrets (eval.jsonl holds one row per secret). Why 0-9 is an honest
held-out measure although RL plays the same secrets: the model never sees the secret, only its own guesses
and the feedback, so a policy is a decision tree over feedback histories and nothing can be memorised per
row. Greedy success over the ten secrets is then exactly the greedy policy's success on the task's secret
distribution, which a held-out sample would only estimate. (The 0-99 variant would make a held-out split of
secrets arbitrary in the same way, and costs 7 turns of two tokens.)
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

from rlcore.algorithms.sft import sft_loss
from rlcore.rollout.env import Env, Step
from rlcore.tasks import encode_segments, play
from rlcore.tasks.tiny import _save, build_tokenizer, cache_dir, prepare_cached, tiny_config

VERSION = "guess-v1"  # bump when anything below changes what gets built
SEED = 0
MAX_TURNS = 4  # guesses per game
HIT_REWARD = 1.0  # reward of a hit
SFT_STEPS = 150  # warm-start optimizer steps on uniform-random games
BATCH = 64  # games per warm-start step
LR = 1e-3  # warm-start AdamW learning rate (constant)
TRAIN_SIZE = 1000  # rows of train.jsonl (secrets drawn uniformly)


def model_dir() -> Path:
    return cache_dir() / VERSION / "model"


def train_file() -> Path:
    return cache_dir() / VERSION / "train.jsonl"


def eval_file() -> Path:
    return cache_dir() / VERSION / "eval.jsonl"


class GuessEnv(Env):
    """One game: the secret comes from the dataset row."""

    max_turns = MAX_TURNS

    def __init__(self, row: dict):
        self.secret = int(row["secret"])
        self.guesses: list[int | None] = []  # None for an action that was not one digit

    def step(self, action: str, action_ids: list[int]) -> Step:
        # One digit, one token: EOS and the model's unused ids decode to "" and count as non-digits.
        guess = int(action) if len(action_ids) == 1 and len(action) == 1 and action.isdigit() else None
        self.guesses.append(guess)
        if guess is None:
            return Step("?")
        if guess == self.secret:
            return Step("=", reward=HIT_REWARD, done=True)
        return Step("+" if guess < self.secret else "-")

    @property
    def solved(self) -> bool:
        return self.secret in self.guesses


# ---- warm start -------------------------------------------------------------------------------------------

def random_game(rng: random.Random) -> list[tuple[str, float]]:
    """A uniform-random game as SFT segments: guesses carry loss, the prompt and the feedback do not."""
    secret, segments = rng.randrange(10), [("?", 0.0)]
    for _ in range(MAX_TURNS):
        guess = rng.randrange(10)
        segments.append((str(guess), 1.0))
        if guess == secret:
            break
        segments.append(("+" if guess < secret else "-", 0.0))
    if segments[-1][1] == 0.0:
        segments.pop()  # a game ends on the model's last guess
    return segments


def warm_start(model, tokenizer, seed: int = SEED) -> list[float]:
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses = []
    model.train()
    for _ in range(SFT_STEPS):
        input_ids, loss_mask = encode_segments(tokenizer, [random_game(rng) for _ in range(BATCH)])
        logits = model(input_ids=input_ids, attention_mask=input_ids != tokenizer.pad_token_id).logits
        loss, _ = sft_loss(logits, input_ids, loss_mask)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses


# ---- measures -------------------------------------------------------------------------------------------------

def evaluate(model, tokenizer, samples: int = 0, seed: int = 0) -> dict:
    """Greedy: success over the ten secrets, mean guesses of the hits, the first guess and each secret's
    guesses. With samples > 0 also the sampled success over `samples` games per secret (temperature 1)."""
    rows = [{"prompt": "?", "secret": s} for s in range(10)]
    kw = dict(max_new_tokens=1, max_total_tokens=2 * MAX_TURNS)
    greedy = play(model, tokenizer, rows, GuessEnv, **kw)
    hits = [t for t in greedy if t.env.solved]
    out = {"greedy_success": len(hits) / 10, "greedy_guesses": sum(len(t.turns) for t in hits) / max(len(hits), 1),
           "first_guess": greedy[0].turns[0], "games": {t.env.secret: "".join(t.turns) for t in greedy}}
    if samples:
        sampled = play(model, tokenizer, rows * samples, GuessEnv, temperature=1.0, seed=seed, **kw)
        out["sampled_success"] = sum(t.env.solved for t in sampled) / len(sampled)
    return out


# ---- the cache ------------------------------------------------------------------------------------------------

def build(out_dir: Path) -> dict:
    from transformers import AutoModelForCausalLM
    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same bytes on every machine, whatever its core count
    try:
        torch.manual_seed(SEED)
        model, tokenizer = AutoModelForCausalLM.from_config(tiny_config("qwen2")), build_tokenizer()
        losses = warm_start(model, tokenizer)
        measured = evaluate(model, tokenizer, samples=50)
    finally:
        torch.set_num_threads(threads)
    _save(model, out_dir / "model")
    rng = random.Random(SEED + 1)
    train = [{"prompt": "?", "secret": rng.randrange(10)} for _ in range(TRAIN_SIZE)]
    for name, rows in (("train.jsonl", train), ("eval.jsonl", [{"prompt": "?", "secret": s} for s in range(10)])):
        (out_dir / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = {"version": VERSION, "warm_start_steps": SFT_STEPS, "final_loss": losses[-1],
            **measured, "build_seconds": round(time.perf_counter() - t0, 1)}
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def prepare(cfg=None) -> None:
    """Build the cache once (`cfg`, the run's Config from the prepare hook, is unused)."""
    prepare_cached(VERSION, build)


if __name__ == "__main__":
    prepare()
    meta = json.loads((cache_dir() / VERSION / "meta.json").read_text())
    print(f"model: {model_dir()}\ntrain: {train_file()}\neval:  {eval_file()}")
    print(f"warm start: {meta['warm_start_steps']} steps, greedy success {meta['greedy_success']:.0%} "
          f"(games {meta['games']}), sampled {meta['sampled_success']:.1%} (built in {meta['build_seconds']} s)")
