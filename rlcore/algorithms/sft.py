"""SFT: supervised fine-tuning, the negative log-likelihood of target tokens under teacher forcing.

Not an RL algorithm: it warm-starts a policy before RL (rlcore.tasks.tiny uses it), and it is the smallest loss to
read first. Shapes follow rlcore.batch: position t of the logits scores token t + 1 of input_ids, so a
sequence of L tokens gives T = L - 1 predictions.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def sft_loss(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    num_tokens: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-mean NLL over the target tokens.

        loss = -sum_t loss_mask[t] * log p(input_ids[t + 1] | input_ids[:t + 1]) / num_tokens

    logits [B, L, V], input_ids [B, L], loss_mask [B, T = L - 1]: 1 where token t + 1 is a target (e.g. an
    answer token), 0 on prompt and padding. A fractional mask weighs tokens: rlcore.tasks.tiny gives two answers
    to one prompt weights 0.2 and 0.8.
    num_tokens: the count to divide by. Default: this call's loss_mask.sum(). Pass the sum over every
    micro-batch and rank of one optimizer step (as the RL losses do) to make the gradient independent of how
    the step's batch was split.

    Example: one sequence [a, b, c] with loss_mask [0, 1] scores only c; if p(c | a, b) = 0.5 then
    loss = -log 0.5 = 0.693. With loss_mask [1, 1] and p(b | a) = 0.25: loss = (1.386 + 0.693) / 2 = 1.040.

    Metrics (detached scalars): sft/nll (this call's contribution to the step's loss), sft/tokens (its mask sum).
    """
    if loss_mask.shape != (input_ids.shape[0], input_ids.shape[1] - 1):
        raise ValueError(f"loss_mask must be [B, L - 1] = {[input_ids.shape[0], input_ids.shape[1] - 1]}, "
                         f"got {list(loss_mask.shape)}")
    targets = input_ids[:, 1:]  # [B, T]
    # fp32 log-softmax: a bf16 one loses the small differences between likely tokens.
    nll = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), targets.flatten(), reduction="none")  # [B * T]
    mask = loss_mask.to(nll.dtype)  # [B, T]
    total = (nll.view_as(mask) * mask).sum()
    count = mask.sum() if num_tokens is None else torch.as_tensor(num_tokens, dtype=nll.dtype)
    # An all-zero mask gives loss 0 (and no gradient), not 0 / 0.
    loss = total / count.clamp(min=1e-8)
    return loss, {"sft/nll": loss.detach(), "sft/tokens": mask.sum().detach()}
