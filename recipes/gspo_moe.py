"""GSPO on GSM8K with a mixture-of-experts model, Qwen3-30B-A3B: recipe=grpo_moe's node, data and engines, with
GSPO's sequence-level ratio in place of GRPO's token ratios.

    torchrun --nproc-per-node 8 launch/train.py recipe=gspo_moe
    torchrun --nproc-per-node 8 launch/train.py recipe=gspo_moe algorithm.level=token   # GSPO-token

Why GSPO on MoE (Zheng et al. 2025, arXiv:2507.18071, the algorithm Qwen3's RL used): after an update a token
may be routed to other experts, so its token-level ratio is noisy even when the sequence's likelihood barely
moved; one ratio per sequence (the geometric mean of its token ratios) clipped in a narrow window is stable
without routing replay. Four mini-batches per rollout step, so three of the four optimizer steps see ratios
other than 1 and the clip acts. Memory as recipe=grpo_moe (same models, no reference): see its docstring.
"""
from rlcore.algorithms.gspo import GSPO
from rlcore.config import (Config, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig,
                           TrainConfig)

SYSTEM = ("Solve the math problem step by step. End your answer with a line '#### <number>' "
          "giving only the final number.")


def config() -> Config:
    return Config(
        name="gspo-moe-gsm8k",
        seed=0,
        model=ModelConfig(path="Qwen/Qwen3-30B-A3B", dtype="float32", mixed_precision="bfloat16",
                          activation_checkpointing=True),
        data=DataConfig(path="openai/gsm8k", name="main", split="train", prompt_column="question",
                        chat_template=True, system_prompt=SYSTEM, eval_path="openai/gsm8k", eval_split="test",
                        eval_size=512, max_prompt_tokens=512),
        rollout=RolloutConfig(tensor_parallel=4, group_size=8, prompts_per_step=64, max_new_tokens=1024,
                              temperature=1.0, gpu_memory_utilization=0.3),
        optim=OptimConfig(lr=1e-6, weight_decay=0.0, warmup_steps=10, schedule="constant", max_grad_norm=1.0),
        train=TrainConfig(steps=300, epochs_per_step=1, mini_batches=4, micro_batch_size=2, eval_every=25,
                          # Packed: padding stripped, at most the tokens of 2 padded rows per micro-batch.
                          max_tokens_per_micro_batch=2 * 1536, save_every=50),
        rewards=[RewardSpec(fn="rlcore.rewards:gsm8k", weight=1.0)],
        # the paper's clip window for sequence ratios: [1 - 3e-4, 1 + 4e-4]
        algorithm=GSPO(clip_low=3e-4, clip_high=4e-4, level="sequence"),
    )
