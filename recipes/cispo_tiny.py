"""CISPO (REINFORCE with a clipped, detached importance weight) on the embedded tiny arithmetic task, 2 CPU
ranks, with the IcePop token mask and the geometric sequence mask on as mismatch corrections.

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=cispo_tiny

Two mini-batches per rollout step, so the second optimizer step sees a ratio other than 1 and the weight cap
acts. The corrections (IcePop [0.5, 5], geometric mask [0.99, 1.01]) change nothing here, where the engine
and the trainer agree to 1e-3 (fp32 on CPU): they are on to show their metrics (policy/is_weight_*,
policy/seq_masked_frac, rollout/kl), and a fork onto bf16 GPUs keeps them.
"""
from rlcore.algorithms.cispo import CISPO
from rlcore.config import (Config, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig,
                           TrainConfig)
from rlcore.tasks import tiny


def config() -> Config:
    return Config(
        name="cispo_tiny",
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
        algorithm=CISPO(clip_low=1.0, clip_high=4.0, tis_cap=5.0, tis_low=0.5, tis_mode="mask",
                        seq_mask="geometric", seq_mask_low=0.99, seq_mask_high=1.01),
    )
