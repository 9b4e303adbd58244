"""The logprobs stage: the trainer's no-grad passes over a rollout batch before the update (old and
reference logprobs, values), the per-step drift check against the engine's own logprobs, and then the
algorithm's advantages, which may read them. Its forwards run through rlcore/train/forward.py, as the update's do.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlcore.algorithms.corrections import rollout_kl
from rlcore.batch import Batch
from rlcore.distributed import watchdog
from rlcore.distributed.collectives import RunError, all_max, all_sum, reduce_sum
from rlcore.models import lora
from rlcore.train.forward import forward_logprobs, forward_values, takes_old_logprobs

if TYPE_CHECKING:
    from rlcore.run import Run


# Bins of |engine - trainer| logprob for the distribution's summary: 5 per decade from 1e-8 to 1e2 (a histogram
# sums over ranks exactly; a quantile is read as its bin's upper edge, so within a factor 10**0.2 = 1.58).
EDGES = torch.logspace(-8, 2, 51, dtype=torch.float64)
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}


def exact_engine(cfg) -> bool:
    """An fp32 engine computes as the trainer does: any gap is a broken sync. In bf16 (or fp16) the kernels round
    differently and single tokens' gaps have heavy tails (near-ties, MoE routing flips): only the mean is checked."""
    compute = cfg.model.mixed_precision if cfg.model.mixed_precision != "none" else cfg.model.dtype
    return compute == "float32"


def drift_error(cfg, mean: float, max_: float) -> str | None:
    """The drift alarm's verdict on a step's (or a probe's) |engine - trainer| logprob gaps, per engine dtype:
    fp32, the largest gap against rollout.logprob_diff_threshold; bf16, the mean gap per token against
    rollout.logprob_diff_mean_threshold (docs/plan.md: why, and what the peers measured)."""
    r = cfg.rollout
    if exact_engine(cfg):
        if max_ > r.logprob_diff_threshold:
            return f"logprob_diff_max={max_:.3g} exceeds rollout.logprob_diff_threshold={r.logprob_diff_threshold:g}"
    elif mean > r.logprob_diff_mean_threshold:
        return (f"logprob_diff_mean={mean:.3g} exceeds rollout.logprob_diff_mean_threshold="
                f"{r.logprob_diff_mean_threshold:g} (a {cfg.model.mixed_precision} engine: the mean is checked)")
    return None


def histogram(diff: torch.Tensor) -> list[float]:
    """Counts of the values of `diff` per bin of EDGES (bin 0: below 1e-8, the last: above 1e2)."""
    return torch.bincount(torch.bucketize(diff.double(), EDGES), minlength=len(EDGES) + 1).tolist()


def quantile(counts: list[float], q: float) -> float:
    """The upper edge of the bin holding the q-th quantile (0 when it is below 1e-8, inf above 1e2)."""
    total, seen = sum(counts), 0.0
    for i, c in enumerate(counts):
        seen += c
        if seen >= q * total and total:
            return 0.0 if i == 0 else float(EDGES[i]) if i < len(EDGES) else float("inf")
    return 0.0


class DriftCheck:
    """The engine sampled with the weights the trainer holds: a gap between the engine's logprobs and the trainer's
    old logprobs (of the sampled tokens) beyond rounding is a broken weight sync, and stops the run (`drift_error`:
    per engine dtype). The whole distribution's summary is logged every step.

    Runs once: in `prepare` when the old logprobs come from a separate pass, otherwise in the update
    (`before_step`) once its own forward has filled them in, before its optimizer step changes a weight;
    later calls do nothing."""

    def __init__(self, batch: Batch, cfg, step: int, stops: bool = True):
        self.batch, self.cfg, self.step, self.stops = batch, cfg, step, stops
        self.done, self.sum, self.tokens, self.max, self.kl, self.counts = False, 0.0, 0.0, 0.0, 0.0, []

    def __call__(self) -> None:
        if self.done:
            return
        self.done, b = True, self.batch
        mask = b.loss_mask.bool()
        diff = (b.old_logprobs - b.rollout_logprobs).abs() * b.loss_mask  # [B, T]
        kl = rollout_kl(b.old_logprobs, b.rollout_logprobs, b.loss_mask)  # [B, T]
        self.sum, self.tokens, self.kl, *self.counts = all_sum(diff.sum().item(), b.loss_mask.sum().item(),
                                                               kl.sum().item(), *histogram(diff[mask]))
        self.max = all_max(diff.max().item())
        error = drift_error(self.cfg, self.sum / max(self.tokens, 1.0), self.max) if self.stops else None
        if error:
            raise RunError(f"rollout/{error} at step {self.step}: the inference engine holds stale or corrupted "
                           f"weights (weight sync failed)")

    def metrics(self) -> dict[str, float]:
        # rollout/kl: k3 estimate of KL(pi_rollout || pi_old) per token, the mismatch the corrections face.
        return {"rollout/logprob_diff_mean": self.sum / max(self.tokens, 1.0), "rollout/logprob_diff_max": self.max,
                **{f"rollout/logprob_diff_{k}": quantile(self.counts, q) for k, q in QUANTILES.items()},
                "rollout/kl": self.kl / max(self.tokens, 1.0)}


@watchdog.stage("logprobs")
def prepare(run: Run, batch: Batch, step: int, on_policy: bool = True) -> tuple[DriftCheck, dict[str, float]]:
    """Fill in what the update reads besides the weights: old logprobs (unless the on-policy update takes
    its own), reference logprobs, values, advantages. Returns the drift check, for the update to call
    before its optimizer step (it has run already when the old logprobs came from a pass here), and the
    advantages' metrics. Off-policy (samples of an older policy: rlcore/modes/split.py) the check measures the gap
    and never stops the run: the engine's logprobs are not the trainer's by design."""
    cfg = run.cfg
    check = DriftCheck(batch, cfg, step, stops=on_policy)
    if not takes_old_logprobs(cfg):
        batch.old_logprobs = forward_logprobs(run, run.trainer.policy, batch)
        check()
    if run.trainer.reference is not None:
        batch.ref_logprobs = forward_logprobs(run, run.trainer.reference, batch)
    elif run.models.reference == "adapters_off":  # LoRA: the reference is the policy with its adapters switched off
        with lora.adapters_off(run.trainer.policy):
            batch.ref_logprobs = forward_logprobs(run, run.trainer.policy, batch)
    if run.trainer.critic is not None:
        batch.values = forward_values(run, batch)
    batch.advantages, metrics = cfg.algorithm.advantages(batch, reduce_sum)
    if run.models.critic:  # the critic's targets
        batch.returns = cfg.algorithm.returns(batch, reduce_sum)
    return check, metrics
