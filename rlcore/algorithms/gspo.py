"""GSPO: Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071), and GSPO-token.

Paper: sample G responses y_i per prompt, group advantages A_i as GRPO (rlcore.algorithms.objectives.group_advantages).
The importance ratio is one per sequence, the geometric mean of its token ratios (eq. 7):

    s_i = (pi_theta(y_i | x) / pi_old(y_i | x)) ^ (1 / |y_i|) = exp(1/|y_i| sum_t log r_i,t)
    J   = E[ 1/G sum_i min(s_i A_i, clip(s_i, 1 - e_l, 1 + e_r) A_i) ]          e_l = 3e-4, e_r = 4e-4

so every token of a response weighs the same, and a sequence is clipped (all of its tokens' gradient dropped)
or not. GSPO-token (eq. 13) gives each token s_i,t = sg(s_i) * pi_theta(y_t) / sg(pi_theta(y_t)) and clips
per token; with one advantage per sequence it equals GSPO in value and gradient (checked in tests).

Example (two sequences, masks [1, 1, 1] and [1, 1, 0], window [0.9997, 1.0004]): log r = [0.1, -0.2, 0.4]
with A = +1 gives s_1 = e^0.1 = 1.105171, clipped to 1.0004 (no gradient); log r = [2e-4, 4e-4] with A = -1
gives s_2 = e^3e-4 = 1.00030005, inside. Loss = -(1.0004 - 1.00030005) / 2 = -4.998e-5, and
dL/dlog pi = s_2 / (|y_2| G) = 0.250075 on each of sequence 2's tokens.

Departures from the paper:
- The sequence term sits on each of the sequence's tokens and loss_agg must be seq-mean-token-mean, so the
  loss is 1/N sum_i term_i over the step's N sequences (the paper's 1/G per group, equal for whole groups).
- dual_clip is refused: it caps a token ratio's loss, and GSPO has no token ratio.
- The sequence ratio is against pi_old recomputed by the trainer (as every rlcore loss), not the engine's
  logprobs: the window is 4e-4 in log space, and an engine-trainer offset of that size (bf16 engines) would
  clip whole sequences. A mismatch correction (algorithm.tis_*, seq_mask) multiplies each token's term.
- With one optimizer step per rollout pi_old = pi_theta, s_i = 1 and the clip is inactive: set
  train.mini_batches > 1 (recipes/gspo_tiny.py: 2) for the clip to act.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rlcore.algorithms.objectives import PolicyLoss, Reduce, clipped_surrogate, group_advantages, masked_mean, no_reduce
from rlcore.batch import Batch

LEVELS = ("sequence", "token")


@dataclass
class GSPO(PolicyLoss):
    """GSPO's settings (the loss fields come from PolicyLoss; GSPO replaces only its surrogate)."""

    clip_low: float = 3e-4  # sequence-ratio floor 1 - clip_low (the paper's 3e-4)
    clip_high: float = 4e-4  # sequence-ratio ceiling 1 + clip_high (the paper's 4e-4)
    loss_agg: str = "seq-mean-token-mean"  # GSPO's only aggregation: each sequence weighs the same
    level: str = "sequence"  # sequence (GSPO) | token (GSPO-token: the sequence ratio's value, each token's gradient)
    scale_rewards: bool = True  # divide advantages by the group's reward std
    eps: float = 1e-6  # added to the group std, reward units

    def validate(self, cfg) -> None:
        super().validate(cfg)
        if self.loss_agg != "seq-mean-token-mean":
            raise ValueError(f"algorithm.loss_agg={self.loss_agg} cannot be used with GSPO: its objective is a "
                             f"mean over sequences; set algorithm.loss_agg=seq-mean-token-mean")
        if self.level not in LEVELS:
            raise ValueError(f"algorithm.level must be one of {', '.join(LEVELS)} (got {self.level!r})")
        if cfg.rollout.group_size < 2:
            raise ValueError(f"rollout.group_size must be >= 2 for GSPO (got {cfg.rollout.group_size})")

    def validate_clip(self) -> None:
        if self.dual_clip:
            raise ValueError(f"algorithm.dual_clip={self.dual_clip:g} cannot be used with GSPO: it caps a token "
                             f"ratio's loss and GSPO clips one ratio per sequence; set algorithm.dual_clip=0")
        super().validate_clip()

    def advantages(self, batch: Batch, reduce: Reduce = no_reduce) -> tuple[torch.Tensor, dict]:
        """[B, T]: each sequence's group advantage on its response tokens, 0 elsewhere (as GRPO)."""
        adv = group_advantages(batch.rewards, batch.group_size, self.scale_rewards, self.eps)  # [B]
        return adv[:, None] * batch.loss_mask.float(), {}

    def surrogate(self, logprobs: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-token loss [B, T], clipped [B, T]): each sequence's clipped term on each of its tokens."""
        m = batch.loss_mask.to(logprobs.dtype)  # [B, T]
        log_s = masked_mean(logprobs - batch.old_logprobs, m, -1)[:, None]  # [B, 1] log of s_i
        if self.level == "sequence":
            log_s, advantages = log_s.expand_as(m), masked_mean(batch.advantages, m, -1)[:, None].expand_as(m)
        else:  # the value of s_i on every token, the gradient of that token's own logprob
            log_s, advantages = log_s.detach() + logprobs - logprobs.detach(), batch.advantages  # [B, T]
        return clipped_surrogate(log_s, torch.zeros_like(log_s), advantages, self.clip_low, self.clip_high)
