"""REINFORCE++ (Hu 2025, arXiv:2501.03262): PPO's clipped loss without a critic.

Per response, the reward arrives on the last token and a per-token KL penalty to the reference model is
subtracted on every token (rlcore.algorithms.objectives.token_rewards, k1 by default as in the paper). The advantage is
the discounted return-to-go, whitened over the *global* batch (every rank's response tokens):

    G_t = sum_{s >= t} gamma^(s - t) r_s          A_t = (G_t - mean(G)) / std(G)

REINFORCE++-baseline (baseline=True) first subtracts each prompt group's mean reward from its responses'
rewards (a leave-none-out group baseline, as GRPO does, without the std division), then whitens globally.
The loss is rlcore.algorithms.objectives.PolicyLoss.

Departures from the paper: the KL penalty is taken against pi_old's logprobs (the sampling policy), and
whitening uses the population std over tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rlcore.algorithms.objectives import KLRewardPenalty, Reduce, masked_whiten, no_reduce
from rlcore.batch import Batch


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
class ReinforcePP(KLRewardPenalty):
    """REINFORCE++ settings (the policy-loss and kl_penalty fields come from KLRewardPenalty)."""

    gamma: float = 1.0  # discount per token
    baseline: bool = False  # REINFORCE++-baseline: subtract each prompt group's mean reward first

    def validate(self, cfg) -> None:
        super().validate(cfg)
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"algorithm.gamma must be in [0, 1] (got {self.gamma})")
        if self.baseline and cfg.rollout.group_size < 2:
            raise ValueError(f"rollout.group_size must be >= 2 for the group baseline (got {cfg.rollout.group_size})")

    def advantages(self, batch: Batch, reduce: Reduce = no_reduce) -> tuple[torch.Tensor, dict]:
        rewards = batch.rewards.float()  # [B]
        if self.baseline:
            groups = rewards.view(-1, batch.group_size)  # [B / G, G]
            rewards = (groups - groups.mean(-1, keepdim=True)).view(-1)
        token_rewards, metrics = self.penalised_rewards(batch, rewards, reduce)  # [B, T]
        returns = returns_to_go(token_rewards, batch.loss_mask, self.gamma)  # [B, T]
        return masked_whiten(returns, batch.loss_mask, reduce), metrics
