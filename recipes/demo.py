"""The embedded tiny default: GRPO teaches a tiny character-level Qwen2 to add, on 2 CPU ranks.

    make demo
    # which runs:
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=demo

Everything is built locally on first use (rlcore.tasks.tiny.prepare, cached): tokenizer, model, a short
supervised warm start, and the train / held-out prompt files. Prints held-out greedy accuracy before
and after training; writes runs/demo/{config.json,metrics.jsonl,tb/}.
"""
from rlcore.algorithms.grpo import GRPO
from rlcore.config import (Config, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig,
                           TrainConfig)
from rlcore.tasks import tiny


def config() -> Config:
    return Config(
        name="demo",
        seed=0,
        prepare="rlcore.tasks.tiny:prepare",
        model=ModelConfig(path=str(tiny.model_dir())),
        data=DataConfig(path=str(tiny.train_file()), eval_path=str(tiny.eval_file()), prompt_column="prompt",
                        max_prompt_tokens=16),
        rollout=RolloutConfig(tensor_parallel=1, group_size=8, prompts_per_step=32, max_new_tokens=8,
                              temperature=1.0, cpu_kv_cache_gb=0.5, logprob_diff_threshold=1e-3),
        optim=OptimConfig(lr=1e-4, warmup_steps=5, schedule="constant", max_grad_norm=1.0),
        train=TrainConfig(steps=60, mini_batches=1, micro_batch_size=128, eval_every=10),
        rewards=[RewardSpec(fn="rlcore.rewards:arithmetic_exact", weight=1.0)],
        algorithm=GRPO(clip_low=0.2, clip_high=0.2, kl_coef=0.0, loss_agg="token-mean"),
    )
