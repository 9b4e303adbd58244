"""Objective building blocks shared by every algorithm: KL estimators, the clipped surrogate, loss
aggregation and masked statistics. Algorithms (rlcore/algorithms/*.py) compose these; none is defined twice.

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
"""
from __future__ import annotations

import torch

from rlcore.batch import Normaliser

KL_ESTIMATORS = ("k1", "k2", "k3")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


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


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / (std + eps) with mean and (population) std over masked entries; 0 outside the mask.

    Example: x = [[1, 3, 9]], mask = [[1, 1, 0]] -> mean 2, std 1 -> [[-1, 1, 0]].
    """
    mean = masked_mean(x, mask)
    std = masked_mean((x - mean) ** 2, mask).sqrt()
    return (x - mean) / (std + eps) * mask.to(x.dtype)


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
