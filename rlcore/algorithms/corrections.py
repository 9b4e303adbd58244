"""The rollout-vs-trainer mismatch corrections: the engine sampled from pi_rollout, the loss assumes pi_old.

The two differ whenever the engine is not the trainer: another precision (bf16 or FP8 engines), other kernels,
MoE routing, or older weights (a split mesh with rollout.max_staleness k >= 1, streaming). Every correction
reads only old_logprobs and rollout_logprobs, per token or per sequence, whatever the mode that produced them.
With delta_t = log pi_old(y_t) - log pi_rollout(y_t) and rho_t = exp(delta_t), all weights detached:

    token truncate       w_t = min(rho_t, C)                          TIS (Yao et al. 2025)
    token mask           w_t = rho_t * 1[c <= rho_t <= C]             MIS; with c > 0 it is IcePop (Ring-1T,
                                                                      arXiv:2510.18855): peers use [0.5, 5]
    sequence truncate    w_i = min(prod_t rho_t, C) on every token
    sequence mask        w_i = prod_t rho_t * 1[c <= prod_t rho_t <= C]
    geometric truncate   w_i = min(exp(mean_t delta_t), C)            the length-free sequence ratio
    geometric mask       w_i = g_i * 1[c <= g_i <= C], g_i = exp(mean_t delta_t)

and, independently, a rejection mask that keeps a sequence at weight 1 or drops it (`sequence_keep`):

    seq_mask=geometric   keep iff c <= exp(mean_t delta_t) <= C       SkyRL's first recommendation, [0.99, 1.01]
    seq_mask=product     keep iff c <= prod_t rho_t <= C              [0.5, 2] in SkyRL / verl

Departures and choices: a lower bound c applies to masks only (a truncation that also raised small weights
would up-weight tokens the engine over-sampled); c = 0 means none. A product over a long response drifts
far from 1 on small per-token errors (1.1 per token over 100 tokens is 13,780), so for long responses prefer
the geometric mean; but cancelling token errors pass both sequence tests, so pair one with a token bound
(see the 2x3 example in tests/test_corrections.py). docs/algorithms.md says which mode uses which by default.
"""
from __future__ import annotations

import torch

TIS_LEVELS = ("token", "sequence", "geometric")
TIS_MODES = ("truncate", "mask")
SEQ_MASKS = ("", "geometric", "product")


def log_ratio(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, loss_mask: torch.Tensor,
              level: str = "token") -> torch.Tensor:
    """[B, T] log of the importance ratio pi_old / pi_rollout, detached, 0 off the mask: per token, or the
    sequence's sum (product of ratios) or mean (geometric mean) on each of its tokens.

    Example: delta = [[0, 1, -1], [0.005, 0.015, pad]] -> sequence [[0, 0, 0], [0.02, 0.02, 0]],
    geometric [[0, 0, 0], [0.01, 0.01, 0]]."""
    if level not in TIS_LEVELS:
        raise ValueError(f"unknown importance-sampling level {level!r}; valid: {', '.join(TIS_LEVELS)}")
    m = loss_mask.to(old_logprobs.dtype)
    delta = (old_logprobs - rollout_logprobs).detach() * m  # [B, T]
    if level == "token":
        return delta
    return sequence_log_ratio(delta, m, level).expand_as(delta) * m  # [B, T], the sequence's value on its tokens


def sequence_log_ratio(delta: torch.Tensor, m: torch.Tensor, level: str) -> torch.Tensor:
    """[B, 1] the sum (level "sequence") or the mean ("geometric") of masked log ratios `delta` [B, T]."""
    total = (delta * m).sum(-1, keepdim=True)  # [B, 1]
    return total / m.sum(-1, keepdim=True).clamp(min=1) if level == "geometric" else total


def tis_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, loss_mask: torch.Tensor, cap: float,
                level: str = "token", mode: str = "truncate", low: float = 0.0
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Importance weights pi_old / pi_rollout, per token or per sequence (`level`, see the module docstring),
    truncated at `cap` or masked outside [low, cap].

    Returns (weights [B, T] detached, raw w [B, T], cut [B, T] bool: truncated or masked), 0 / False off the
    mask. Example (token, cap 2): old - rollout = [0.0, 1.0, -1.0] -> w = [1, 2.718, 0.368]; truncate ->
    [1, 2, 0.368]; mask -> [1, 0, 0.368]; mask with low 0.5 (IcePop [0.5, 2]) -> [1, 0, 0].
    """
    if mode not in TIS_MODES:
        raise ValueError(f"unknown importance-sampling mode {mode!r}; valid: {', '.join(TIS_MODES)}")
    m = loss_mask.to(old_logprobs.dtype)
    w = torch.exp(log_ratio(old_logprobs, rollout_logprobs, loss_mask, level)) * m  # [B, T]
    if mode == "truncate":
        cut = (w > cap) & (m > 0)  # [B, T]
        return torch.where(cut, torch.full_like(w, cap), w), w, cut
    cut = ((w > cap) | (w < low)) & (m > 0)  # [B, T]
    return torch.where(cut, torch.zeros_like(w), w), w, cut


def sequence_keep(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, loss_mask: torch.Tensor, kind: str,
                  low: float, high: float) -> torch.Tensor:
    """[B, 1] 1.0 for a sequence whose geometric-mean or product ratio lies in [low, high], else 0.0.

    Example, geometric in [0.99, 1.01]: delta [[0, 1, -1], [0.005, 0.015, pad]] -> means 1.0 and
    exp(0.01) = 1.01005 -> [[1], [0]]; as a product, 1.0 and 1.0202 in [0.5, 2] -> [[1], [1]]."""
    if kind not in SEQ_MASKS[1:]:
        raise ValueError(f"unknown sequence mask {kind!r}; valid: {', '.join(SEQ_MASKS[1:])}")
    m = loss_mask.to(old_logprobs.dtype)
    delta = (old_logprobs - rollout_logprobs).detach()  # [B, T]
    ratio = torch.exp(sequence_log_ratio(delta, m, "geometric" if kind == "geometric" else "sequence"))  # [B, 1]
    return ((ratio >= low) & (ratio <= high)).to(old_logprobs.dtype)


def rollout_kl(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate [B, T] of KL(pi_rollout || pi_old) from tokens the engine sampled: rho - 1 - delta
    (>= 0, 0 when the two agree). Example: delta [0, 1, -1] -> [0, 0.718282, 0.367879]."""
    delta = (old_logprobs - rollout_logprobs).detach()  # [B, T]
    return (torch.exp(delta) - 1 - delta) * loss_mask.to(delta.dtype)
