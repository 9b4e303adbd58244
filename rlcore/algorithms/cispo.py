"""CISPO: Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv:2506.13585, sec. 3.1).

Paper: REINFORCE with the importance weight clipped and detached, over group advantages A as GRPO:

    J = E[ 1 / sum_i |y_i|  sum_i sum_t  sg(clip(r_i,t, 1 - e_low, 1 + e_high)) A_i,t log pi_theta(y_i,t) ]

with r = pi_theta / pi_old. PPO's clip zeroes the gradient of a token whose ratio left the range (and whose
advantage pushes it further); CISPO only caps the token's weight, so every token keeps a gradient. Inside the
range the gradient equals the unclipped IS gradient (d r = r d log pi).

Example, r = [0.5, 1, 3], cap 2 (clip_high 1), no floor, dL/dlog pi per token: A = +1 -> CISPO [-0.5, -1, -2]
(PPO with clip 0.2: [-0.5, -1, 0]); A = -1 -> CISPO [0.5, 1, 2] (PPO: [0, 1, 3]).

Departures from the paper:
- The per-token loss is -A * r * sg(r_hat / r): its gradient is the paper's, and its value is -r_hat A (the
  paper's log pi term has a value that means nothing), so policy/pg_loss reads like the other losses.
- Bounds: the paper sets no lower bound (e_low large) and does not say its e_high; clip_low = 1 (floor 0,
  none) and clip_high = 4 (cap 5, as SkyRL's cispo_eps_clip_high and TRL's recommended 5.0) are the defaults.
- dual_clip is refused (there is no clipped branch to cap). Aggregation defaults to token-mean, the paper's.
- With one optimizer step per rollout r = 1 everywhere and CISPO is REINFORCE: set train.mini_batches > 1
  (recipes/cispo_tiny.py: 2) for the weight to act. Methods without a trust region can drift (verl's DPPO
  study saw CISPO collapse on long runs): watch policy/kl.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rlcore.algorithms.objectives import PolicyLoss, Reduce, group_advantages, no_reduce
from rlcore.batch import Batch


@dataclass
class CISPO(PolicyLoss):
    """CISPO's settings (the loss fields come from PolicyLoss; CISPO replaces only its surrogate)."""

    clip_low: float = 1.0  # weight floor 1 - clip_low; 1 = no floor (the paper)
    clip_high: float = 4.0  # weight cap 1 + clip_high (5, as SkyRL and TRL)
    scale_rewards: bool = True  # divide advantages by the group's reward std
    eps: float = 1e-6  # added to the group std, reward units

    def validate(self, cfg) -> None:
        super().validate(cfg)
        if cfg.rollout.group_size < 2:
            raise ValueError(f"rollout.group_size must be >= 2 for CISPO (got {cfg.rollout.group_size})")

    def validate_clip(self) -> None:
        if self.dual_clip:
            raise ValueError(f"algorithm.dual_clip={self.dual_clip:g} cannot be used with CISPO: it clips the "
                             f"weight, not the update, so there is no loss to cap; set algorithm.dual_clip=0")
        if self.clip_low > 1:
            raise ValueError(f"algorithm.clip_low must be in [0, 1] for CISPO: the weight floor 1 - clip_low "
                             f"cannot be negative (1 = no floor; got {self.clip_low})")

    def advantages(self, batch: Batch, reduce: Reduce = no_reduce) -> tuple[torch.Tensor, dict]:
        """[B, T]: each sequence's group advantage on its response tokens, 0 elsewhere (as GRPO)."""
        adv = group_advantages(batch.rewards, batch.group_size, self.scale_rewards, self.eps)  # [B]
        return adv[:, None] * batch.loss_mask.float(), {}

    def surrogate(self, logprobs: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-token loss [B, T], clipped [B, T]: tokens whose weight was capped or floored)."""
        ratio = torch.exp(logprobs - batch.old_logprobs)  # [B, T]
        weight = ratio.clamp(1 - self.clip_low, 1 + self.clip_high).detach()  # [B, T]
        loss = -batch.advantages * ratio * (weight / ratio).detach()  # [B, T]
        return loss, weight != ratio.detach()
