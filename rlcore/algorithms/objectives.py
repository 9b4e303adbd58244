"""Objective building blocks shared by every algorithm: KL estimators (as a loss term or a reward penalty),
the clipped surrogate, group advantages, loss aggregation, masked (and globally reduced)
statistics, and `PolicyLoss`, the clipped policy-gradient loss every algorithm's `loss` is. Algorithms
(rlcore/algorithms/*.py) compose these; none is defined twice. The mismatch corrections PolicyLoss applies
are rlcore.algorithms.corrections.

The normalisation contract (why the gradient does not depend on how a step's batch is split)
-------------------------------------------------------------------------------------------------
One optimizer step sees N sequences spread over R ranks and M micro-batches per rank. Before the step the
trainer sums `local_normaliser(loss_mask)` over its micro-batches and all-reduces it (SUM) over ranks, giving
one global `Normaliser(tokens, sequences)`. Each micro-batch then returns its *contribution*:

    aggregate(...) = (sum of this micro-batch's token or sequence losses) / global count

so gradients accumulated over micro-batches and summed over ranks equal the gradient of the full-batch loss,
whatever the split. A per-micro-batch mean would instead weight short micro-batches' tokens more.

Losses return `(loss, metrics)`. Every metric is a detached scalar contribution in the same sense (divided by a
global count), so the trainer sums it over micro-batches and ranks to get the step's value.

Why one file of ~370 lines: the shared loss pieces live once, in one module (every algorithm composes them and
PolicyLoss); split, one loss would be read across files.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from rlcore.algorithms.base import Algorithm
from rlcore.algorithms.corrections import SEQ_MASKS, TIS_LEVELS, TIS_MODES, sequence_keep, tis_weights
from rlcore.batch import Batch, Normaliser

KL_ESTIMATORS = ("k1", "k2", "k3")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

# Sums a tensor over every rank (an all-reduce); the identity in a single process.
Reduce = Callable[[torch.Tensor], torch.Tensor]


def no_reduce(t: torch.Tensor) -> torch.Tensor:
    return t


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantage per sequence (GRPO, GSPO): reward minus its group's mean, over the group's std
    if `scale`.

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


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi (Schulman, "Approximating KL
    Divergence", 2020). With log r = ref_logprobs - logprobs:

        k1 = -log r                 unbiased, high variance, can be negative
        k2 = 0.5 * (log r)^2        biased, low variance, >= 0
        k3 = (r - 1) - log r        unbiased, low variance, >= 0 (GRPO's choice)

    Example: logprobs = 0, ref_logprobs = log(0.5) -> k1 = 0.693, k2 = 0.240, k3 = 0.5 - 1 + 0.693 = 0.193.
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; valid: {', '.join(KL_ESTIMATORS)}")
    log_ratio = logprobs - ref_logprobs  # [B, T]  log pi - log pi_ref
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    return torch.exp(-log_ratio) - 1 + log_ratio


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped objective as a per-token loss (Schulman et al. 2017, eq. 7), with the asymmetric
    range [1 - clip_low, 1 + clip_high] of DAPO ("clip-higher") and the optional dual clip of Ye et al. 2020.

        ratio = exp(logprobs - old_logprobs)
        loss  = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)
        dual:   for A < 0, loss = min(loss, -dual_clip * A)

    Returns (loss [B, T], clipped [B, T] bool); `clipped` marks tokens whose loss came from a clipped branch
    (their gradient is zero), for the policy/clip_frac metric.

    Example (clip 0.2): ratio 1.5, A = 1 -> loss -1.2, clipped; ratio 1.5, A = -1 -> loss 1.5, not clipped;
    ratio 0.5, A = 1 -> loss -0.5, not clipped; ratio 0.5, A = -1 -> loss 0.8, clipped.
    """
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1 (got {dual_clip})")
    ratio = torch.exp(logprobs - old_logprobs)  # [B, T]
    unclipped_loss = -ratio * advantages  # [B, T]
    clipped_loss = -torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * advantages  # [B, T]
    loss = torch.maximum(unclipped_loss, clipped_loss)  # [B, T]
    clipped = clipped_loss > unclipped_loss  # [B, T]
    if dual_clip is not None:
        # A very large ratio on a negative-advantage token would otherwise give an unbounded loss.
        cap = -dual_clip * advantages  # [B, T]
        dual = (advantages < 0) & (loss > cap)  # [B, T]
        loss = torch.where(dual, cap, loss)
        clipped = clipped | dual
    return loss, clipped


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of x where mask is 1, e.g. masked_sum([[1, 2, 3]], [[1, 1, 0]]) = 3."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x where mask is 1 (0 where the mask is empty), e.g. masked_mean([[1, 2, 3]], [[1, 1, 0]]) = 1.5."""
    return masked_sum(x, mask, dim) / masked_sum(torch.ones_like(x), mask, dim).clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, reduce: Reduce = no_reduce, shift_mean: bool = True,
                  eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / (std + eps) with mean and (population) std over masked entries; 0 outside the mask.
    `reduce` sums the moments over ranks, so every rank whitens with the global batch's statistics.
    shift_mean=False keeps the mean: x / (std + eps).

    Example: x = [[1, 3, 9]], mask = [[1, 1, 0]] -> mean 2, std 1 -> [[-1, 1, 0]].
    """
    m = mask.to(x.dtype)
    n, s1, s2 = reduce(torch.stack([m.sum(), (x * m).sum(), (x * x * m).sum()]).double()).tolist()
    mean = s1 / max(n, 1.0)
    std = max(s2 / max(n, 1.0) - mean**2, 0.0) ** 0.5
    return ((x - mean) if shift_mean else x) / (std + eps) * m


def token_rewards(rewards: torch.Tensor, loss_mask: torch.Tensor, kl: torch.Tensor | None = None,
                  kl_coef: float = 0.0) -> torch.Tensor:
    """Per-token rewards [B, T] for a return: the sequence reward on its last response token, minus
    kl_coef * kl on every response token (the KL estimator used as a reward penalty, as in RLHF PPO).

    Example: rewards [1.0], loss_mask [[0, 1, 1]], kl [[9, 0.5, 0.25]], kl_coef 0.1 -> [[0, -0.05, 0.975]].
    """
    m = loss_mask.to(torch.float32)
    positions = torch.arange(m.shape[1], device=m.device).expand_as(m)  # [B, T]
    last = (positions * m).argmax(-1)  # [B] index of the last response token
    out = torch.zeros_like(m)
    out[torch.arange(m.shape[0]), last] = rewards.float() * (m.sum(-1) > 0)
    if kl is not None and kl_coef:
        out = out - kl_coef * kl.float() * m
    return out * m
def global_token_mean(x: torch.Tensor, mask: torch.Tensor, reduce: Reduce = no_reduce) -> float:
    """Mean of x over every rank's masked entries (e.g. a metric computed before the update)."""
    n, total = reduce(torch.stack([mask.sum(), (x * mask).sum()]).double()).tolist()
    return total / max(n, 1.0)


def local_normaliser(loss_mask: torch.Tensor) -> Normaliser:
    """This micro-batch's counts; the trainer sums them over micro-batches and ranks into the step's Normaliser.

    Example: loss_mask [[0, 1, 1], [0, 0, 0]] -> Normaliser(tokens=2.0, sequences=1.0).
    """
    return Normaliser(
        tokens=float(loss_mask.sum()),
        sequences=float((loss_mask.sum(-1) > 0).sum()),
    )


def aggregate(
    per_token: torch.Tensor, loss_mask: torch.Tensor, mode: str, norm: Normaliser, max_len: int | None = None
) -> torch.Tensor:
    """Reduce a per-token loss [B, T] to this micro-batch's scalar contribution (see the module docstring).
    With l the loss, m the mask, and N_tok / N_seq the global counts in `norm`:

        token-mean               sum_i sum_t l*m / N_tok               PPO, DAPO (every token weighs the same)
        seq-mean-token-mean      sum_i (sum_t l*m / sum_t m) / N_seq   GRPO paper (every sequence the same)
        seq-mean-token-sum       sum_i sum_t l*m / N_seq
        seq-mean-token-sum-norm  sum_i sum_t l*m / max_len / N_seq     Dr.GRPO (a constant replaces length)

    Example: l = [[1, 2, 3], [4, 5, 6]], m = [[1, 1, 0], [1, 0, 0]], and this is the whole batch (N_tok = 3,
    N_seq = 2): token-mean (1+2+4)/3 = 2.333; seq-mean-token-mean (1.5 + 4)/2 = 2.75; seq-mean-token-sum
    (3 + 4)/2 = 3.5; seq-mean-token-sum-norm with max_len 3: (1 + 1.333)/2 = 1.1667.

    For seq-mean-token-sum-norm, max_len must be the same constant on every micro-batch and rank.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; valid: {', '.join(AGG_MODES)}")
    mask = loss_mask.to(per_token.dtype)  # [B, T]
    if mode == "token-mean":
        return (per_token * mask).sum() / max(norm.tokens, 1.0)
    seq_sum = (per_token * mask).sum(-1)  # [B]
    if mode == "seq-mean-token-mean":
        seq_loss = seq_sum / mask.sum(-1).clamp(min=1)  # [B]
    elif mode == "seq-mean-token-sum":
        seq_loss = seq_sum  # [B]
    else:
        if max_len is None:
            raise ValueError("seq-mean-token-sum-norm needs max_len (the constant per-sequence divisor)")
        seq_loss = seq_sum / max_len  # [B]
    # Rows without response tokens add 0 here and are not counted in norm.sequences.
    return seq_loss.sum() / max(norm.sequences, 1.0)


@dataclass
class PolicyLoss(Algorithm):
    """The clipped policy-gradient loss, with every knob the algorithms share. GRPO, PPO and REINFORCE++
    subclass it and add how they compute advantages; their `loss` is this one (the rest of the contract:
    rlcore.algorithms.base.Algorithm). GSPO and CISPO replace only `surrogate`.

        per token:  correction weight * surrogate(ratio, A)  +  kl_coef * KL_est(pi_theta || pi_ref)
        reduced:    aggregate(per token, loss_agg)

    The correction (rlcore.algorithms.corrections) is an importance weight (tis_*) and / or a sequence mask (seq_mask*).
    Metrics (token means unless said): policy/pg_loss (aggregated like the loss), policy/clip_frac,
    policy/kl (k3 KL(pi_theta || pi_old): how far the update moved), policy/ref_kl (when kl_coef > 0); with
    tis_cap > 0 policy/is_weight_mean, policy/is_weight_max (the raw weights) and policy/is_truncated_frac
    (tokens truncated or masked); with seq_mask policy/seq_masked_frac (a share of the sequences).
    """

    clip_low: float = 0.2  # ratio floor is 1 - clip_low
    clip_high: float = 0.2  # ratio ceiling is 1 + clip_high (clip-higher, e.g. DAPO: 0.28)
    dual_clip: float = 0.0  # cap the loss of negative-advantage tokens at dual_clip * |A|; 0 = off, else > 1
    kl_coef: float = 0.0  # weight of KL(pi_theta || pi_ref) as a per-token loss term; 0 = none
    kl_estimator: str = "k3"  # estimator for that loss term: k1 | k2 | k3
    loss_agg: str = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm
    # Importance weight pi_old / pi_rollout for the engine-trainer mismatch (rlcore.algorithms.corrections): truncated
    # at (or, tis_mode=mask, dropped above) this cap, e.g. 2; 0 = off.
    tis_cap: float = 0.0
    tis_low: float = 0.0  # tis_mode=mask only: also drop weights below this (IcePop: 0.5 with tis_cap 5); 0 = none
    tis_level: str = "token"  # token | sequence (product of the ratios) | geometric (their geometric mean)
    tis_mode: str = "truncate"  # truncate (min(w, cap)) | mask (w inside [tis_low, tis_cap], else 0)
    # Drop whole sequences (weight 1 or 0) whose geometric-mean or product ratio pi_old / pi_rollout leaves
    # [seq_mask_low, seq_mask_high]: "" (off) | geometric | product
    seq_mask: str = ""
    seq_mask_low: float = 0.99  # lower bound of the kept ratio (SkyRL's geometric default 0.99)
    seq_mask_high: float = 1.01  # upper bound of the kept ratio (SkyRL's geometric default 1.01)

    def validate(self, cfg) -> None:
        """Raise ValueError naming the first bad field (fields of the loss; subclasses add their own)."""
        for name in ("clip_low", "clip_high"):
            if getattr(self, name) < 0:
                raise ValueError(f"algorithm.{name} must be >= 0 (got {getattr(self, name)}): a negative value "
                                 f"inverts the ratio range [1 - clip_low, 1 + clip_high]")
        for name in ("kl_coef", "tis_cap", "tis_low"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"algorithm.{name} must be >= 0 (got {getattr(self, name)})")
        self.validate_clip()
        for name, valid in (("loss_agg", AGG_MODES), ("kl_estimator", KL_ESTIMATORS), ("tis_level", TIS_LEVELS),
                            ("tis_mode", TIS_MODES), ("seq_mask", SEQ_MASKS)):
            if getattr(self, name) not in valid:
                raise ValueError(f"algorithm.{name} must be one of {', '.join(v or '(empty: off)' for v in valid)} "
                                 f"(got {getattr(self, name)!r})")
        self.validate_corrections()

    def validate_clip(self) -> None:
        """The clip range and dual clip of `surrogate` (a loss with another surrogate checks its own)."""
        if self.clip_low >= 1:
            raise ValueError(f"algorithm.clip_low must be < 1 so the ratio floor 1 - clip_low stays positive "
                             f"(got {self.clip_low})")
        if self.dual_clip and self.dual_clip <= 1 + self.clip_high:
            raise ValueError(f"algorithm.dual_clip must be 0 (off) or > 1 + clip_high = {1 + self.clip_high:g}, "
                             f"above the ratio ceiling (got {self.dual_clip})")

    def validate_corrections(self) -> None:
        if 0 < self.tis_cap < 1:
            raise ValueError(f"algorithm.tis_cap must be 0 (off) or >= 1 (got {self.tis_cap})")
        if self.tis_low and (self.tis_mode != "mask" or not self.tis_cap):
            raise ValueError(f"algorithm.tis_low={self.tis_low:g} is a mask's lower bound: it needs tis_mode=mask "
                             f"and tis_cap > 0")
        if self.tis_low >= 1:
            raise ValueError(f"algorithm.tis_low must be in [0, 1) and below tis_cap={self.tis_cap:g} "
                             f"(got {self.tis_low})")
        if self.seq_mask and not 0 < self.seq_mask_low < 1 < self.seq_mask_high < math.inf:
            raise ValueError(f"algorithm.seq_mask_low and seq_mask_high must satisfy 0 < low < 1 < high < inf "
                             f"(got [{self.seq_mask_low}, {self.seq_mask_high}])")

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    @property
    def corrects_off_policy(self) -> bool:
        return self.tis_cap > 0 or bool(self.seq_mask)

    def surrogate(self, logprobs: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-token policy loss [B, T], clipped [B, T] bool): PPO's clipped surrogate on batch.advantages."""
        return clipped_surrogate(logprobs, batch.old_logprobs, batch.advantages, self.clip_low, self.clip_high,
                                 self.dual_clip or None)

    def correction(self, batch: Batch, norm: Normaliser) -> tuple[torch.Tensor | None, dict]:
        """The mismatch weights [B, T] (None when every correction is off) and their metrics."""
        mask, metrics, weights = batch.loss_mask, {}, None
        tokens = max(norm.tokens, 1.0)
        if self.tis_cap > 0:
            weights, raw, cut = tis_weights(batch.old_logprobs, batch.rollout_logprobs, mask, self.tis_cap,
                                            self.tis_level, self.tis_mode, self.tis_low)  # [B, T] x3
            metrics["policy/is_weight_mean"] = masked_sum(raw, mask) / tokens
            metrics["policy/is_weight_max"] = (raw * mask).max() if raw.numel() else torch.zeros(())
            metrics["policy/is_truncated_frac"] = masked_sum(cut.float(), mask) / tokens
        if self.seq_mask:
            keep = sequence_keep(batch.old_logprobs, batch.rollout_logprobs, mask, self.seq_mask, self.seq_mask_low,
                                 self.seq_mask_high)  # [B, 1]
            has_tokens = (mask.sum(-1, keepdim=True) > 0).to(keep.dtype)  # [B, 1]
            metrics["policy/seq_masked_frac"] = ((1 - keep) * has_tokens).sum() / max(norm.sequences, 1.0)
            weights = keep.expand_as(mask) if weights is None else weights * keep
        return weights, metrics

    def loss(self, batch: Batch, logprobs: torch.Tensor, norm: Normaliser) -> tuple[torch.Tensor, dict]:
        """This micro-batch's loss contribution and metrics; `logprobs` [B, T] carry the gradient, every other
        tensor comes from `batch` (old_logprobs, advantages, loss_mask, ref_logprobs, rollout_logprobs)."""
        mask, tokens = batch.loss_mask, max(norm.tokens, 1.0)
        # Dr.GRPO's constant divisor: the generation budget, the same on every rank and micro-batch.
        max_len = norm.max_len or mask.shape[1]
        pg, clipped = self.surrogate(logprobs, batch)  # [B, T] x2
        weights, metrics = self.correction(batch, norm)
        if weights is not None:
            pg = pg * weights
        per_token = pg  # [B, T]
        with torch.no_grad():
            metrics["policy/pg_loss"] = aggregate(pg, mask, self.loss_agg, norm, max_len)
            metrics["policy/clip_frac"] = masked_sum(clipped.float(), mask) / tokens
            metrics["policy/kl"] = masked_sum(kl_estimate(logprobs, batch.old_logprobs, "k3"), mask) / tokens
        if self.kl_coef > 0:
            if batch.ref_logprobs is None:
                raise ValueError("kl_coef > 0 needs ref_logprobs (the frozen reference model's logprobs)")
            per_token = pg + self.kl_coef * kl_estimate(logprobs, batch.ref_logprobs, self.kl_estimator)
            metrics["policy/ref_kl"] = masked_sum(kl_estimate(logprobs, batch.ref_logprobs, "k3").detach(),
                                                  mask) / tokens
        return aggregate(per_token, mask, self.loss_agg, norm, max_len), metrics


@dataclass
class KLRewardPenalty(PolicyLoss):
    """PolicyLoss plus a per-token KL(pi_old || pi_ref) penalty subtracted from the reward before the return
    is computed (RLHF PPO, REINFORCE++). Subclasses call `penalised_rewards` in their `advantages`."""

    kl_penalty: float = 0.0  # per-token KL(pi_old || pi_ref) penalty in the reward; 0 = none (REINFORCE++ paper: 0.01)
    kl_penalty_estimator: str = "k1"  # estimator for the reward penalty: k1 | k2 | k3

    def validate(self, cfg) -> None:
        super().validate(cfg)
        if self.kl_penalty < 0:
            raise ValueError(f"algorithm.kl_penalty must be >= 0 (got {self.kl_penalty})")
        if self.kl_penalty_estimator not in KL_ESTIMATORS:
            raise ValueError(f"algorithm.kl_penalty_estimator must be one of {', '.join(KL_ESTIMATORS)} "
                             f"(got {self.kl_penalty_estimator!r})")

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0 or self.kl_penalty > 0

    @property
    def advantages_use_old_logprobs(self) -> bool:
        return self.kl_penalty > 0  # the penalty reads pi_old's logprobs

    def penalised_rewards(self, batch: Batch, rewards: torch.Tensor, reduce: Reduce = no_reduce
                          ) -> tuple[torch.Tensor, dict]:
        """Per-token rewards [B, T] (token_rewards: each sequence's reward [B] on its last token, minus
        kl_penalty * KL estimate on every token) and the metric reward/kl_penalty (its global token mean)."""
        if not self.kl_penalty:
            return token_rewards(rewards, batch.loss_mask), {}
        kl = kl_estimate(batch.old_logprobs, batch.ref_logprobs, self.kl_penalty_estimator)  # [B, T]
        metrics = {"reward/kl_penalty": self.kl_penalty * global_token_mean(kl, batch.loss_mask, reduce)}
        return token_rewards(rewards, batch.loss_mask, kl, self.kl_penalty), metrics
