"""The LM head's logprobs and entropy of the next token: from full logits, or fused per chunk of tokens.

rlcore.models.build.token_logprobs runs the decoder and calls these: `from_logits` on [..., V] logits (the unchunked
path), `HeadLogprobs` on one chunk of final hidden states (the chunked path, `train.logprob_chunk_tokens`), and
`through_module` for a head that is not a plain Linear (recomputed under checkpointing instead).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class HeadLogprobs(torch.autograd.Function):
    """One chunk of the LM head fused with log-softmax, gather and entropy: hidden [N, H] -> logprobs of the
    targets [N] (and entropy [N]) at `temperature`, keeping only the logsumexp [N] (and entropy) for backward.

    Backward recomputes the chunk's logits z = (hidden W^T + b) / temperature and writes the gradient into them
    in place, with p = softmax(z):  d logp_target / dz = onehot(target) - p,  d entropy / dz = -p (z - E_p[z]),
    E_p[z] = lse - entropy. So a chunk holds two fp32 [N, V] tensors at most (z and p), where autograd through
    log_softmax would keep about five."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature: float, with_entropy: bool):
        z = F.linear(hidden, weight, bias)
        z = z.to(at_least_fp32(z.dtype)).div_(temperature)  # [N, V]
        lse = torch.logsumexp(z, dim=-1)  # [N]
        logprobs = z.gather(-1, targets[:, None]).squeeze(-1) - lse
        entropy = None
        if with_entropy:
            entropy = lse - (z - lse[:, None]).exp_().mul_(z).sum(-1)  # lse - sum_j p_j z_j
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)  # an output the loss does not use (the entropy metric) gets None
        return (logprobs, entropy) if with_entropy else (logprobs,)

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy=None):
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        z = F.linear(hidden, weight, bias)
        z = z.to(at_least_fp32(z.dtype)).div_(ctx.temperature)  # [N, V]
        p = (z - lse[:, None]).exp_()  # softmax
        entropy_term = grad_entropy is not None and entropy is not None
        if entropy_term:  # z <- g_H * p * (z - E_p[z]) = -g_H * d entropy / dz, while p is still p
            z.sub_((lse - entropy)[:, None]).mul_(p).mul_(grad_entropy[:, None])
        grad = p.zero_() if grad_logprobs is None else p.mul_(-grad_logprobs[:, None])  # p's buffer reused
        if grad_logprobs is not None:
            grad.scatter_add_(-1, targets[:, None], grad_logprobs[:, None])
        if entropy_term:
            grad.sub_(z)
        del z, p
        grad_z = grad.div_(ctx.temperature).to(hidden.dtype)  # [N, V] gradient of the head's output
        grad_hidden = grad_z @ weight if ctx.needs_input_grad[0] else None
        grad_weight = grad_z.t() @ hidden if ctx.needs_input_grad[1] else None
        grad_bias = grad_z.sum(0) if bias is not None and ctx.needs_input_grad[2] else None
        return grad_hidden, grad_weight, grad_bias, None, None, None


def at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)  # bf16 -> fp32; fp32 and fp64 stay


def through_module(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                   with_entropy: bool):
    """One chunk through an arbitrary head module: hidden [N, H] -> logits [N, V] -> (logprobs [N], entropy [N])."""
    out = from_logits(head(hidden), targets, temperature, with_entropy)
    return out if with_entropy else (out,)


def from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool):
    """logits [..., V] of the next token, targets [...] -> logprobs [...] (and entropy [...])."""
    logp = F.log_softmax(logits.to(at_least_fp32(logits.dtype)) / temperature, dim=-1)  # [..., V]
    logprobs = logp.gather(-1, targets[..., None]).squeeze(-1)  # [...]
    if not with_entropy:
        return logprobs
    return logprobs, -(logp.exp() * logp).sum(-1)
