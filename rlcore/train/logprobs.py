"""The logprobs stage: the trainer's no-grad passes over a rollout batch before the update (old and
reference logprobs, values), the per-step drift check against the engine's own logprobs, and then the
algorithm's advantages, which may read them. Its forwards run through rlcore/train/forward.py, as the update's do.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from rlcore.algorithms.corrections import rollout_kl
from rlcore.batch import Batch
from rlcore.distributed import watchdog
from rlcore.distributed.collectives import RunError, all_max, all_sum, reduce_sum
from rlcore.models import lora
from rlcore.train.forward import forward_logprobs, forward_values, takes_old_logprobs

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
        self.done, self.sum, self.tokens, self.max, self.kl = False, 0.0, 0.0, 0.0, 0.0

    def __call__(self) -> None:
        if self.done:
            return
        self.done, b = True, self.batch
        diff = (b.old_logprobs - b.rollout_logprobs).abs() * b.loss_mask  # [B, T]
        kl = rollout_kl(b.old_logprobs, b.rollout_logprobs, b.loss_mask)  # [B, T]
        self.sum, self.tokens, self.kl = all_sum(diff.sum().item(), b.loss_mask.sum().item(), kl.sum().item())
        self.max = all_max(diff.max().item())
        if self.max > self.threshold:
            raise RunError(f"rollout/logprob_diff_max={self.max:.3g} exceeds rollout.logprob_diff_threshold="
                           f"{self.threshold:g} at step {self.step}: the inference engine holds stale or "
                           f"corrupted weights (weight sync failed)")

    def metrics(self) -> dict[str, float]:
        # rollout/kl: k3 estimate of KL(pi_rollout || pi_old) per token, the mismatch the corrections face.
        return {"rollout/logprob_diff_mean": self.sum / max(self.tokens, 1.0), "rollout/logprob_diff_max": self.max,
                "rollout/kl": self.kl / max(self.tokens, 1.0)}


@watchdog.stage("logprobs")
def prepare(run: Run, batch: Batch, step: int, on_policy: bool = True) -> tuple[DriftCheck, dict[str, float]]:
    """Fill in what the update reads besides the weights: old logprobs (unless the on-policy update takes
    its own), reference logprobs, values, advantages. Returns the drift check, for the update to call
    before its optimizer step (it has run already when the old logprobs came from a pass here), and the
    advantages' metrics. Off-policy (samples of an older policy: rlcore/modes/split.py) the check measures the gap
    and never stops the run: the engine's logprobs are not the trainer's by design."""
    cfg = run.cfg
    check = DriftCheck(batch, cfg.rollout.logprob_diff_threshold if on_policy else float("inf"), step)
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
