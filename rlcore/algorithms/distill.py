"""On-policy distillation: the student samples, a frozen teacher scores every sampled token, and the
per-token reverse KL is the signal (Thinking Machines, "On-Policy Distillation", 2025; Qwen3, arXiv:2505.09388
sec. 4.5; slime's docs/en/advanced/on-policy-distillation.md for the form with a task reward).

With d_t = log pi_old(y_t | h_t) - log pi_T(y_t | h_t) on the tokens the student sampled (a one-sample
estimate of KL(pi_student || pi_T)(h_t)), the per-token advantage is

    A_t = task_weight * A_task - kl_weight * d_t

where A_task is the group advantage of the task reward (GRPO's; task_weight 0 = pure distillation, the
Thinking Machines recipe) and kl_weight is slime's lambda. The loss is rlcore.algorithms.objectives.PolicyLoss on A_t.

Example, one sequence of three tokens: log pi = [-0.5, -2, -1], log pi_T = [-0.3, -3, -1] -> d = [-0.2, 1, 0];
pure distillation (kl_weight 1) A = [0.2, -1, 0] and the sampled reverse KL is mean(d) = 0.266667; with a task
advantage 0.5 and task_weight 1: kl_weight 1 -> [0.7, -0.5, 0.5], kl_weight 0.5 -> [0.6, 0, 0.5].

The teacher: any causal LM rlcore can load (algorithm.teacher, a folder), built and sharded with FSDP2 in the
reference model's place (no engine serves it: the trainer already runs a no-grad pass per micro-batch for the
reference, so scoring costs one forward and no extra engine memory); its logprobs arrive as batch.ref_logprobs.
It must share the student's tokenizer: d_t compares two models' probabilities of the same token id, so a
teacher whose vocabulary or token->id map differs is refused before anything loads (one line, exit 2).

Departures: no discount over later tokens (Thinking Machines found none helps); no whitening of A_t (the
scale of the KL is the signal); with kl_coef > 0 the KL loss term is to the teacher too (it holds the
reference's place); LoRA is refused (its reference is the student with adapters off, not a teacher).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rlcore.algorithms.objectives import PolicyLoss, Reduce, global_token_mean, group_advantages, no_reduce
from rlcore.batch import Batch


def distill_advantages(old_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, loss_mask: torch.Tensor,
                       kl_weight: float, task: torch.Tensor | None = None, task_weight: float = 0.0) -> torch.Tensor:
    """[B, T] task_weight * task - kl_weight * (old - teacher), 0 off the mask (`task` [B, T] or None)."""
    m = loss_mask.float()
    adv = -kl_weight * (old_logprobs - teacher_logprobs) * m  # [B, T]
    return adv + task_weight * task * m if task is not None and task_weight else adv


@dataclass
class Distill(PolicyLoss):
    """On-policy distillation's settings (the loss fields come from PolicyLoss)."""

    teacher: str = ""  # folder of the teacher (a causal LM with the student's tokenizer); required
    kl_weight: float = 1.0  # lambda: weight of the reverse KL -(log pi - log pi_T) in each token's advantage
    task_weight: float = 0.0  # weight of the task reward's group advantage; 0 = pure distillation
    scale_rewards: bool = True  # task advantage: divide by the group's reward std
    eps: float = 1e-6  # added to the group std, reward units

    needs_reference = True  # the teacher, in the reference model's place
    advantages_use_old_logprobs = True  # d_t reads the student's logprobs of the sampled tokens

    def validate(self, cfg) -> None:
        super().validate(cfg)
        if not self.teacher:
            raise ValueError("algorithm.teacher is empty: on-policy distillation needs a teacher model folder")
        if not self.kl_weight > 0 or not self.task_weight >= 0:
            bad = "kl_weight" if not self.kl_weight > 0 else "task_weight"
            raise ValueError(f"algorithm.{bad} must be {'> 0' if bad == 'kl_weight' else '>= 0'} "
                             f"(got {getattr(self, bad)})")
        if self.task_weight and cfg.rollout.group_size < 2:
            raise ValueError(f"rollout.group_size must be >= 2 for the task advantage (algorithm.task_weight > 0; "
                             f"got {cfg.rollout.group_size})")
        if cfg.lora.enabled:
            raise ValueError("algorithm.teacher with lora.enabled=true is not supported: the LoRA reference is "
                             "the student with adapters off; set lora.enabled=false")

    def advantages(self, batch: Batch, reduce: Reduce = no_reduce) -> tuple[torch.Tensor, dict]:
        """[B, T] per-token advantages; metric distill/reverse_kl (the sampled reverse KL, token mean)."""
        mask = batch.loss_mask
        task = None
        if self.task_weight:
            task = group_advantages(batch.rewards, batch.group_size, self.scale_rewards, self.eps)[:, None]  # [B, 1]
        adv = distill_advantages(batch.old_logprobs, batch.ref_logprobs, mask, self.kl_weight, task,
                                 self.task_weight)  # [B, T]
        d = (batch.old_logprobs - batch.ref_logprobs).float()  # [B, T]
        return adv, {"distill/reverse_kl": global_token_mean(d, mask.float(), reduce)}
