"""GRPO: Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, sec. 4.1).

Paper, outcome supervision (eq. 3 and sec. 4.1.2): sample G responses o_1..o_G per prompt with rewards r_i;
    A_i = (r_i - mean(r_1..r_G)) / std(r_1..r_G)                 for every token of o_i
    J = 1/G sum_i 1/|o_i| sum_t { min(ratio_it A_i, clip(ratio_it, 1 - e, 1 + e) A_i) - beta D_KL,it }
    D_KL,it = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1             (eq. 4, Schulman's k3)
with ratio_it = pi_theta(o_it) / pi_old(o_it).

Departures from the paper:
- Loss aggregation is configurable (rlcore.objectives.aggregate) and defaults to "token-mean" (DAPO), not the
  paper's per-sequence mean ("seq-mean-token-mean"), which weighs tokens of short responses more.
- eps is added to the group std; std is the sample std (torch.std, as in TRL and verl); the paper leaves
  both unsaid. scale_rewards=False drops the division (Dr.GRPO, Liu et al. 2025).
- The clip range may be asymmetric, [1 - clip_low, 1 + clip_high] (DAPO's "clip-higher").
- kl_coef defaults to 0 (no reference model), as in DAPO and Dr.GRPO; the paper uses beta = 0.04.
- With the default single update per rollout, pi_old = pi_theta at the update, so ratio = 1 and the clip is
  inactive; it matters with train.epochs_per_step > 1 or train.mini_batches > 1.

The loss contract (what the trainer relies on): `loss(batch, logprobs, norm)` returns this micro-batch's
contribution to the step's loss and metrics, each divided by a global count in `norm` (summed over every
micro-batch and rank), so the trainer backprops each loss and sums metrics over micro-batches and ranks.
Metrics: policy/pg_loss (the surrogate, aggregated like the loss), and token means over response tokens
(divided by norm.tokens): policy/clip_frac, policy/kl (k3 KL(pi_theta || pi_old): how far the update
moved), policy/ref_kl (k3 KL(pi_theta || pi_ref), only when kl_coef > 0).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rlcore.batch import Batch, Normaliser
from rlcore.objectives import AGG_MODES, KL_ESTIMATORS, aggregate, clipped_surrogate, kl_estimate, masked_sum


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantage per sequence: reward minus its group's mean, over the group's std if `scale`.

    Example, group_size 4: rewards [1, 0, 0, 1, 1, 1, 1, 1] -> group 1 mean 0.5, std sqrt(1/3) = 0.577
    -> [0.866, -0.866, -0.866, 0.866, 0, 0, 0, 0]; an all-equal group teaches nothing. scale=False:
    [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0].
    """
    if rewards.shape[0] % group_size:
        raise ValueError(f"{rewards.shape[0]} rewards do not split into groups of {group_size}")
    groups = rewards.float().view(-1, group_size)  # [B / G, G]
    adv = groups - groups.mean(-1, keepdim=True)  # [B / G, G]
    if scale:
        adv = adv / (groups.std(-1, keepdim=True) + eps)
    return adv.view(-1)  # [B]


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    norm: Normaliser,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    kl_coef: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    kl_estimator: str = "k3",
    loss_agg: str = "token-mean",
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate plus kl_coef * KL(pi_theta || pi_ref) per token, aggregated by `loss_agg`.

    All tensors are [B, T]. Returns (loss contribution, metrics); see the module docstring for the contract.
    """
    pg, clipped = clipped_surrogate(logprobs, old_logprobs, advantages, clip_low, clip_high)  # [B, T] x2
    per_token = pg  # [B, T]
    tokens = max(norm.tokens, 1.0)
    with torch.no_grad():
        metrics = {
            "policy/pg_loss": aggregate(pg, loss_mask, loss_agg, norm, max_len),
            "policy/clip_frac": masked_sum(clipped.float(), loss_mask) / tokens,
            "policy/kl": masked_sum(kl_estimate(logprobs, old_logprobs, "k3"), loss_mask) / tokens,
        }
    if kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs (the frozen reference model's logprobs)")
        ref_kl = kl_estimate(logprobs, ref_logprobs, kl_estimator)  # [B, T]
        per_token = pg + kl_coef * ref_kl
        metrics["policy/ref_kl"] = masked_sum(kl_estimate(logprobs, ref_logprobs, "k3").detach(), loss_mask) / tokens
    return aggregate(per_token, loss_mask, loss_agg, norm, max_len), metrics


@dataclass
class GRPO:
    """GRPO's settings; a recipe sets `Config.algorithm = GRPO(...)`."""

    clip_low: float = 0.2  # ratio floor is 1 - clip_low (paper: 0.2)
    clip_high: float = 0.2  # ratio ceiling is 1 + clip_high (DAPO clip-higher: 0.28)
    kl_coef: float = 0.0  # weight of KL(pi_theta || pi_ref) in the loss, per token; 0 = no reference model
    kl_estimator: str = "k3"  # per-token KL estimator for the loss term: k1 | k2 | k3 (paper: k3)
    loss_agg: str = "token-mean"  # token-mean | seq-mean-token-mean (paper) | seq-mean-token-sum | -norm
    scale_rewards: bool = True  # divide advantages by the group's reward std (Dr.GRPO: False)
    eps: float = 1e-6  # added to the group std, reward units; keeps all-equal groups finite

    def validate(self, cfg) -> None:
        """Raise ValueError naming the first bad field of `cfg` (a rlcore.config.Config) or of self."""
        if cfg.rollout.group_size < 2:
            raise ValueError(f"rollout.group_size must be >= 2 for GRPO (got {cfg.rollout.group_size})")
        for name in ("clip_low", "clip_high", "kl_coef", "eps"):
            if getattr(self, name) < 0:
                raise ValueError(f"algorithm.{name} must be >= 0 (got {getattr(self, name)})")
        if self.clip_low >= 1:
            raise ValueError(f"algorithm.clip_low must be < 1 so the ratio floor stays positive (got {self.clip_low})")
        if self.loss_agg not in AGG_MODES:
            raise ValueError(f"algorithm.loss_agg must be one of {', '.join(AGG_MODES)} (got {self.loss_agg!r})")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"algorithm.kl_estimator must be one of {', '.join(KL_ESTIMATORS)} (got {self.kl_estimator!r})"
            )

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def advantages(self, batch: Batch) -> torch.Tensor:
        """[B, T]: each sequence's group advantage on its response tokens, 0 elsewhere."""
        adv = group_advantages(batch.rewards, batch.group_size, self.scale_rewards, self.eps)  # [B]
        return adv[:, None] * batch.loss_mask.float()  # [B, T]

    def loss(self, batch: Batch, logprobs: torch.Tensor, norm: Normaliser) -> tuple[torch.Tensor, dict]:
        """This micro-batch's loss contribution and metrics; `logprobs` [B, T] carry the gradient."""
        return grpo_loss(
            logprobs,
            batch.old_logprobs,
            batch.advantages,
            batch.loss_mask,
            norm,
            clip_low=self.clip_low,
            clip_high=self.clip_high,
            kl_coef=self.kl_coef,
            ref_logprobs=batch.ref_logprobs,
            kl_estimator=self.kl_estimator,
            loss_agg=self.loss_agg,
            # Dr.GRPO's constant divisor: the generation budget, the same on every rank and micro-batch.
            max_len=norm.max_len or batch.loss_mask.shape[1],
        )
