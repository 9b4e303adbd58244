"""The algorithm contract: what the trainer asks of the object a recipe puts in `cfg.algorithm`.

rlcore keeps no registry: a recipe imports its algorithm and sets `cfg.algorithm = GRPO(...)`, and the core
only ever talks to this contract. To write one, subclass `Algorithm` (or rlcore.algorithms.objectives.PolicyLoss, which
already is one and brings the clipped policy loss, its aggregation, KL term and mismatch corrections) and
implement `advantages`; every other hook has the default written here. `check` runs in preflight, so a
missing piece is one error line before anything loads.

When the trainer calls each hook, per step:
    validate(cfg)                       once, at preflight
    advantages(batch, reduce)           after the logprobs stage: old / ref logprobs and values are in `batch`
    returns(batch, reduce)              beside advantages, only with needs_critic: the critic's targets
    loss(batch, logprobs, norm)         per micro-batch of the update
    value_loss(batch, values, norm)     per micro-batch, only with needs_critic

To add a hook: give it a default and a docstring here (when it is called, what it returns), add it to
`CONTRACT` if an algorithm must provide it, and call it from the one stage that needs it.
"""
from __future__ import annotations

from typing import Callable

import torch


class Algorithm:
    """Base of every algorithm: the flags the trainer reads, with their defaults, and the hooks it calls."""

    # Build a critic (cfg.critic), fill batch.values, and call `returns` and `value_loss` (PPO).
    needs_critic: bool = False
    # Build the frozen reference model and fill batch.ref_logprobs (a KL term or penalty).
    needs_reference: bool = False
    # `advantages` reads batch.old_logprobs, so even an on-policy step computes them in a separate pass first.
    advantages_use_old_logprobs: bool = False
    # Extra rounds of drawing prompts to replace groups whose rewards are all equal (DAPO); 0 = off.
    dynamic_sampling: int = 0
    # The loss corrects for samples drawn by another policy than pi_old (rollout.max_staleness needs it).
    corrects_off_policy: bool = False
    # A frozen teacher's folder (on-policy distillation): it is built in the reference model's place, so
    # batch.ref_logprobs are its logprobs; it must share the policy's tokenizer. "" = the reference (if any)
    # is the policy's starting weights.
    teacher: str = ""

    def validate(self, cfg) -> None:
        """Raise ValueError naming the first bad field of `cfg` (a rlcore.config.Config) or of self."""

    def advantages(self, batch, reduce: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, dict]:
        """(advantages [B, T], 0 off batch.loss_mask; metrics {name: float}). `reduce(t)` sums a tensor over
        ranks (rlcore.algorithms.objectives.no_reduce in one process), for statistics of the global batch."""
        raise NotImplementedError

    def returns(self, batch, reduce: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The critic's regression targets [B, T] (only called with needs_critic)."""
        raise NotImplementedError

    def loss(self, batch, logprobs: torch.Tensor, norm) -> tuple[torch.Tensor, dict]:
        """This micro-batch's loss contribution and detached metrics; `logprobs` [B, T] carry the gradient,
        `norm` (rlcore.batch.Normaliser) holds the step's global token and sequence counts."""
        raise NotImplementedError

    def value_loss(self, batch, values: torch.Tensor, norm) -> tuple[torch.Tensor, dict]:
        """The critic's loss contribution for this micro-batch (only called with needs_critic)."""
        raise NotImplementedError


# (name, what it must be): a flag's type; "method" (the default may stay), "hook" (the algorithm must write
# it), "critic hook" (must write it when needs_critic).
CONTRACT = (("needs_critic", bool), ("needs_reference", bool), ("advantages_use_old_logprobs", bool),
            ("dynamic_sampling", int), ("corrects_off_policy", bool), ("teacher", str),
            ("validate", "method"), ("advantages", "hook"), ("loss", "hook"),
            ("returns", "critic hook"), ("value_loss", "critic hook"))


def check(algorithm) -> None:
    """Raise ValueError, one line naming the missing or malformed piece, if `algorithm` breaks the contract.

    Example: an object with `advantages` and `loss` but no flags fails on `needs_critic`, and the message points
    at this base class, whose defaults fill every flag."""
    if algorithm is None:
        raise ValueError("algorithm is not set: the recipe must set cfg.algorithm (e.g. GRPO())")
    name = type(algorithm).__qualname__
    for key, kind in CONTRACT:
        if kind == "critic hook" and not getattr(algorithm, "needs_critic", False):
            continue
        if not hasattr(algorithm, key):
            raise ValueError(f"algorithm {name} has no {key}: subclass rlcore.algorithms.base.Algorithm, which "
                             f"documents every hook and gives each flag its default")
        value = getattr(algorithm, key)
        if isinstance(kind, type):
            if not isinstance(value, kind) or kind is int and isinstance(value, bool):
                what = {int: "an integer", bool: "true or false", str: "a string"}[kind]
                raise ValueError(f"algorithm {name}: {key} must be {what} (got {value!r})")
        elif not callable(value) or kind != "method" and getattr(type(algorithm), key, None) is getattr(Algorithm, key):
            raise ValueError(f"algorithm {name} does not implement {key}(): see its docstring in "
                             f"rlcore.algorithms.base.Algorithm")
