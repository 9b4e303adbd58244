"""The update stage: the trainer's forward passes over a rollout batch (old / reference logprobs, values)
and the optimizer steps (epochs x mini-batches x micro-batches, with the non-finite guard)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from rlcore import models
from rlcore.batch import Batch, Normaliser
from rlcore.collectives import all_sum
from rlcore.objectives import local_normaliser
from rlcore.parallel import device_type

if TYPE_CHECKING:
    from rlcore.trainer import Run


@torch.no_grad()
def forward_logprobs(run: Run, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    dev, mbs = device_type(), run.cfg.train.micro_batch_size
    out = [models.token_logprobs(model, batch.input_ids[i:i + mbs].to(dev), batch.attention_mask[i:i + mbs].to(dev),
                                 run.cfg.rollout.temperature, chunk_tokens=run.cfg.train.logprob_chunk_tokens).cpu()
           for i in range(0, len(batch), mbs)]
    return torch.cat(out)  # [B, T]


@torch.no_grad()
def forward_values(run: Run, batch: Batch) -> torch.Tensor:
    dev, mbs = device_type(), run.cfg.train.micro_batch_size
    out = [models.token_values(run.critic, batch.input_ids[i:i + mbs].to(dev),
                               batch.attention_mask[i:i + mbs].to(dev)).cpu() for i in range(0, len(batch), mbs)]
    return torch.cat(out) * batch.loss_mask  # [B, T]


def update(run: Run, batch: Batch) -> dict[str, float]:
    """epochs x mini-batches optimizer steps; each normalises by counts summed over ranks + micro-batches.
    The critic (when there is one) takes its own optimizer step on the same micro-batches."""
    cfg, dev = run.cfg, device_type()
    rows = len(batch) // cfg.train.mini_batches
    sums: dict[str, float] = {}
    grad_norms, value_grad_norms, applied, skipped = [], [], 0, False
    for _ in range(cfg.train.epochs_per_step):
        if skipped:
            break
        for start in range(0, len(batch), rows):
            mini = batch.rows(start, start + rows)
            local = local_normaliser(mini.loss_mask)  # summed over this rank's micro-batches...
            tokens, sequences = all_sum(local.tokens, local.sequences)  # ...and over every rank
            norm = Normaliser(tokens, sequences, max_len=batch.max_model_tokens)
            loss_sum = 0.0
            for i in range(0, len(mini), cfg.train.micro_batch_size):
                micro = mini.rows(i, i + cfg.train.micro_batch_size).to(dev)
                logprobs, entropy = models.token_logprobs(run.policy, micro.input_ids, micro.attention_mask,
                                                          cfg.rollout.temperature, with_entropy=True,
                                                          chunk_tokens=cfg.train.logprob_chunk_tokens)
                loss, metrics = cfg.algorithm.loss(micro, logprobs, norm)
                loss.backward()
                loss_sum += loss.item()
                metrics["policy/entropy"] = (entropy.detach() * micro.loss_mask).sum() / max(norm.tokens, 1.0)
                if run.critic is not None:
                    values = models.token_values(run.critic, micro.input_ids, micro.attention_mask)
                    value_loss, value_metrics = cfg.algorithm.value_loss(micro, values, norm)
                    value_loss.backward()
                    loss_sum += value_loss.item()
                    metrics |= value_metrics
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
            grad_norms.append(models.clip_grad_norm(run.policy, cfg.optim.max_grad_norm))
            if run.critic is not None:
                value_grad_norms.append(models.clip_grad_norm(run.critic, cfg.critic.optim.max_grad_norm))
            # Non-finite guard: a NaN/inf loss (policy + critic) or gradient is never applied, and the rest
            # of the update is dropped (earlier optimizer steps of it stay applied). All numbers are global.
            if not step_is_finite(*all_sum(loss_sum), grad_norms[-1], *value_grad_norms[-1:]):
                for opt in (run.optimizer, run.critic_optimizer):
                    if opt is not None:
                        opt.zero_grad(set_to_none=True)
                skipped = True
                break
            applied += 1
            for opt, sched in ((run.optimizer, run.scheduler), (run.critic_optimizer, run.critic_scheduler)):
                if opt is not None:
                    opt.step()
                    sched.step()
                    opt.zero_grad(set_to_none=True)
    keys = sorted(sums)
    totals = all_sum(*(sums[k] for k in keys))
    n_steps = len(grad_norms)
    out = {k: v / n_steps for k, v in zip(keys, totals)}
    out["policy/grad_norm"] = sum(grad_norms) / n_steps
    out["optim/lr"] = run.scheduler.get_last_lr()[0]
    if value_grad_norms:
        out["value/grad_norm"] = sum(value_grad_norms) / n_steps
    out["optim/steps_applied"] = applied
    out["train/skipped"] = float(skipped)
    return out


def step_is_finite(*values: float) -> bool:
    """True when every value (global loss sums, global gradient norms) is finite: pass numbers that are
    the same on every rank, so every rank skips together. A critic adds its loss and norm here."""
    return all(math.isfinite(v) for v in values)
