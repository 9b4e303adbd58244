"""The logprobs stage: the trainer's no-grad passes over a rollout batch before the update (old and
reference logprobs, values), the per-step drift check against the engine's own logprobs, and then the
algorithm's advantages, which may read them.

The forward helpers here (micro-batching, packing, the logprob and value forwards) are shared with the
update stage, whose own forward with gradients runs through the same `per_token`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlcore import lora, models, packing, watchdog
from rlcore.batch import Batch
from rlcore.collectives import RunError, all_max, all_sum, reduce_sum
from rlcore.parallel import device_type

if TYPE_CHECKING:
    from rlcore.run import Run


class DriftCheck:
    """The engine sampled with the weights the trainer holds: any gap between the engine's logprobs and
    the trainer's old logprobs (of the sampled tokens) is a broken weight sync, and stops the run.

    Runs once: in `prepare` when the old logprobs come from a separate pass, otherwise in the update
    (`before_step`) once its own forward has filled them in, before its optimizer step changes a weight;
    later calls do nothing."""

    def __init__(self, batch: Batch, threshold: float, step: int):
        self.batch, self.threshold, self.step = batch, threshold, step
        self.done, self.sum, self.tokens, self.max = False, 0.0, 0.0, 0.0

    def __call__(self) -> None:
        if self.done:
            return
        self.done, b = True, self.batch
        diff = (b.old_logprobs - b.rollout_logprobs).abs() * b.loss_mask  # [B, T]
        self.sum, self.tokens = all_sum(diff.sum().item(), b.loss_mask.sum().item())
        self.max = all_max(diff.max().item())
        if self.max > self.threshold:
            raise RunError(f"rollout/logprob_diff_max={self.max:.3g} exceeds rollout.logprob_diff_threshold="
                           f"{self.threshold:g} at step {self.step}: the inference engine holds stale or "
                           f"corrupted weights (weight sync failed)")

    def metrics(self) -> dict[str, float]:
        return {"rollout/logprob_diff_mean": self.sum / max(self.tokens, 1.0), "rollout/logprob_diff_max": self.max}


@watchdog.stage("logprobs")
def prepare(run: Run, batch: Batch, step: int, threshold: float | None = None) -> tuple[DriftCheck, dict[str, float]]:
    """Fill in what the update reads besides the weights: old logprobs (unless the on-policy update takes
    its own), reference logprobs, values, advantages. Returns the drift check, for the update to call
    before its optimizer step (it has run already when the old logprobs came from a pass here), and the
    advantages' metrics. `threshold` overrides rollout.logprob_diff_threshold (inf: measure, never stop,
    for samples of an older policy: rlcore/split.py)."""
    cfg = run.cfg
    check = DriftCheck(batch, cfg.rollout.logprob_diff_threshold if threshold is None else threshold, step)
    if not takes_old_logprobs(cfg):
        batch.old_logprobs = forward_logprobs(run, run.policy, batch)
        check()
    if run.reference is not None:
        batch.ref_logprobs = forward_logprobs(run, run.reference, batch)
    elif lora.uses_adapters_off(cfg):  # LoRA: the reference is the policy with its adapters switched off
        with lora.adapters_off(run.policy):
            batch.ref_logprobs = forward_logprobs(run, run.policy, batch)
    if run.critic is not None:
        batch.values = forward_values(run, batch)
    batch.advantages, metrics = cfg.algorithm.advantages(batch, reduce_sum)
    return check, metrics


def takes_old_logprobs(cfg) -> bool:
    """On-policy (one optimizer step per rollout batch): the update's own forward, before its only step,
    computes exactly the old logprobs, so `update` can fill them in and no separate pass is needed. Not when
    the advantages read them (an algorithm's optional `advantages_use_old_logprobs`, e.g. a KL penalty)."""
    return cfg.train.epochs_per_step == 1 and cfg.train.mini_batches == 1 and \
        not getattr(cfg.algorithm, "advantages_use_old_logprobs", False)


@torch.no_grad()
def forward_logprobs(run: Run, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    return forward_all(run, batch, logprobs_forward(run, model))  # [B, T]


@torch.no_grad()
def forward_values(run: Run, batch: Batch) -> torch.Tensor:
    return forward_all(run, batch, values_forward(run)) * batch.loss_mask  # [B, T]


def forward_all(run: Run, batch: Batch, forward) -> torch.Tensor:
    """One per-token output [B, T] for the whole batch, a micro-batch at a time."""
    out = torch.zeros(batch.loss_mask.shape)  # [B, T]
    for rows in micro_batches(run, batch):
        result = per_token(run, batch.select(rows).to(device_type()) if rows is not None else None, forward)
        if rows is not None:
            out[rows] = result.cpu()
    return out


def micro_batches(run: Run, batch: Batch) -> list[torch.Tensor | None]:
    t = run.cfg.train
    return packing.micro_batches(batch.attention_mask.sum(-1).tolist(), t.micro_batch_size,
                                 t.max_tokens_per_micro_batch)


def per_token(run: Run, micro: Batch | None, forward):
    """forward(input_ids, attention_mask, position_ids) -> per-token outputs [b, T] (or a tuple of them) for
    the micro-batch's rows: run on the padded rows, or on their packed row (a dummy's, unpacking to no
    rows, when micro is None)."""
    if not run.cfg.train.max_tokens_per_micro_batch:
        return forward(micro.input_ids, micro.attention_mask, None)
    # sdpa / eager compute the whole [N, N] packing mask: rows as wide as the longest sequence keep attention
    # ~N x longest; flash-attention's varlen path needs the one packed row (rlcore.packing.pack).
    split = run.cfg.model.attn_implementation != "flash_attention_2"
    packed = packing.dummy(device_type()) if micro is None else \
        packing.pack(micro.input_ids, micro.attention_mask, split=split)
    return packed.unpack(forward(packed.input_ids, None, packed.position_ids))


def logprobs_forward(run: Run, model: torch.nn.Module, with_entropy: bool = False):
    cfg = run.cfg
    return lambda ids, mask, positions: models.token_logprobs(
        model, ids, mask, cfg.rollout.temperature, with_entropy, cfg.train.logprob_chunk_tokens, positions)


def values_forward(run: Run):
    return lambda ids, mask, positions: models.token_values(run.critic, ids, mask, positions)
