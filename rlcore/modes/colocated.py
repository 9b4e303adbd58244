"""The colocated mode: every rank generates (its group's engine), then every rank trains (FSDP2 over the world),
then the new weights are synced into the engines in place; one step is a table of contents of its stages.

    torchrun --nproc-per-node 8 launch/train.py recipe=grpo

What every mode does around a step (the guard's counters, eval, the progress line, checkpoints, exports,
signals) is rlcore/modes/loop.py's; the run comes built from rlcore/trainer.py.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rlcore.distributed.collectives import all_max, all_sum
from rlcore.distributed.parallel import device_type
from rlcore.outputs.metrics import peak_memory_gb, reset_peak_memory
from rlcore.rollout.collect import collect
from rlcore.train import logprobs, update

if TYPE_CHECKING:
    from rlcore.modes.loop import Loop
    from rlcore.run import Run


def train_step(run: Run, step: int) -> dict[str, float]:
    t_step = time.perf_counter()
    reset_peak_memory()
    batch, metrics = collect(run, step)
    generate_peak = peak_memory_gb()
    run.engine.sleep()
    reset_peak_memory()

    t = time.perf_counter()
    check, advantage_metrics = logprobs.prepare(run, batch, step)  # old/ref logprobs, values, advantages
    t_logprobs = time.perf_counter() - t

    t = time.perf_counter()
    # On-policy the update's own forward gives the old logprobs: the drift check runs before its step.
    metrics |= advantage_metrics | update.update(run, batch, before_step=check)
    t_train = time.perf_counter() - t

    # A step with nothing applied left the policy as the engine held it: no new weights, but the engine still
    # wakes (a level-2 sleep discarded its weights: they are reloaded as they were).
    policy = run.trainer.policy
    stats = run.engine.sync_weights(policy) if metrics["optim/steps_applied"] else run.engine.wake(policy)
    n, length, tokens_all = all_sum(len(batch), batch.loss_mask.sum().item(), batch.attention_mask.sum().item())
    metrics |= {
        "response/length_mean": length / n, "tokens/sequences": n, "tokens/batch": tokens_all,
        **check.metrics(),
        "time/logprobs_s": t_logprobs, "time/train_s": t_train, "time/sync_s": stats.seconds,
        "time/step_s": time.perf_counter() - t_step,
        "throughput/train_tok_s": length / max(t_train, 1e-9),
        "sync/gb": stats.bytes / 1e9, "sync/peak_bucket_gb": stats.peak_bucket_bytes / 1e9,
    }
    # The sync as bandwidth (bytes handed to the engine per second) and as its share of the step.
    metrics |= {"throughput/sync_gb_s": stats.bytes / 1e9 / max(stats.seconds, 1e-9) if stats.bytes else 0.0,
                "time/sync_share": stats.seconds / metrics["time/step_s"]}
    # Measured peaks per phase next to the plan's bars (per GPU, or per CPU rank): the planner is checked
    # on every run.
    generate_peak, train_peak = all_max(generate_peak), all_max(peak_memory_gb())
    metrics |= {"memory/peak_gb": max(generate_peak, train_peak), "memory/generate_peak_gb": generate_peak,
                "memory/train_peak_gb": train_peak}
    return metrics


def train(run: Run, loop: Loop) -> dict[str, float]:
    """The colocated loop: every rank takes every stage of every step (rlcore/modes/loop.py: what is around it)."""
    steps = run.cfg.train.steps
    start = loop.begin(run.trained_models())
    if start:  # the engine started from model.path: it samples with the checkpointed weights from step one
        run.engine.sync_weights(run.trainer.policy)
    for step in range(start + 1, steps + 1):
        metrics = train_step(run, step) | loop.plan_metrics()
        loop.count(step, metrics)
        loop.evaluate(step, metrics)
        loop.record(step, metrics)
        loop.check_skipped(step)
        t = time.perf_counter()
        # The one exchange of the colocated mode: every rank hears of a signal to any rank after the same step.
        preempted = loop.stop.any_rank(device_type())
        path = loop.save(step, run.trained_models()) if preempted or loop.save_due(step) else None
        if loop.export_due(step):
            loop.export(step)
        if preempted:
            raise loop.preempted(step, path)
        loop.report.steps[-1]["time/checkpoint_s"] = time.perf_counter() - t
    return loop.summary
