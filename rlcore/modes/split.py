"""The split mesh: some ranks only generate, the others only train, overlapping, at most k versions apart.

    torchrun --nproc-per-node 8 launch/train.py recipe=grpo rollout.ranks=4 rollout.max_staleness=1

Ranks [0, R) run the engines (blocks of rollout.tensor_parallel ranks) and everything a rollout needs:
prompts, environments, rewards, the held-out eval, the progress log (rank 0). Ranks [R, W) hold the models
and train them with FSDP2 over their own process group. Every rank still builds an engine (vLLM's external
launcher takes the whole world); a trainer rank's stays dormant (rlcore.engine.rollout_engine). Each side runs the
stages unchanged, its collectives scoped to its own ranks (rlcore.distributed.collectives.set_scope).

The two sides meet only at exchanges, always in this order, so their collectives pair up without threads,
locks or polling. Exchange t (after the trainers' optimizer step t):
  1. weights: trainer rank R sends a header (version t, the step's metrics, its logprobs of a fixed probe
     batch, or an error) and then the policy unit by unit in checkpoint format, as the colocated sync streams
     it (one FSDP2 unit gathered at a time, one broadcast per dtype per unit over a group of rank R and the
     rollout ranks: NCCL on GPU, gloo on CPU), into each engine's in-place reload. The engine now holds
     version t; it scores the probe and compares with the trainer's (the drift alarm, exit 3 above
     rollout.logprob_diff_threshold). Then the eval (when due), the progress line, the checkpoint (when due).
  2. batch: every rank contributes to one all_gather_object over a gloo group: the rollout ranks their
     scored share of batch t+1 (whole prompt groups, each row tagged with the version that sampled it) and
     their errors or stop signals, the trainer ranks theirs. Trainer j takes the j-th slice of the batch.
Exchange 0 is the batch part only (batch 1, and the probe). Batch b is sampled with version
max(0, b - 1 - k): with k = 0 the engines wait for the new weights before sampling (on-policy, no overlap);
with k >= 1 they sample batch t+1+k with version t while the trainers train on batch t+1. A batch is
sampled whole by one version (an engine swaps weights only between its generation calls, never under a
request in flight), so staleness is exact: the version the trainer steps from (t - 1 at step t) minus the
batch's. The data order and the seeds are those of the colocated run (seeds from run seed, step, prompt).

Off-policy samples (k >= 1): the update's old logprobs are the trainer's own under the weights it steps from
(the proximal policy), the engine's are the behaviour policy's, and the loss is the decoupled PPO objective
(AReaL): the clipped ratio pi / pi_old times the behaviour weight pi_old / pi_rollout truncated at
algorithm.tis_cap (rlcore.algorithms.corrections.tis_weights).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from rlcore.batch import Batch
from rlcore.distributed.collectives import RunError, all_max, set_scope
from rlcore.modes.offpolicy import (PROBE_ROWS, my_slice, own_state, probe_gaps, probe_logprobs, train_step,
                                   trainers_state)
from rlcore.modes.transfer import Link, error_in, exchange, receive_weights, send_weights
from rlcore.outputs.metrics import peak_memory_gb, reset_peak_memory
from rlcore.rollout.collect import collect
from rlcore.train.logprobs import drift_error

if TYPE_CHECKING:
    from rlcore.modes.loop import Loop
    from rlcore.run import Run


# ---- the probe's check on the rollout side ------------------------------------------------------------

def probe_gap(run: Run, probe: list[list[int]], expected: list[list[float]]) -> tuple[float, float]:
    """Rollout ranks: the (mean, max) |engine - trainer| logprob over the probe's tokens."""
    return probe_gaps(run.engine.prompt_logprobs(probe), expected)


# ---- the rollout side -------------------------------------------------------------------------------------

def sampled_with(batch: int, k: int) -> int:
    """The policy version that samples batch `batch` (1-based) at staleness k."""
    return max(0, batch - 1 - k)


def generate_side(run: Run, link: Link, loop: Loop) -> dict:
    """Ranks [0, R): sample, score and hand over batches; receive weights; eval; log (rank 0)."""
    cfg, k, steps = run.cfg, run.cfg.rollout.max_staleness, run.cfg.train.steps
    ready: dict[int, tuple[Batch, dict]] = {}  # batch -> (this rank's scored share, its metrics)
    probe, failed = None, []  # failed: why sampling stopped (the trainers hear it at the next exchange)

    def produce(b: int) -> None:
        if failed:
            return
        t = time.perf_counter()
        reset_peak_memory()
        try:
            batch, metrics = collect(run, b)
        except RunError as e:  # every rollout rank raised it together (collect agrees); the trainers wait in
            failed.append(str(e))  # the exchange, so it goes to them there, and then every rank stops
            return
        batch.versions = torch.full((len(batch),), run.engine.version, dtype=torch.long)
        metrics |= {"time/collect_s": time.perf_counter() - t, "memory/generate_peak_gb": all_max(peak_memory_gb())}
        ready[b] = (batch, metrics)

    def hand_over(t: int, error: str | None, save: bool = True) -> None:
        """The batch half of exchange t: batch t+1 to the trainers (None after the last step), then the
        checkpoint when due or asked for (`save`: not when resuming from the checkpoint of step t itself)."""
        nonlocal probe
        path = None
        if error is None and t < steps and t + 1 not in ready:
            produce(t + 1)  # k = 0: sampled with the weights just received
        error = error or (failed[0] if failed else None)
        share = ready[t + 1][0] if error is None and t < steps else None
        if t == 0 and dist.get_rank() == 0 and share is not None:
            probe = [row[keep].tolist() for row, keep in
                     zip(share.input_ids[:PROBE_ROWS], share.attention_mask[:PROBE_ROWS].bool())]
        messages = exchange(link, {"batch": share, "error": error, "stop": loop.stop.received, "probe": probe,
                                   "loop": loop.state if dist.get_rank() == 0 else None})
        probe = messages[0]["probe"]
        if error_in(messages):
            raise RunError(error_in(messages))
        loop.state = trainers_state(run, messages)
        stopping = any(m["stop"] for m in messages)
        if t > 0 and save and (stopping or loop.save_due(t)):
            later = {b: v for b, v in ready.items() if b > t}  # not yet logged (batch t+1 is with the trainers)
            path = loop.save(t, {}, {"split": {"ready": later, "probe": probe}}, writer=run.dims.rollout_ranks)
        if stopping:
            raise loop.preempted(t, path)

    start = loop.begin({})
    if run.resume_from is not None:
        state = own_state(run)
        ready, probe = state["ready"], state["probe"]
        receive_weights(run, link)  # the checkpointed weights (logged already)
        if start < steps and start + 1 not in ready:  # saved at the end of a shorter run: nothing was sampled ahead
            run.logger.print(f"resume: the checkpoint ended a run at step {start}: batch {start + 1} is sampled "
                             f"with version {start} (a run of {steps} steps from the start samples it with version "
                             f"{sampled_with(start + 1, k)})")
            hand_over(start, None, save=False)
    else:
        hand_over(0, None)
    last = time.perf_counter()  # the wall time between two exchanges is a step of the split loop
    for t in range(start, steps + 1):
        if t > start:
            header = receive_weights(run, link)
            if header.get("error"):
                raise RunError(header["error"])
            (mean, gap), error = probe_gap(run, probe, header["probe"]), None
            sync_s, sync_gb = header["receive_s"], header["receive_bytes"] / 1e9
            metrics = ready.pop(t)[1] | header["metrics"] | {
                "async/probe_logprob_diff_max": gap, "async/probe_logprob_diff_mean": mean,
                "async/engine_version": run.engine.version,
                "time/sync_s": sync_s, "sync/gb": sync_gb, "throughput/sync_gb_s": sync_gb / max(sync_s, 1e-9)}
            metrics |= loop.plan_metrics()  # the rollout and trainer bars, beside each side's measured peak
            drift = drift_error(cfg, mean, gap)
            if drift:
                error = (f"async/probe_{drift} after the transfer of version {t}: the engine holds other weights "
                         f"than the trainers sent (transfer failed)")
            else:
                loop.evaluate(t, metrics)
            metrics["time/wall_s"], last = time.perf_counter() - last, time.perf_counter()
            loop.record(t, metrics)
            hand_over(t, error)
        # Sample ahead, at most k versions behind the weights the engine holds.
        b = max(ready, default=t + 1) + 1
        while b <= steps and sampled_with(b, k) <= run.engine.version:
            produce(b)
            b += 1
    return loop.summary


# ---- the trainer side -------------------------------------------------------------------------------------

def train_side(run: Run, link: Link, loop: Loop) -> None:
    """Ranks [R, W): take batch t, train step t, send version t."""
    cfg, steps = run.cfg, run.cfg.train.steps
    k, leader = cfg.rollout.max_staleness, dist.get_rank() == run.dims.rollout_ranks

    def take(t: int, save: bool = True) -> Batch | None:
        """The batch half of exchange t: this rank's slice of batch t+1, and the checkpoint when due (`save`: not
        when resuming from the checkpoint of step t itself)."""
        nonlocal probe
        path = None
        messages = exchange(link, {"batch": None, "error": None, "stop": loop.stop.received, "probe": None,
                                   "loop": loop.state if leader else None})
        if error_in(messages):
            raise RunError(error_in(messages))
        probe = messages[0]["probe"]
        loop.state = trainers_state(run, messages)
        batch = my_slice(run, messages) if t < steps else None
        stopping = any(m["stop"] for m in messages)
        if t > 0 and save and (stopping or loop.save_due(t)):
            path = loop.save(t, run.trained_models(), {"split": {"batch": batch, "probe": probe}},
                             writer=run.dims.rollout_ranks)
        if stopping:
            raise loop.preempted(t, path)
        return batch

    start = loop.begin(run.trained_models())
    if run.resume_from is not None:
        state = own_state(run)
        batch, probe = state["batch"], state["probe"]
        send_weights(run, link, {"version": start, "metrics": {}, "probe": None, "error": None})
        if batch is None and start < steps:  # saved at the end of a shorter run: batch start+1 is sampled now
            batch = take(start, save=False)
    else:
        probe = None
        batch = take(0)
    for t in range(start + 1, steps + 1):
        error, metrics = None, {}
        try:
            metrics = train_step(run, batch, t, k)
            loop.count(t, metrics)
            loop.check_skipped(t)
        except RunError as e:  # the rollout ranks must hear of it before every rank stops
            error = str(e)
        send_weights(run, link, {"version": t, "metrics": metrics, "error": error,
                                 "probe": probe_logprobs(run, probe) if error is None else None})
        if error:
            raise RunError(error)
        batch = take(t)
        if loop.export_due(t):
            loop.export(t, group=run.trainer.group, writer=run.dims.rollout_ranks)


# ---- the run ----------------------------------------------------------------------------------------------

def train(run: Run, loop: Loop) -> dict[str, float]:
    """Both sides of the split loop; returns the summary on the rollout ranks ({} on the trainer ranks)."""
    link = run.link
    if run.dims.generates(dist.get_rank()):
        set_scope(link.rollout)
        return generate_side(run, link, loop)
    set_scope(run.trainer.group)
    train_side(run, link, loop)
    return {}
