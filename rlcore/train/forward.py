"""The trainer's forward passes over a batch, shared by the logprobs stage (no grad) and the update (with
grad): micro-batching or packing, the per-token logprob and value forwards, and when the on-policy update
takes its old logprobs from its own forward."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlcore.batch import Batch
from rlcore.distributed.parallel import device_type
from rlcore.models import build as models
from rlcore.train import packing

if TYPE_CHECKING:
    from rlcore.run import Run


def takes_old_logprobs(cfg) -> bool:
    """On-policy (one optimizer step per rollout batch): the update's own forward, before its only step,
    computes exactly the old logprobs, so `update` can fill them in and no separate pass is needed. Not when
    the advantages read them (the algorithm's `advantages_use_old_logprobs`, e.g. a KL penalty)."""
    return cfg.train.epochs_per_step == 1 and cfg.train.mini_batches == 1 and \
        not cfg.algorithm.advantages_use_old_logprobs


@torch.no_grad()
def forward_logprobs(run: Run, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    return forward_all(run, batch, logprobs_forward(run, model))  # [B, T]


@torch.no_grad()
def forward_values(run: Run, batch: Batch) -> torch.Tensor:
    return forward_all(run, batch, values_forward(run)) * batch.loss_mask  # [B, T]


def forward_all(run: Run, batch: Batch, forward) -> torch.Tensor:
    """One per-token output [B, T] for the whole batch, a micro-batch at a time (the trainer's poll after each)."""
    out = torch.zeros(batch.loss_mask.shape)  # [B, T]
    for rows in micro_batches(run, batch):
        result = per_token(run, batch.select(rows).to(device_type()) if rows is not None else None, forward)
        if rows is not None:
            out[rows] = result.cpu()
        poll(run)
    return out


def poll(run: Run, final: bool = False) -> None:
    """Between two micro-batches (final: before an optimizer step): the trainer's poll, if its mode set one
    (rlcore.run.Trainer.poll)."""
    if run.trainer is not None and run.trainer.poll is not None:
        run.trainer.poll(final)


def micro_batches(run: Run, batch: Batch) -> list[torch.Tensor | None]:
    t = run.cfg.train
    return packing.micro_batches(batch.attention_mask.sum(-1).tolist(), t.micro_batch_size,
                                 t.max_tokens_per_micro_batch)


def per_token(run: Run, micro: Batch | None, forward):
    """forward(input_ids, attention_mask, position_ids) -> per-token outputs [b, T] (or a tuple of them) for
    the micro-batch's rows: run on the padded rows, or on their packed row (a dummy's, unpacking to no
    rows, when micro is None)."""
    if not run.cfg.train.max_tokens_per_micro_batch:
        if micro.position_ids is not None:  # rows of several sequences: the positions alone separate them
            return forward(micro.input_ids, None, micro.position_ids)
        return forward(micro.input_ids, micro.attention_mask, None)
    # sdpa / eager compute the whole [N, N] packing mask: rows as wide as the longest sequence keep attention
    # ~N x longest; flash-attention's varlen path needs the one packed row (rlcore.train.packing.pack).
    split = run.cfg.model.attn_implementation != "flash_attention_2"
    packed = packing.dummy(device_type()) if micro is None else \
        packing.pack(micro.input_ids, micro.attention_mask, split=split, position_ids=micro.position_ids)
    return packed.unpack(forward(packed.input_ids, None, packed.position_ids))


def logprobs_forward(run: Run, model: torch.nn.Module, with_entropy: bool = False):
    cfg = run.cfg
    return lambda ids, mask, positions: models.token_logprobs(
        model, ids, mask, cfg.rollout.temperature, with_entropy, cfg.train.logprob_chunk_tokens, positions)


def values_forward(run: Run):
    return lambda ids, mask, positions: models.token_values(run.trainer.critic, ids, mask, positions)
