"""Tiny multi-turn tasks for the 0.3M character model of rlcore.tasks.tiny, built locally like the demo.

    guess.py       a game: find a hidden digit from higher / lower feedback in at most 4 guesses
    calculator.py  a tool: the demo's addition problems, with a calculator the model may call
    tooladd.py     a native tool call: the same problems as a chat, an `add` tool in the Hermes format

Each task module holds its environment, its data files, its warm start (a short SFT that teaches the format
and leaves headroom for RL), a cached atomic `prepare(cfg=None)` and a greedy evaluator. This file holds what
they share: the SFT encoding of multi-turn sequences (an interleaved loss mask), a multi-turn rollout on the
HF model (to check a warm start without vLLM, and to measure an exported model). Both cache their builds
with rlcore.tasks.tiny.prepare_cached.

The HF rollout follows the ending rule of rlcore.rollout.turns: a turn ends at EOS, at one of the env's stop
tokens or at its cap (max_new_tokens, or less where the token budget is nearly spent); a turn cut by its cap
while the env declares stop tokens (or by the budget) is an incomplete action: the trajectory ends without
stepping the env. Otherwise the env is stepped, and the trajectory ends on `done`, on the turn limit, or when
the observation would leave no room for one more model token (it is dropped). It ends on a model token.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rlcore.rollout.env import Step



def encode_segments(tokenizer, rows: list[list[tuple[str, float]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-turn SFT sequences: each row a list of (text, weight) segments after <bos> (if the tokenizer has one;
    special tokens written in the text, e.g. ChatML's, are encoded as such); a weight is the loss
    on that segment's tokens (0 for prompt and environment text). Returns input_ids [B, L] padded right and
    loss_mask [B, L - 1] (position t scores token t + 1). The tool route of calculator.py:

        [("47+38=", 0), ("?", 1), ("85=", 0), ("85<eos>", 1)]   (a final "<eos>" is the EOS token)
        tokens     <bos> 4 7 + 3 8 = ? 8 5 = 8 5 <eos>
        loss_mask       0 0 0 0 0 0 1 0 0 0 1 1 1
    """
    seqs, masks = [], []
    for segments in rows:
        ids = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
        weights = [0.0] * len(ids)  # per token; the mask is weights[1:]
        for text, weight in segments:
            eos = text.endswith("<eos>")
            seg = tokenizer(text.removesuffix("<eos>"), add_special_tokens=False).input_ids
            seg += [tokenizer.eos_token_id] if eos else []
            ids += seg
            weights += [weight] * len(seg)
        seqs.append(ids)
        masks.append(weights[1:])
    L = max(len(s) for s in seqs)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([s + [pad] * (L - len(s)) for s in seqs])  # [B, L]
    loss_mask = torch.tensor([m + [0.0] * (L - 1 - len(m)) for m in masks])  # [B, L - 1]
    return input_ids, loss_mask


@dataclass
class Trajectory:
    env: Any
    ids: list[int]  # prompt, then model and environment tokens
    turns: list[str] = field(default_factory=list)  # each model turn's text (special tokens dropped)
    reward: float = 0.0  # summed env step rewards
    truncated: bool = False  # ended by a limit (turns, tokens, an incomplete action), not by `done`
    done: bool = False


@torch.no_grad()
def play(model, tokenizer, rows: list[dict], make_env: Callable[[dict], Any], max_new_tokens: int,
         max_total_tokens: int, max_turns: int = 0, temperature: float = 0.0, seed: int = 0,
         prompt_column: str = "prompt", encode_prompt: Callable[[str], list[int]] | None = None) -> list[Trajectory]:
    """One multi-turn trajectory per row on the HF model, all rows decoded together one token at a time
    (greedy at temperature 0). Sequences here are a few dozen tokens: no KV cache is needed. `encode_prompt`
    turns a prompt into ids (default: the tokenizer's plain encoding; a chat task renders its template)."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    trajs, starts = [], []  # starts: where the response (reset() tokens included) begins
    for row in rows:
        env = make_env(row)
        extra = env.reset() if hasattr(env, "reset") else None
        ids = encode_prompt(row[prompt_column]) if encode_prompt else tokenizer(row[prompt_column]).input_ids
        starts.append(len(ids))
        trajs.append(Trajectory(env, ids + (encode_obs(tokenizer, extra) if extra else [])))
    stops = {tokenizer.convert_tokens_to_ids(s) for s in getattr(trajs[0].env, "stop", ())}
    limit = min(t for t in (getattr(trajs[0].env, "max_turns", 0), max_turns) if t > 0)
    turn = [[] for _ in trajs]  # this turn's sampled tokens
    while active := [i for i, t in enumerate(trajs) if not t.done]:
        L = max(len(trajs[i].ids) for i in active)
        input_ids = torch.tensor([[pad] * (L - len(trajs[i].ids)) + trajs[i].ids for i in active])  # [A, L]
        attn = (torch.arange(L) >= torch.tensor([L - len(trajs[i].ids) for i in active])[:, None]).long()
        logits = model(input_ids=input_ids, attention_mask=attn,
                       position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits[:, -1].float()  # [A, V]
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen).squeeze(-1)
        for i, tok in zip(active, nxt.tolist()):
            t = trajs[i]
            cap = min(max_new_tokens, max_total_tokens - (len(t.ids) - starts[i] - len(turn[i])))
            t.ids.append(tok)
            turn[i].append(tok)
            if not (tok == eos or tok in stops or len(turn[i]) == cap):
                continue
            action, turn[i] = turn[i], []
            t.turns.append(tokenizer.decode(action, skip_special_tokens=True))
            if tok != eos and tok not in stops and (stops or cap < max_new_tokens):
                t.done = t.truncated = True  # an incomplete action: never shown to the environment
                continue
            step = t.env.step(t.turns[-1], list(action))
            step = Step(*step) if isinstance(step, tuple) else step
            t.reward += step.reward
            obs = encode_obs(tokenizer, step.observation) if step.observation else []
            t.done = step.done or len(t.turns) >= limit or len(t.ids) - starts[i] + len(obs) >= max_total_tokens
            t.truncated = t.done and not step.done
            if not t.done:
                t.ids += obs
    return trajs


def encode_obs(tokenizer, obs) -> list[int]:
    """An observation's ids, as rlcore.rollout.collect encodes them: ids as given, text, or chat messages."""
    if isinstance(obs, str):
        return tokenizer(obs, add_special_tokens=False).input_ids
    if obs and isinstance(obs[0], dict):
        from rlcore.rollout.chat import observation_ids
        return observation_ids(tokenizer, obs)
    return list(obs)
