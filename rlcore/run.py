"""The run state: what a rank holds, built once by `rlcore.trainer.setup` and handed to each stage.

    Run            every rank: the config, the mesh, the tokenizer, the engine (dormant on a split mesh's
                   trainer ranks), the logger, the run directory, the checkpoint to resume from
      .rollout     ranks that generate: prompts, environments, reward functions and models, held-out rows
      .trainer     ranks that train: the policy, its optimizer and scheduler, the reference, the critic

Colocated, every rank holds both parts; in a split mesh (rlcore/modes/split.py) a rollout rank's `trainer` and a
trainer rank's `rollout` are None. Which models a run builds is decided once, by
`rlcore.config.roles.models_of`.

It sits below the stages (rollout/collect.py, logprobs.py, update.py, rewards.py): they read the fields
they use from it, and none of them imports the trainer, which sits on top as the loop.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from rlcore.config import RolloutConfig

if TYPE_CHECKING:  # types only: the run state imports nothing of the stages it is handed to
    import torch

    from rlcore.config import Config
    from rlcore.config.roles import Models
    from rlcore.data import PromptStream
    from rlcore.distributed.parallel import ParallelDims
    from rlcore.engine.rollout_engine import RolloutEngine
    from rlcore.outputs.metrics import RunLogger


@dataclass
class Envs:
    """What the loop needs to run environments; built once at startup (rlcore.rollout.envs)."""
    factory: Callable | None  # row -> environment; None = single-turn
    spec: str  # how the recipe named it, for messages
    max_turns: int
    stop_ids: list[int]
    timeout_s: float
    workers: int
    encode: Callable[[Any], list[int]]  # observation (text, ids or chat messages) -> token ids
    decode: Callable[[list[int]], str]  # a model turn's ids -> the action text (special tokens dropped)
    turn_s: float = math.inf  # rollout.turn_deadline_s: the time one step's tools get (rlcore.rollout.env.Limits)
    max_tool_calls: int = RolloutConfig.max_tool_calls  # tool calls one turn may run
    agent: Callable | None = None  # rollout.agent (rlcore.rollout.agents): trajectories are its calls; factory is None
    endpoint: Any = None  # the agent's endpoint on this rank, started at the first rollout
    prompt: Callable[[dict, str], list[int]] | None = None  # (row, reset's PromptText) -> the prompt's new ids


@dataclass
class Rollout:
    """What a rank that generates holds besides its engine."""
    group: int  # this rank's rollout group (index along the "dp" axis)
    tp_rank: int  # this rank's place inside the group (index along the "tp" axis)
    tp_group: object  # the process group of this rank's engine (environment results are shared in it)
    prompts: PromptStream
    eval_rows: list[dict]
    reward_fns: list  # [(function, weight)]
    reward_models: list  # [(RewardModel, weight)]
    envs: Envs  # the environment (or single-turn) settings of the turn loop
    model_budget: int  # model tokens a trajectory can hold (all turns)


@dataclass
class Trainer:
    """What a rank that trains holds: the trained models with their optimizers and LR schedulers, the frozen
    reference (or None), and the process group they are sharded over."""
    policy: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    reference: torch.nn.Module | None = None
    critic: torch.nn.Module | None = None
    critic_optimizer: torch.optim.Optimizer | None = None
    critic_scheduler: object = None
    group: object = None  # split mesh: the trainer ranks' own process group (FSDP2's); None = the world
    # called between two micro-batches of the trainers' forward passes (final=True: before an optimizer step), where
    # streaming's early hand-over sends the version the engine waits for (rlcore/modes/stream/trainer_side.py)
    poll: Callable[[bool], None] | None = None

    def trained_models(self) -> dict[str, tuple]:
        """Every model the run trains, with its optimizer and LR scheduler: what a checkpoint holds."""
        trained = {"policy": (self.policy, self.optimizer, self.scheduler)}
        if self.critic is not None:
            trained["critic"] = (self.critic, self.critic_optimizer, self.critic_scheduler)
        return trained


@dataclass(kw_only=True)
class Run:
    cfg: Config
    dims: ParallelDims
    models: Models
    tokenizer: object
    engine: RolloutEngine
    logger: RunLogger
    run_dir: Path
    rollout: Rollout | None  # None on a trainer rank of a split mesh
    trainer: Trainer | None  # None on a rollout rank of a split mesh
    meta: dict = field(default_factory=dict)  # what checkpoints record about this run (checkpoint.describe)
    plan: object = None  # the launch plan (rlcore.preflight.plan.Plan), or None where its formulas do not cover the model
    resume_from: Path | None = None  # the checkpoint to load before the first step
    link: object = None  # split mesh: the process groups joining rollout and trainer ranks (rlcore.modes.transfer.Link)

    def trained_models(self) -> dict[str, tuple]:
        """This rank's trained models (none on a rollout rank of a split mesh)."""
        return self.trainer.trained_models() if self.trainer is not None else {}
