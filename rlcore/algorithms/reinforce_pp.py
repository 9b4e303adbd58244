"""REINFORCE++ (Hu 2025, arXiv:2501.03262): PPO's clipped loss without a critic.

Per response, the reward arrives on the last token and a per-token KL penalty to the reference model is
subtracted on every token (rlcore.objectives.token_rewards, k1 by default as in the paper). The advantage is
the discounted return-to-go, whitened over the *global* batch (every rank's response tokens):

    G_t = sum_{s >= t} gamma^(s - t) r_s          A_t = (G_t - mean(G)) / std(G)

REINFORCE++-baseline (baseline=True) first subtracts each prompt group's mean reward from its responses'
rewards (a leave-none-out group baseline, as GRPO does, without the std division), then whitens globally.
The loss is rlcore.objectives.PolicyLoss.

Departures from the paper: the KL penalty is taken against pi_old's logprobs (the sampling policy), and
whitening uses the population std over tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rlcore.batch import Batch
from rlcore.objectives import (KL_ESTIMATORS, PolicyLoss, Reduce, global_token_mean, kl_estimate, masked_whiten,
                               no_reduce, token_rewards)


def returns_to_go(rewards: torch.Tensor, loss_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """[B, T] discounted sum of this and later model tokens' rewards; 0 off the mask.

    Discounting counts model tokens only: the running sum is carried unchanged across positions off the
    mask (a multi-turn environment's observation), so an earlier turn sees the final reward.
    Example, gamma 0.5: rewards [[0, -0.1, 1.0]], mask [[0, 1, 1]] -> [[0, -0.1 + 0.5 * 1.0, 1.0]] = [[0, 0.4, 1]];
    two turns, rewards [[0, 0, 0, 1]], mask [[1, 0, 0, 1]] -> [[0.5, 0, 0, 1]].
    """
    m = loss_mask.float()
    out = torch.zeros_like(m)
    running = torch.zeros_like(m[:, 0])  # [B]
    for t in reversed(range(m.shape[1])):
        running = torch.where(m[:, t] > 0, rewards[:, t] + gamma * running, running)
        out[:, t] = running * m[:, t]
    return out


@dataclass
class ReinforcePP(PolicyLoss):
    """REINFORCE++ settings (the policy-loss fields come from PolicyLoss)."""

    gamma: float = 1.0  # discount per token
    kl_penalty: float = 0.0  # per-token KL(pi_old || pi_ref) penalty in the reward; 0 = none (paper: 0.01)
    kl_penalty_estimator: str = "k1"  # k1 | k2 | k3
    baseline: bool = False  # REINFORCE++-baseline: subtract each prompt group's mean reward first

    def validate(self, cfg) -> None:
        super().validate(cfg)
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"algorithm.gamma must be in [0, 1] (got {self.gamma})")
        if self.kl_penalty < 0:
            raise ValueError(f"algorithm.kl_penalty must be >= 0 (got {self.kl_penalty})")
        if self.kl_penalty_estimator not in KL_ESTIMATORS:
            raise ValueError(f"algorithm.kl_penalty_estimator must be one of {', '.join(KL_ESTIMATORS)} "
                             f"(got {self.kl_penalty_estimator!r})")
        if self.baseline and cfg.rollout.group_size < 2:
            raise ValueError(f"rollout.group_size must be >= 2 for the group baseline (got {cfg.rollout.group_size})")

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0 or self.kl_penalty > 0

    @property
    def advantages_use_old_logprobs(self) -> bool:
        return self.kl_penalty > 0  # the KL penalty in the reward

    def advantages(self, batch: Batch, reduce: Reduce = no_reduce) -> tuple[torch.Tensor, dict]:
        rewards = batch.rewards.float()  # [B]
        if self.baseline:
            groups = rewards.view(-1, batch.group_size)  # [B / G, G]
            rewards = (groups - groups.mean(-1, keepdim=True)).view(-1)
        kl = kl_estimate(batch.old_logprobs, batch.ref_logprobs, self.kl_penalty_estimator) if self.kl_penalty else None
        returns = returns_to_go(token_rewards(rewards, batch.loss_mask, kl, self.kl_penalty), batch.loss_mask,
                                self.gamma)  # [B, T]
        metrics = {}
        if kl is not None:
            metrics["reward/kl_penalty"] = self.kl_penalty * global_token_mean(kl, batch.loss_mask, reduce)
        return masked_whiten(returns, batch.loss_mask, reduce), metrics
