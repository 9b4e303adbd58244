"""GSPO (sequence-level ratio, the paper's clip window 3e-4 / 4e-4) on the embedded tiny arithmetic task, 2 CPU ranks.

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=gspo_tiny
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=gspo_tiny algorithm.level=token   # GSPO-token

Two mini-batches per rollout step, so the second optimizer step sees a ratio other than 1 and the sequence
clip acts (policy/clip_frac); with one, GSPO's ratio is always 1.
"""
from rlcore.algorithms.gspo import GSPO
from rlcore.config import (Config, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig,
                           TrainConfig)
from rlcore.tasks import tiny


def config() -> Config:
    return Config(
        name="gspo_tiny",
        seed=0,
        prepare="rlcore.tasks.tiny:prepare",
        model=ModelConfig(path=str(tiny.model_dir())),
        data=DataConfig(path=str(tiny.train_file()), eval_path=str(tiny.eval_file()), prompt_column="prompt",
                        max_prompt_tokens=16),
        rollout=RolloutConfig(tensor_parallel=1, group_size=8, prompts_per_step=32, max_new_tokens=8,
                              temperature=1.0, cpu_kv_cache_gb=0.5, logprob_diff_threshold=1e-3),
        optim=OptimConfig(lr=1e-4, warmup_steps=5, schedule="constant", max_grad_norm=1.0),
        train=TrainConfig(steps=60, mini_batches=2, micro_batch_size=128, eval_every=10),
        rewards=[RewardSpec(fn="rlcore.rewards:arithmetic_exact", weight=1.0)],
        algorithm=GSPO(clip_low=3e-4, clip_high=4e-4, level="sequence"),
    )
