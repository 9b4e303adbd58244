"""PPO with a learned critic (Schulman et al. 2017, arXiv:1707.06347), as used for RLHF (Ouyang et al. 2022).

Per response, the reward model's score arrives on the last token and an optional per-token KL penalty to the
reference model is subtracted on every token (rlcore.algorithms.objectives.token_rewards). The critic V estimates the
return before each response token; Generalised Advantage Estimation (Schulman et al. 2016) gives

    delta_t = r_t + gamma * V_{t+1} - V_t          (V after the last token is 0)
    A_t     = delta_t + gamma * lambda * A_{t+1}
    returns_t = A_t + V_t                          (the critic's regression target)

The policy loss is rlcore.algorithms.objectives.PolicyLoss on the (globally whitened) A_t. The critic minimises the
clipped value loss 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2), token-mean, with its own
optimizer (the trainer steps it beside the policy's).

Departures from the paper: no entropy bonus and no shared actor/critic trunk (the critic is a separate
model, as in RLHF); advantages are whitened over the global batch (every rank), not per mini-batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rlcore.algorithms.objectives import KLRewardPenalty, Reduce, masked_sum, masked_whiten, no_reduce
from rlcore.batch import Batch, Normaliser


def gae(rewards: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor, gamma: float, lam: float):
    """Advantages and returns [B, T] from per-token rewards and values [B, T] on response positions.

    Example, one response of 2 tokens, gamma 1, lambda 0.5: rewards [0, 1], values [0.5, 0.25]
    -> deltas [0 + 0.25 - 0.5, 1 + 0 - 0.25] = [-0.25, 0.75]; A = [-0.25 + 0.5 * 0.75, 0.75] = [0.125, 0.75];
    returns = A + V = [0.625, 1.0]. The same two tokens as two turns with an observation between them
    (mask [1, 0, 0, 1]) give the same advantages on the model tokens: nothing is discounted off the mask.
    """
    m = loss_mask.float()  # [B, T]
    advantages = torch.zeros_like(m)
    next_value = torch.zeros_like(m[:, 0])  # [B]
    next_adv = torch.zeros_like(m[:, 0])  # [B]
    for t in reversed(range(m.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = adv * m[:, t]
        # Off the mask (an environment's observation, or the prompt) the next model token's value and
        # advantage carry through unchanged: the episode goes on. After the last model token they stay 0.
        keep = m[:, t] > 0
        next_value, next_adv = torch.where(keep, values[:, t], next_value), torch.where(keep, adv, next_adv)
    return advantages, (advantages + values) * m


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, loss_mask: torch.Tensor,
               norm: Normaliser, clip: float) -> tuple[torch.Tensor, dict]:
    """Clipped value loss, token-mean over the global count. Example (clip 0.2): V_old 0, V 0.5, R 1
    -> unclipped 0.5 * 0.25 = 0.125, clipped V 0.2 -> 0.5 * 0.64 = 0.32; the loss is the max, 0.32."""
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)  # [B, T]
    losses = torch.maximum((values - returns) ** 2, (clipped_values - returns) ** 2)  # [B, T]
    tokens = max(norm.tokens, 1.0)
    loss = 0.5 * masked_sum(losses, loss_mask) / tokens
    with torch.no_grad():
        clip_frac = masked_sum(((clipped_values - returns) ** 2 > (values - returns) ** 2).float(), loss_mask)
    return loss, {"value/loss": loss.detach(), "value/clip_frac": clip_frac / tokens}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, loss_mask: torch.Tensor, reduce: Reduce) -> float:
    """1 - Var(returns - values) / Var(returns) over every rank's response tokens: 1 is a perfect critic,
    0 no better than a constant (also reported when the returns are constant), negative worse."""
    m, err = loss_mask.double(), (returns - values).double()
    r = returns.double()
    n, s_r, s_rr, s_e, s_ee = reduce(torch.stack([m.sum(), (r * m).sum(), (r * r * m).sum(), (err * m).sum(),
                                                  (err * err * m).sum()])).tolist()
    var_r = s_rr / n - (s_r / n) ** 2
    var_e = s_ee / n - (s_e / n) ** 2
    return 1.0 - var_e / var_r if var_r > 0 else 0.0  # constant returns: nothing to explain


@dataclass
class PPO(KLRewardPenalty):
    """PPO's settings (the policy-loss and kl_penalty fields come from KLRewardPenalty). Needs `cfg.critic`."""

    gamma: float = 1.0  # discount per token
    lam: float = 0.95  # GAE lambda: 0 = one-step TD, 1 = Monte Carlo returns
    value_clip: float = 0.2  # the new value may move at most this far from the old one in the loss
    whiten_advantages: bool = True  # (A - mean) / std over the global batch

    needs_critic = True

    def validate(self, cfg) -> None:
        super().validate(cfg)
        for name in ("gamma", "lam"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"algorithm.{name} must be in [0, 1] (got {getattr(self, name)})")
        if self.value_clip < 0:
            raise ValueError(f"algorithm.value_clip must be >= 0 (got {self.value_clip})")
        if not cfg.critic.path:
            raise ValueError("PPO needs a critic but critic.path is empty: set critic.path=policy (initialise "
                             "from model.path) or a folder of a transformers model")

    def gae(self, batch: Batch, reduce: Reduce = no_reduce) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """GAE on KL-penalised token rewards: (advantages [B, T] before whitening, returns [B, T], metrics)."""
        rewards, metrics = self.penalised_rewards(batch, batch.rewards, reduce)  # [B, T]
        advantages, returns = gae(rewards, batch.values, batch.loss_mask, self.gamma, self.lam)  # [B, T] x2
        return advantages, returns, metrics

    def advantages(self, batch: Batch, reduce: Reduce = no_reduce) -> tuple[torch.Tensor, dict]:
        """GAE advantages [B, T], whitened over the global batch unless whiten_advantages=False."""
        mask = batch.loss_mask
        advantages, returns, metrics = self.gae(batch, reduce)
        n, v_sum = reduce(torch.stack([mask.sum(), masked_sum(batch.values, mask)]).double()).tolist()
        metrics |= {"value/mean": v_sum / max(n, 1.0),
                    "value/explained_variance": explained_variance(batch.values, returns, mask, reduce)}
        if self.whiten_advantages:
            advantages = masked_whiten(advantages, mask, reduce)
        return advantages, metrics

    def returns(self, batch: Batch, reduce: Reduce = no_reduce) -> torch.Tensor:
        """The critic's targets [B, T]: GAE's advantages plus the old values (the same pass as `advantages`)."""
        # Its metrics were reported by `advantages`: no reduce, so no second all-reduce.
        return self.gae(batch, no_reduce)[1]

    def value_loss(self, batch: Batch, values: torch.Tensor, norm: Normaliser) -> tuple[torch.Tensor, dict]:
        """This micro-batch's critic loss contribution; `values` [B, T] carry the critic's gradient."""
        return value_loss(values, batch.values, batch.returns, batch.loss_mask, norm, self.value_clip)
