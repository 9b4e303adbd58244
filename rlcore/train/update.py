"""The update stage: the optimizer steps over a rollout batch (epochs x mini-batches x micro-batches, with
the non-finite guard). Its forward runs through rlcore/train/forward.py's micro-batching and packing."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import torch

from rlcore.algorithms.objectives import local_normaliser
from rlcore.batch import Batch, Normaliser
from rlcore.distributed import watchdog
from rlcore.distributed.collectives import all_max, all_sum
from rlcore.distributed.parallel import device_type
from rlcore.models import build as models
from rlcore.train.forward import logprobs_forward, micro_batches, per_token, poll, takes_old_logprobs, values_forward

if TYPE_CHECKING:
    from rlcore.run import Run


@watchdog.stage("update")
def update(run: Run, batch: Batch, before_step: Callable[[], None] | None = None) -> dict[str, float]:
    """epochs x mini-batches optimizer steps; each normalises by counts summed over ranks + micro-batches.
    The critic (when there is one) takes its own optimizer step on the same micro-batches.

    batch.old_logprobs None (only with takes_old_logprobs): they are the update's own logprobs, detached,
    written into the batch. `before_step` runs before each optimizer step (e.g. to check those logprobs
    before the step changes any weight)."""
    cfg, tr, dev = run.cfg, run.trainer, device_type()
    fill = batch.old_logprobs is None
    if fill:
        if not takes_old_logprobs(cfg):
            raise ValueError("batch.old_logprobs is missing: only an on-policy update (1 epoch, 1 mini-batch) "
                             "computes them itself")
        batch.old_logprobs = torch.zeros(batch.loss_mask.shape)  # [B, T]
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
            for index in micro_batches(run, mini):
                micro = mini.select(index).to(dev) if index is not None else None
                logprobs, entropy = per_token(run, micro, logprobs_forward(run, tr.policy, with_entropy=True))
                if micro is None:  # a dummy: the same passes as a real micro-batch, a loss of 0
                    loss, metrics = logprobs.sum() * 0, {}
                else:
                    if fill:  # one mini-batch: `index` indexes the whole batch
                        micro.old_logprobs = logprobs.detach()
                        batch.old_logprobs[index] = micro.old_logprobs.cpu()
                    loss, metrics = cfg.algorithm.loss(micro, logprobs, norm)
                    metrics["policy/entropy"] = (entropy.detach() * micro.loss_mask).sum() / max(norm.tokens, 1.0)
                loss.backward()
                loss_sum += loss.item()
                if tr.critic is not None:
                    values = per_token(run, micro, values_forward(run))
                    value_loss, value_metrics = (values.sum() * 0, {}) if micro is None else \
                        cfg.algorithm.value_loss(micro, values, norm)
                    value_loss.backward()
                    loss_sum += value_loss.item()
                    metrics |= value_metrics
                for k, v in metrics.items():
                    # A metric named *_max is a maximum (over micro-batches, ranks and optimizer steps).
                    v = float(v)
                    sums[k] = max(sums.get(k, -math.inf), v) if k.endswith("_max") else sums.get(k, 0.0) + v
                poll(run)
            poll(run, final=True)
            if before_step is not None:
                before_step()
            grad_norms.append(models.clip_grad_norm(tr.policy, cfg.optim.max_grad_norm))
            if tr.critic is not None:
                value_grad_norms.append(models.clip_grad_norm(tr.critic, cfg.critic.optim.max_grad_norm))
            # Non-finite guard: a NaN/inf loss (policy + critic) or gradient is never applied, and the rest
            # of the update is dropped (earlier optimizer steps of it stay applied). All numbers are global.
            if not step_is_finite(*all_sum(loss_sum), grad_norms[-1], *value_grad_norms[-1:]):
                for opt in (tr.optimizer, tr.critic_optimizer):
                    if opt is not None:
                        opt.zero_grad(set_to_none=True)
                skipped = True
                break
            applied += 1
            for opt, sched in ((tr.optimizer, tr.scheduler), (tr.critic_optimizer, tr.critic_scheduler)):
                if opt is not None:
                    opt.step()
                    sched.step()
                    opt.zero_grad(set_to_none=True)
    keys = sorted(k for k in sums if not k.endswith("_max"))
    totals = all_sum(*(sums[k] for k in keys))
    n_steps = len(grad_norms)
    out = {k: v / n_steps for k, v in zip(keys, totals)}
    out |= {k: all_max(sums[k]) for k in sorted(sums) if k.endswith("_max")}
    out["policy/grad_norm"] = sum(grad_norms) / n_steps
    out["optim/lr"] = tr.scheduler.get_last_lr()[0]
    if value_grad_norms:
        out["value/grad_norm"] = sum(value_grad_norms) / n_steps
    out["optim/steps_applied"] = applied
    out["train/skipped"] = float(skipped)
    return out


def step_is_finite(*values: float) -> bool:
    """True when every value (global loss sums, global gradient norms) is finite: pass numbers that are
    the same on every rank, so every rank skips together. A critic adds its loss and norm here."""
    return all(math.isfinite(v) for v in values)
