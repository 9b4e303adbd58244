"""The run state: everything a step needs, built once by `rlcore.trainer.setup` and handed to each stage.

It sits below the stages (rollout/collect.py, logprobs.py, update.py, rewards.py): they read the fields
they use from it, and none of them imports the trainer, which sits on top as the loop.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: the run state imports nothing of the stages it is handed to
    import torch

    from rlcore.config import Config
    from rlcore.data import PromptStream
    from rlcore.metrics import RunLogger
    from rlcore.parallel import ParallelDims
    from rlcore.rollout.engine import RolloutEngine
    from rlcore.rollout.turns import Envs


@dataclass
class Run:
    cfg: Config
    dims: ParallelDims
    group: int  # this rank's rollout group (index along the "dp" axis)
    tp_rank: int  # this rank's place inside the group (index along the "tp" axis)
    tp_group: object  # the process group of this rank's engine (environment results are shared in it)
    tokenizer: object
    prompts: PromptStream
    eval_rows: list[dict]
    reward_fns: list  # [(function, weight)]
    reward_models: list  # [(RewardModel, weight)]
    envs: Envs  # the environment (or single-turn) settings of the turn loop
    model_budget: int  # model tokens a trajectory can hold (all turns)
    engine: RolloutEngine
    policy: torch.nn.Module
    reference: torch.nn.Module | None
    critic: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: object
    critic_optimizer: torch.optim.Optimizer | None
    critic_scheduler: object
    logger: RunLogger
    run_dir: Path
    meta: dict = field(default_factory=dict)  # what checkpoints record about this run (checkpoint.describe)
    plan: object = None  # the launch plan (rlcore.plan.Plan), or None where its formulas do not cover the model
    resume_from: Path | None = None  # the checkpoint to load before the first step
    link: object = None  # split mesh: the process groups joining rollout and trainer ranks (rlcore.transfer.Link)
    train_group: object = None  # split mesh, trainer ranks: their own process group (FSDP2's)

    def trained_models(self) -> dict[str, tuple]:
        """Every model the run trains, with its optimizer and LR scheduler: what a checkpoint holds."""
        trained = {"policy": (self.policy, self.optimizer, self.scheduler)}
        if self.critic is not None:
            trained["critic"] = (self.critic, self.critic_optimizer, self.critic_scheduler)
        return trained
