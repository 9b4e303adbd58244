"""GRPO: Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, sec. 4.1),
with the Dr.GRPO and DAPO variants as options (`dr_grpo()`, `dapo()` below give their settings).

Paper, outcome supervision (eq. 3 and sec. 4.1.2): sample G responses o_1..o_G per prompt with rewards r_i;
    A_i = (r_i - mean(r_1..r_G)) / std(r_1..r_G)                 for every token of o_i
    J = 1/G sum_i 1/|o_i| sum_t { min(ratio_it A_i, clip(ratio_it, 1 - e, 1 + e) A_i) - beta D_KL,it }
    D_KL,it = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1             (eq. 4, Schulman's k3)
with ratio_it = pi_theta(o_it) / pi_old(o_it). The loss is rlcore.algorithms.objectives.PolicyLoss.

Departures from the paper:
- Loss aggregation is configurable and defaults to "token-mean" (DAPO), not the paper's per-sequence mean
  ("seq-mean-token-mean"), which weighs tokens of short responses more.
- eps is added to the group std; std is the sample std (torch.std); the paper leaves both unsaid.
- kl_coef defaults to 0 (no reference model), as in DAPO and Dr.GRPO; the paper uses beta = 0.04.
- With one update per rollout, pi_old = pi_theta at the update, so ratio = 1 and the clip is inactive; it
  matters with train.epochs_per_step > 1 or train.mini_batches > 1.

Variants:
- Dr.GRPO (Liu et al. 2025, arXiv:2503.20783): scale_rewards=False (no division by the group std) and
  loss_agg="seq-mean-token-sum-norm" (a constant, the generation budget, replaces each response's length).
- DAPO (Yu et al. 2025, arXiv:2503.14476): clip_high=0.28 (clip-higher), token-mean, overlong reward shaping
  (a linear penalty over the last `overlong_buffer` tokens of the budget), and dynamic sampling: groups
  whose rewards are all equal (zero advantage) are dropped and more prompts drawn until the batch is full,
  for at most `dynamic_sampling` extra rounds (the rollout stage draws them: rlcore.rollout.collect.collect).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rlcore.algorithms.objectives import PolicyLoss, Reduce, group_advantages, no_reduce
from rlcore.batch import Batch


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (eq. 13): 0 up to max_len - buffer tokens, then falling linearly to
    -factor at max_len. Example, max_len 8, buffer 4: lengths [3, 4, 5, 6, 8] -> [0, 0, -0.25, -0.5, -1]."""
    over = (lengths.float() - (max_len - buffer)).clamp(min=0)  # [B] tokens into the buffer
    return -factor * (over / buffer).clamp(max=1.0)


@dataclass
class GRPO(PolicyLoss):
    """GRPO's settings (the loss fields come from PolicyLoss); a recipe sets `Config.algorithm = GRPO(...)`."""

    scale_rewards: bool = True  # divide advantages by the group's reward std (Dr.GRPO: False)
    eps: float = 1e-6  # added to the group std, reward units; keeps all-equal groups finite
    overlong_buffer: int = 0  # DAPO: tokens before the budget where the length penalty ramps in; 0 = off
    overlong_penalty: float = 1.0  # DAPO: the penalty at the full budget, reward units
    dynamic_sampling: int = 0  # DAPO: extra draw rounds allowed to replace all-equal groups; 0 = off

    def validate(self, cfg) -> None:
        """Raise ValueError naming the first bad field of `cfg` (a rlcore.config.Config) or of self."""
        super().validate(cfg)
        if cfg.rollout.group_size < 2:
            raise ValueError(f"rollout.group_size must be >= 2 for GRPO (got {cfg.rollout.group_size})")
        for name in ("eps", "overlong_buffer", "overlong_penalty", "dynamic_sampling"):
            if getattr(self, name) < 0:
                raise ValueError(f"algorithm.{name} must be >= 0 (got {getattr(self, name)})")
        if self.overlong_buffer >= cfg.rollout.max_new_tokens:
            raise ValueError(f"algorithm.overlong_buffer={self.overlong_buffer} must be < rollout.max_new_tokens="
                             f"{cfg.rollout.max_new_tokens}")

    def advantages(self, batch: Batch, reduce: Reduce = no_reduce) -> tuple[torch.Tensor, dict]:
        """[B, T]: each sequence's group advantage on its response tokens, 0 elsewhere."""
        rewards, metrics = batch.rewards.float(), {}
        if self.overlong_buffer:
            lengths = batch.loss_mask.sum(-1)  # [B]
            penalty = overlong_penalty(lengths, batch.max_model_tokens, self.overlong_buffer, self.overlong_penalty)
            rewards = rewards + penalty
            total, n = reduce(torch.tensor([penalty.sum().item(), len(penalty)], dtype=torch.float64)).tolist()
            metrics["reward/overlong_penalty_mean"] = total / n
        adv = group_advantages(rewards, batch.group_size, self.scale_rewards, self.eps)  # [B]
        return adv[:, None] * batch.loss_mask.float(), metrics  # [B, T]


def dr_grpo(**overrides) -> GRPO:
    """Dr.GRPO's settings: no std division, a constant length normaliser."""
    return GRPO(**({"scale_rewards": False, "loss_agg": "seq-mean-token-sum-norm"} | overrides))


def dapo(overlong_buffer: int, **overrides) -> GRPO:
    """DAPO's settings: clip-higher, token-mean, overlong shaping over the last `overlong_buffer` tokens of the
    budget (the paper: 4k of 20k), dynamic sampling with up to 3 extra rounds."""
    return GRPO(**({"clip_low": 0.2, "clip_high": 0.28, "loss_agg": "token-mean", "overlong_buffer": overlong_buffer,
                    "dynamic_sampling": 3} | overrides))
