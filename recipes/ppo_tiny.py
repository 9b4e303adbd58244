"""PPO with a critic on the embedded tiny arithmetic task, 2 CPU ranks (the demo's task and model).

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=ppo_tiny

The critic starts from the policy's backbone with a new zero value head and trains with its own AdamW.
"""
from rlcore.algorithms.ppo import PPO
from rlcore.config import (Config, CriticConfig, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig,
                           TrainConfig)
from rlcore.tasks import tiny


def config() -> Config:
    return Config(
        name="ppo_tiny",
        seed=0,
        prepare="rlcore.tasks.tiny:prepare",
        model=ModelConfig(path=str(tiny.model_dir())),
        data=DataConfig(path=str(tiny.train_file()), eval_path=str(tiny.eval_file()), prompt_column="prompt",
                        max_prompt_tokens=16),
        rollout=RolloutConfig(tensor_parallel=1, group_size=8, prompts_per_step=32, max_new_tokens=8,
                              temperature=1.0, cpu_kv_cache_gb=0.5, logprob_diff_threshold=1e-3),
        optim=OptimConfig(lr=1e-4, warmup_steps=5, schedule="constant", max_grad_norm=1.0),
        train=TrainConfig(steps=40, mini_batches=2, micro_batch_size=128, eval_every=10),
        critic=CriticConfig(path="policy", optim=OptimConfig(lr=1e-3, warmup_steps=5, max_grad_norm=1.0)),
        rewards=[RewardSpec(fn="rlcore.rewards:arithmetic_exact", weight=1.0)],
        algorithm=PPO(gamma=1.0, lam=0.95, clip_low=0.2, clip_high=0.2, value_clip=0.2, kl_penalty=0.0),
    )
