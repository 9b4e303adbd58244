"""On-policy distillation on the embedded tiny arithmetic task, 2 CPU ranks: the student (the demo's warm
start, 17% held-out) samples, a stronger teacher of the same shape and tokenizer (trained further on correct
answers only, ~83%) scores every sampled token, and the per-token reverse KL is the whole signal.

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=distill_tiny
    # with the task reward's group advantage added at weight 1:
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=distill_tiny algorithm.task_weight=1

The teacher is built once by the prepare step (rlcore.tasks.tiny.prepare_teacher, cached) and sharded with FSDP2
in the reference model's place. The reward function still runs: its numbers are logged, not trained on
(algorithm.task_weight=0).
"""
from rlcore.algorithms.distill import Distill
from rlcore.config import (Config, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig,
                           TrainConfig)
from rlcore.tasks import tiny


def config() -> Config:
    return Config(
        name="distill_tiny",
        seed=0,
        prepare="rlcore.tasks.tiny:prepare_teacher",
        model=ModelConfig(path=str(tiny.model_dir())),
        data=DataConfig(path=str(tiny.train_file()), eval_path=str(tiny.eval_file()), prompt_column="prompt",
                        max_prompt_tokens=16),
        rollout=RolloutConfig(tensor_parallel=1, group_size=8, prompts_per_step=32, max_new_tokens=8,
                              temperature=1.0, cpu_kv_cache_gb=0.5, logprob_diff_threshold=1e-3),
        optim=OptimConfig(lr=1e-4, warmup_steps=5, schedule="constant", max_grad_norm=1.0),
        train=TrainConfig(steps=60, mini_batches=1, micro_batch_size=128, eval_every=10),
        rewards=[RewardSpec(fn="rlcore.rewards:arithmetic_exact", weight=1.0)],
        algorithm=Distill(teacher=str(tiny.teacher_dir()), kl_weight=1.0, task_weight=0.0),
    )
