"""GRPO on GSM8K with a mixture-of-experts model, Qwen3-30B-A3B: one node of 8 80-GB GPUs, two TP=4 vLLM engines.

    torchrun --nproc-per-node 8 launch/train.py recipe=grpo_moe
    torchrun --nproc-per-node 8 launch/train.py recipe=grpo_moe optim.lr=5e-7 name=moe-lr5e-7

Needs the hub (model Qwen/Qwen3-30B-A3B, dataset openai/gsm8k "main") or local copies:
    ... model.path=/models/qwen3-30b-a3b data.path=/data/gsm8k/train.parquet data.eval_path=/data/gsm8k/test.parquet

Memory per GPU (30.5B parameters; FSDP2 over 8 ranks, no expert parallelism: rlcore.models.build.shard):
    trainer at rest     fp32 weights 15.3 GB + AdamW moments 30.5 GB              = 45.8 GB
    + while training    fp32 gradients 15.3 GB, one gathered layer in bf16 (1.3 GB, x2 with prefetch),
                        activations (checkpointed, micro-batches of 2); the engine sleeps (weights + KV freed)
    + while generating  the engine: gpu_memory_utilization 0.3 = 24 GB, of which bf16 weights 61 GB / TP 4
                        = 15.3 GB, the rest KV cache (~25 KB per token per GPU: 48 layers x 1 KV head x 128 x
                        2 x bf16) and vLLM's activations
Why TP=4: TP=2 would put 30.5 GB of engine weights beside the trainer's 45.8 GB; TP=8 leaves one engine (half
the generation parallelism) for a model with only 3.3B active parameters per token; 4 divides the 32 query
heads and equals the 4 KV heads. tests/test_recipes.py checks it with the launch plan of the model's config.json
(python launch/plan.py recipe=grpo_moe --nproc-per-node 8 --gpu-memory-gb 80: both bars fit, 67.2 and 66.7 of
72.0 usable GiB).
"""
from rlcore.algorithms.grpo import GRPO
from rlcore.config import (Config, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig,
                           TrainConfig)

SYSTEM = ("Solve the math problem step by step. End your answer with a line '#### <number>' "
          "giving only the final number.")


def config() -> Config:
    return Config(
        name="grpo-moe-gsm8k",
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
        algorithm=GRPO(clip_low=0.2, clip_high=0.28, kl_coef=0.0, loss_agg="token-mean"),
    )
