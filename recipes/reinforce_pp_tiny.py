"""REINFORCE++ (no critic, globally whitened returns) on the embedded tiny arithmetic task, 2 CPU ranks.

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=reinforce_pp_tiny

A per-token KL penalty to the frozen reference model (k1) is part of the reward. The baseline variant
(subtract each prompt group's mean reward first) is one override: algorithm.baseline=true.
"""
from rlcore.algorithms.reinforce_pp import ReinforcePP
from rlcore.config import (Config, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig,
                           TrainConfig)
from rlcore.tasks import tiny


def config() -> Config:
    return Config(
        name="reinforce_pp_tiny",
        seed=0,
        prepare="rlcore.tasks.tiny:prepare",
        model=ModelConfig(path=str(tiny.model_dir())),
        data=DataConfig(path=str(tiny.train_file()), eval_path=str(tiny.eval_file()), prompt_column="prompt",
                        max_prompt_tokens=16),
        rollout=RolloutConfig(tensor_parallel=1, group_size=8, prompts_per_step=32, max_new_tokens=8,
                              temperature=1.0, cpu_kv_cache_gb=0.5, logprob_diff_threshold=1e-3),
        optim=OptimConfig(lr=1e-4, warmup_steps=5, schedule="constant", max_grad_norm=1.0),
        train=TrainConfig(steps=40, mini_batches=1, micro_batch_size=128, eval_every=10),
        rewards=[RewardSpec(fn="rlcore.rewards:arithmetic_exact", weight=1.0)],
        algorithm=ReinforcePP(gamma=1.0, kl_penalty=0.01, kl_penalty_estimator="k1", baseline=False),
    )
