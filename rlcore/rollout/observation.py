"""Observations to token ids, for any content: what an environment answers is bounded and always encodable.

During RL the model writes what environments echo back (a tool name, its arguments, a program's output), so
an observation may hold anything the model can make: megabytes of text, or lone surrogates (the JSON escape
"\\ud800" decodes to one; the tokenizer raises TypeError on them). Before anything is encoded, every string of
an observation (text, or each string of each chat message) is cleaned (lone surrogates -> "?") and the
whole is cut to CHARS_PER_TOKEN characters per token of the trajectory's budget; the ids are cut to the
budget too. An observation that still fits nowhere ends its trajectory, truncated, as before
(rlcore.rollout.turns). What the tokenizer or the chat template still raise on some content is `Unencodable`:
that one trajectory fails (rollout/failed_trajectories) and the run goes on. An environment that breaks
the protocol (a wrong type, ids outside the vocabulary) is a bug and stops the run, as before.

    encode = encoder(tokenizer, vocab_size=256, max_total=64)
    encode("42")                                     -> ids of "42"
    encode([{"role": "tool", "content": "\\ud800"}])   -> ids of the chat turn with content "?"
"""
from __future__ import annotations

from typing import Any, Callable

from rlcore.config.errors import describe

CHARS_PER_TOKEN = 32  # characters kept per token of budget: far more than any tokenizer's average


class Unencodable(RuntimeError):
    """This observation's content cannot be encoded (the tokenizer or the template refused it)."""


def clean(text: str) -> str:
    """Text every tokenizer takes: lone surrogates replaced by "?"."""
    return text.encode("utf-8", "replace").decode("utf-8")


def bounded(obs: Any, max_chars: int) -> Any:
    """`obs` with every string cleaned and at most `max_chars` characters of strings in all; chat messages
    past the budget are dropped (a turn cut short is still a turn, a missing one is not)."""
    left = max_chars

    def walk(value: Any, depth: int) -> Any:
        nonlocal left
        if isinstance(value, str):
            value, left = clean(value[:left]), max(left - len(value), 0)
            return value
        if depth > 8:  # chat messages are shallow; deeper content is left as the environment made it
            return value
        if isinstance(value, dict):  # a message's role is never cut: the template needs it whole
            return {k: clean(v) if k == "role" and isinstance(v, str) else walk(v, depth + 1) for k, v in value.items()}
        if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
            kept = []
            for m in value:
                if left <= 0 and kept:
                    break
                kept.append(walk(m, depth + 1))
            return kept
        if isinstance(value, list):
            return [walk(v, depth + 1) for v in value]
        return value

    return walk(obs, 0)


def encoder(tokenizer, vocab_size: int, max_total: int) -> Callable[[Any], list[int]]:
    """observation (text, token ids or chat messages) -> at most `max_total` + 1 token ids (one more than fits,
    so the loop still sees that it does not); see the module docstring."""
    max_chars = CHARS_PER_TOKEN * max_total

    def encode(obs) -> list[int]:
        if isinstance(obs, str) or obs and isinstance(obs[0], dict):
            obs = bounded(obs, max_chars)
            try:
                if isinstance(obs, str):
                    ids = tokenizer.encode(obs, add_special_tokens=False)
                else:
                    from rlcore.rollout import chat
                    ids = chat.observation_ids(tokenizer, obs)
            except Exception as e:  # this content, not the environment's protocol: the trajectory fails, not the run
                raise Unencodable(f"its observation could not be encoded ({describe(e)})") from e
        else:
            ids = [int(i) for i in obs[:max_total + 1]]
        ids = ids[:max_total + 1]
        bad = [i for i in ids if not 0 <= i < vocab_size]
        if bad:
            raise ValueError(f"observation token id {bad[0]} is outside the model's vocabulary [0, {vocab_size})")
        return ids

    return encode
