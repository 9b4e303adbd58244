"""The split mesh: some ranks only generate, the others only train, overlapping, at most k versions apart.

    torchrun --nproc-per-node 8 launch/train.py recipe=grpo rollout.ranks=4 rollout.max_staleness=1

Ranks [0, R) run the engines (blocks of rollout.tensor_parallel ranks) and everything a rollout needs:
prompts, environments, rewards, the held-out eval, the progress log (rank 0). Ranks [R, W) hold the models
and train them with FSDP2 over their own process group. Every rank still builds an engine (vLLM's external
launcher takes the whole world); a trainer rank's stays dormant (rlcore.rollout.engine). Each side runs the
stages unchanged, its collectives scoped to its own ranks (rlcore.collectives.set_scope).

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
algorithm.tis_cap (rlcore.objectives.tis_weights).
"""
from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from rlcore import checkpoint, logprobs, models, update
from rlcore.batch import Batch
from rlcore.collectives import Preempted, RunError, all_max, all_sum, set_scope
from rlcore.metrics import peak_memory_gb, reset_peak_memory
from rlcore.parallel import device_type
from rlcore.rollout.collect import collect, evaluate, pad_id
from rlcore.transfer import Link, exchange, first_error, receive_weights, send_weights

if TYPE_CHECKING:
    from rlcore.run import Run

PROBE_ROWS = 4  # sequences of the first batch every transfer is checked on


# ---- the probe: the drift alarm across the groups ----------------------------------------------------------

def probe_logprobs(run: Run, probe: list[list[int]]) -> list[list[float]]:
    """Trainer ranks (FSDP2 forward, a collective): log p(seq[t] | seq[:t]), t >= 1, at temperature 1."""
    L = max(len(s) for s in probe)
    ids = torch.tensor([s + [pad_id(run.tokenizer)] * (L - len(s)) for s in probe], device=device_type())
    mask = torch.tensor([[1] * len(s) + [0] * (L - len(s)) for s in probe], device=device_type())
    with torch.no_grad():
        lp = models.token_logprobs(run.policy, ids, mask, 1.0, False, run.cfg.train.logprob_chunk_tokens)
    return [lp[i, :len(s) - 1].float().cpu().tolist() for i, s in enumerate(probe)]


def probe_gap(run: Run, probe: list[list[int]], expected: list[list[float]]) -> float:
    """Rollout ranks: the largest |engine - trainer| logprob over the probe's tokens."""
    got = run.engine.prompt_logprobs(probe)
    return max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e))


# ---- the rollout side -------------------------------------------------------------------------------------

def sampled_with(batch: int, k: int) -> int:
    """The policy version that samples batch `batch` (1-based) at staleness k."""
    return max(0, batch - 1 - k)


def generate_side(run: Run, link: Link, report, stop) -> dict:
    """Ranks [0, R): sample, score and hand over batches; receive weights; eval; log (rank 0)."""
    cfg, k, steps = run.cfg, run.cfg.rollout.max_staleness, run.cfg.train.steps
    ready: dict[int, tuple[Batch, dict]] = {}  # batch -> (this rank's scored share, its metrics)
    summary: dict[str, float] = {}
    start, probe = 0, None

    def produce(b: int) -> None:
        t = time.perf_counter()
        reset_peak_memory()
        batch, metrics = collect(run, b)
        batch.versions = torch.full((len(batch),), run.engine.version, dtype=torch.long)
        metrics |= {"time/collect_s": time.perf_counter() - t, "memory/generate_peak_gb": all_max(peak_memory_gb())}
        ready[b] = (batch, metrics)

    def hand_over(t: int, error: str | None) -> None:
        """The batch half of exchange t: batch t+1 to the trainers (None after the last step), then the
        checkpoint when due or asked for."""
        nonlocal probe
        path = None
        if error is None and t < steps and t + 1 not in ready:
            produce(t + 1)  # k = 0: sampled with the weights just received
        share = ready[t + 1][0] if error is None and t < steps else None
        if t == 0 and dist.get_rank() == 0:
            probe = [row[keep].tolist() for row, keep in
                     zip(share.input_ids[:PROBE_ROWS], share.attention_mask[:PROBE_ROWS].bool())]
        messages = exchange(link, {"batch": share, "error": error, "stop": stop.received, "probe": probe})
        probe = messages[0]["probe"]
        if first_error(messages):
            raise RunError(first_error(messages))
        stopping = any(m["stop"] for m in messages)
        if t > 0 and (stopping or saves(cfg, t)):
            later = {b: v for b, v in ready.items() if b > t}  # not yet logged (batch t+1 is with the trainers)
            path = save(run, t, {"ready": later, "probe": probe, "summary": summary})
        if stopping:
            raise preempted(stop, t, path)

    if run.resume_from is not None:
        start, state = resume(run)
        ready, probe, summary = state["ready"], state["probe"], state["summary"]
        receive_weights(run, link)  # the checkpointed weights (logged already)
    else:
        if run.eval_rows:
            t0 = time.perf_counter()
            summary["eval/accuracy_start"] = evaluate(run)["eval/accuracy"]
            report.extra |= {"time/eval_s": time.perf_counter() - t0,
                             "eval/accuracy_start": summary["eval/accuracy_start"]}
            run.logger.log(0, {"eval/accuracy": summary["eval/accuracy_start"]})
        hand_over(0, None)
    last = time.perf_counter()  # the wall time between two exchanges is a step of the split loop
    for t in range(start, steps + 1):
        if t > start:
            header = receive_weights(run, link)
            if header.get("error"):
                raise RunError(header["error"])
            gap, error = probe_gap(run, probe, header["probe"]), None
            sync_s, sync_gb = header["receive_s"], header["receive_bytes"] / 1e9
            metrics = ready.pop(t)[1] | header["metrics"] | {
                "async/probe_logprob_diff_max": gap, "async/engine_version": run.engine.version,
                "time/sync_s": sync_s, "sync/gb": sync_gb, "throughput/sync_gb_s": sync_gb / max(sync_s, 1e-9)}
            if run.plan is not None:  # the rollout and trainer bars, beside each side's measured peak
                metrics |= {"memory/plan_generation_gb": run.plan.generation.total / 2**30,
                            "memory/plan_train_gb": run.plan.train.total / 2**30}
            if gap > cfg.rollout.logprob_diff_threshold:
                error = (f"async/probe_logprob_diff_max={gap:.3g} exceeds rollout.logprob_diff_threshold="
                         f"{cfg.rollout.logprob_diff_threshold:g} after the transfer of version {t}: the engine "
                         f"holds other weights than the trainers sent (transfer failed)")
            elif run.eval_rows and (t % cfg.train.eval_every == 0 or t == steps):
                t0 = time.perf_counter()
                metrics |= evaluate(run) | {"time/eval_s": time.perf_counter() - t0}
            metrics["time/wall_s"], last = time.perf_counter() - last, time.perf_counter()
            run.logger.log(t, metrics)
            summary |= metrics
            report.add(metrics)
            hand_over(t, error)
        # Sample ahead, at most k versions behind the weights the engine holds.
        b = max(ready, default=t + 1) + 1
        while b <= steps and sampled_with(b, k) <= run.engine.version:
            produce(b)
            b += 1
    return summary


def saves(cfg, t: int) -> bool:
    return t == cfg.train.steps or bool(cfg.train.save_every and t % cfg.train.save_every == 0)


def save(run: Run, t: int, state: dict):
    """Collective over every rank at the batch half of exchange t: the trainers' models, optimizers and
    schedulers (DCP), each rank's RNG and its batches in flight (`state`), the rollout ranks' prompt streams.
    A save that fails stops the run (every rank), as colocated."""
    t0 = time.perf_counter()
    trains, root = run.dims.trains(dist.get_rank()), run.run_dir / "checkpoints"
    try:
        path = checkpoint.save(root, t, run.trained_models() if trains else {}, run.prompts, {"step": t}, run.meta,
                               run.cfg.train.keep_checkpoints, run.tokenizer, extra={"split": state},
                               writer=run.dims.rollout_ranks)
    except checkpoint.SaveError as e:
        complete = checkpoint.scan(root)[0]
        raise RunError(f"{e}; " + (f"{complete[-1]} is intact" if complete else "there is no earlier checkpoint")) \
            from None
    run.logger.print(f"checkpoint {path} ({time.perf_counter() - t0:.1f} s)")
    return path


def preempted(stop, t: int, path) -> Preempted:
    name = signal.Signals(stop.received).name if stop.received else "a signal to another rank"
    if path is None:  # before the first step: nothing trained, nothing to save
        return Preempted(f"{name} before step 1; nothing to checkpoint; start again")
    return Preempted(f"{name} after step {t}; checkpoint {path} written; continue with resume=auto")


def resume(run: Run) -> tuple[int, dict]:
    """-> (the step the checkpoint was saved after, this rank's state in flight)."""
    trains = run.dims.trains(dist.get_rank())
    loop, notes = checkpoint.load(run.resume_from, run.trained_models() if trains else {}, run.prompts, run.group)
    for line in notes:
        run.logger.print(line)
    own = torch.load(run.resume_from / f"rank_{dist.get_rank()}.pt", weights_only=False)
    return loop["step"], own["split"]


# ---- the trainer side -------------------------------------------------------------------------------------

def my_slice(run: Run, messages: list[dict]) -> Batch:
    shares = [m["batch"] for m in messages[:run.dims.generators]]
    whole = Batch.cat(shares, pad_id(run.tokenizer))
    n = len(whole) // run.dims.trainers
    j = dist.get_rank() - run.dims.rollout_ranks
    return whole.rows(j * n, (j + 1) * n)


def train_side(run: Run, link: Link, stop) -> None:
    """Ranks [R, W): take batch t, train step t, send version t."""
    cfg, steps = run.cfg, run.cfg.train.steps
    k, in_a_row = cfg.rollout.max_staleness, 0

    def take(t: int) -> Batch | None:
        """The batch half of exchange t: this rank's slice of batch t+1, and the checkpoint when due."""
        nonlocal probe
        path = None
        messages = exchange(link, {"batch": None, "error": None, "stop": stop.received, "probe": None})
        if first_error(messages):
            raise RunError(first_error(messages))
        probe = messages[0]["probe"]
        batch = my_slice(run, messages) if t < steps else None
        stopping = any(m["stop"] for m in messages)
        if t > 0 and (stopping or saves(cfg, t)):
            path = save(run, t, {"batch": batch, "probe": probe})
        if stopping:
            raise preempted(stop, t, path)
        return batch

    if run.resume_from is not None:
        start, state = resume(run)
        batch, probe = state["batch"], state["probe"]
        send_weights(run, link, {"version": start, "metrics": {}, "probe": None, "error": None})
    else:
        start, probe = 0, None
        batch = take(0)
    skipped = 0
    for t in range(start + 1, steps + 1):
        error, metrics = None, {}
        try:
            metrics = train_step(run, batch, t, k)
            in_a_row = in_a_row + 1 if metrics.pop("train/skipped") else 0
            skipped += in_a_row > 0
            metrics["train/skipped_steps"] = skipped
            if in_a_row >= cfg.train.max_skipped_steps:
                raise RunError(f"{in_a_row} steps in a row had a non-finite loss or gradient (train.max_skipped_steps="
                               f"{cfg.train.max_skipped_steps}); stopped at step {t} with the weights of the last "
                               f"finite step")
        except RunError as e:  # the rollout ranks must hear of it before every rank stops
            error = str(e)
        send_weights(run, link, {"version": t, "metrics": metrics, "error": error,
                                 "probe": probe_logprobs(run, probe) if error is None else None})
        if error:
            raise RunError(error)
        batch = take(t)
        if t == steps or (cfg.train.export_every and t % cfg.train.export_every == 0):
            from rlcore import export
            export.export_hf(run.run_dir / "hf" / f"step_{t}", run.policy, cfg.model.path, run.tokenizer,
                             merged=cfg.lora.export_merged, group=run.train_group, writer=run.dims.rollout_ranks)


def train_step(run: Run, batch: Batch, t: int, k: int) -> dict[str, float]:
    """logprobs + update on the trainer ranks, with the staleness of the batch (versions behind t - 1)."""
    t_step = time.perf_counter()
    reset_peak_memory()
    behind = (t - 1) - batch.versions
    n, behind_sum = all_sum(len(batch), behind.sum().item())
    behind_max = all_max(behind.max().item())
    if behind_max > k:
        raise RunError(f"step {t} got samples {behind_max:.0f} versions behind, more than "
                       f"rollout.max_staleness={k}")
    t0 = time.perf_counter()
    # Off-policy (k >= 1) the engine's logprobs are an older policy's: no per-step equality to check; the
    # probe after each transfer is the drift alarm.
    check, advantage_metrics = logprobs.prepare(run, batch, t, None if k == 0 else float("inf"))
    t_logprobs = time.perf_counter() - t0
    t0 = time.perf_counter()
    metrics = advantage_metrics | update.update(run, batch, before_step=check)
    t_train = time.perf_counter() - t0
    length, tokens_all = all_sum(batch.loss_mask.sum().item(), batch.attention_mask.sum().item())
    metrics |= {"async/staleness_mean": behind_sum / n, "async/staleness_max": behind_max,
                "response/length_mean": length / n, "tokens/sequences": n, "tokens/batch": tokens_all,
                **check.metrics(), "time/logprobs_s": t_logprobs, "time/train_s": t_train,
                "time/step_s": time.perf_counter() - t_step, "throughput/train_tok_s": length / max(t_train, 1e-9),
                "memory/train_peak_gb": all_max(peak_memory_gb())}
    return metrics


# ---- the run ----------------------------------------------------------------------------------------------

def train(run: Run, report, stop) -> dict[str, float]:
    """Both sides of the split loop; returns the summary on the rollout ranks ({} on the trainer ranks)."""
    if run.cfg.rollout.stream:  # the engines never drain (rlcore/stream.py imports this module)
        from rlcore import stream
        return stream.train(run, report, stop)
    link = run.link
    if run.dims.generates(dist.get_rank()):
        set_scope(link.rollout)
        return generate_side(run, link, report, stop)
    set_scope(run.train_group)
    train_side(run, link, stop)
    return {}
