"""What the split mesh (rlcore/modes/split.py) and streaming (rlcore/modes/stream/) share on the trainer side:
the probe the drift alarm reads after every weight transfer, a trainer rank's slice of a handed-over batch, one
off-policy train step with its staleness checked, and the loop state a checkpoint saves. Neither mode imports the
other; both import this."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from rlcore.batch import Batch
from rlcore.distributed.collectives import RunError, all_max, all_sum
from rlcore.distributed.parallel import device_type
from rlcore.models import build as models
from rlcore.outputs import checkpoint
from rlcore.outputs.metrics import peak_memory_gb, reset_peak_memory
from rlcore.rollout.collect import pad_id
from rlcore.train import logprobs, update

if TYPE_CHECKING:
    from rlcore.run import Run

PROBE_ROWS = 4  # sequences of the first batch every transfer is checked on


def probe_logprobs(run: Run, probe: list[list[int]]) -> list[list[float]]:
    """Trainer ranks (FSDP2 forward, a collective): log p(seq[t] | seq[:t]), t >= 1, at temperature 1."""
    L = max(len(s) for s in probe)
    ids = torch.tensor([s + [pad_id(run.tokenizer)] * (L - len(s)) for s in probe], device=device_type())
    mask = torch.tensor([[1] * len(s) + [0] * (L - len(s)) for s in probe], device=device_type())
    with torch.no_grad():
        lp = models.token_logprobs(run.trainer.policy, ids, mask, 1.0, False, run.cfg.train.logprob_chunk_tokens)
    return [lp[i, :len(s) - 1].float().cpu().tolist() for i, s in enumerate(probe)]


def probe_gaps(got: list[list[float]], expected: list[list[float]]) -> tuple[float, float]:
    """(mean, max) of |engine - trainer| logprob over the probe's tokens (logprobs.drift_error judges them)."""
    gaps = [abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e)]
    return sum(gaps) / max(len(gaps), 1), max(gaps, default=0.0)


def trainers_state(run: Run, messages: list[dict]) -> dict:
    """The loop state a checkpoint saves, the same on every rank: the counters of the first trainer rank
    (which writes trainer.pt) and rank 0's start-of-run eval."""
    evals = {k: v for k, v in messages[0]["loop"].items() if k.startswith("eval/")}
    return messages[run.dims.rollout_ranks]["loop"] | evals


def own_state(run: Run) -> dict:
    """This rank's batches in flight and the probe, as the checkpoint saved them. A trainer rank resumed with
    another trainer count puts the old trainers' slices of the batch back together, in order, and takes its own."""
    rank, path = dist.get_rank(), run.resume_from
    saved_world = checkpoint.saved_world(path)
    if not run.dims.trains(rank) or saved_world == dist.get_world_size():
        return torch.load(path / f"rank_{rank}.pt", weights_only=False)["split"]
    old = [torch.load(path / f"rank_{r}.pt", weights_only=False)["split"]
           for r in range(run.dims.rollout_ranks, saved_world)]
    batch = None  # saved after the last step: nothing in flight
    if old[0]["batch"] is not None:
        whole = Batch.cat([o["batch"] for o in old], pad_id(run.tokenizer))
        n, j = len(whole) // run.dims.trainers, rank - run.dims.rollout_ranks
        batch = whole.rows(j * n, (j + 1) * n)
    return {"batch": batch, "probe": old[0]["probe"]}


def my_slice(run: Run, messages: list[dict], shares: list[Batch] | None = None) -> Batch:
    """This trainer rank's rows of the batch the rollout ranks' shares make, in rank order (streaming: the shares
    the engines' first ranks handed over, in engine order)."""
    shares = shares or [m["batch"] for m in messages[:run.dims.generators]]
    whole = Batch.cat(shares, pad_id(run.tokenizer))
    n = len(whole) // run.dims.trainers
    j = dist.get_rank() - run.dims.rollout_ranks
    return whole.rows(j * n, (j + 1) * n)


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
    check, advantage_metrics = logprobs.prepare(run, batch, t, on_policy=k == 0)
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
