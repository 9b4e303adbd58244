"""PPO with a critic on GSM8K with a ~1.5B instruct model: one node of 8 GPUs, four TP=2 vLLM engines, bf16.

    torchrun --nproc-per-node 8 launch/train.py recipe=ppo
    torchrun --nproc-per-node 8 launch/train.py recipe=ppo critic.optim.lr=1e-5 name=ppo-critic-lr1e-5

Four models: the actor, a critic initialised from the actor's backbone with a new value head (its own
AdamW), the frozen reference for the per-token KL penalty in the reward (its shards offloaded to CPU between
uses), and the rule-based gsm8k reward.

Needs the hub (model Qwen/Qwen2.5-1.5B-Instruct, dataset openai/gsm8k "main") or local copies:
    ... model.path=/models/qwen2.5-1.5b-instruct data.path=/data/gsm8k/train.parquet \
        data.eval_path=/data/gsm8k/test.parquet
"""
from rlcore.algorithms.ppo import PPO
from rlcore.config import (Config, CriticConfig, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig,
                           TrainConfig)

SYSTEM = ("Solve the math problem step by step. End your answer with a line '#### <number>' "
          "giving only the final number.")


def config() -> Config:
    return Config(
        name="ppo-gsm8k",
        seed=0,
        model=ModelConfig(path="Qwen/Qwen2.5-1.5B-Instruct", dtype="float32", mixed_precision="bfloat16",
                          activation_checkpointing=True, offload_frozen=True),
        data=DataConfig(path="openai/gsm8k", name="main", split="train", prompt_column="question",
                        chat_template=True, system_prompt=SYSTEM, eval_path="openai/gsm8k", eval_split="test",
                        eval_size=512, max_prompt_tokens=512),
        rollout=RolloutConfig(tensor_parallel=2, group_size=8, prompts_per_step=128, max_new_tokens=1024,
                              temperature=1.0, gpu_memory_utilization=0.4),
        optim=OptimConfig(lr=1e-6, weight_decay=0.0, warmup_steps=10, schedule="constant", max_grad_norm=1.0),
        train=TrainConfig(steps=500, epochs_per_step=1, mini_batches=4, micro_batch_size=8, eval_every=25,
                          # Packed: padding stripped, at most the tokens of 8 padded rows per micro-batch.
                          max_tokens_per_micro_batch=8 * 1536, save_every=25),
        critic=CriticConfig(path="policy", optim=OptimConfig(lr=5e-6, warmup_steps=10, max_grad_norm=1.0)),
        rewards=[RewardSpec(fn="rlcore.rewards:gsm8k", weight=1.0)],
        algorithm=PPO(gamma=1.0, lam=0.95, clip_low=0.2, clip_high=0.2, value_clip=0.2, kl_penalty=0.001,
                      kl_penalty_estimator="k1", loss_agg="token-mean"),
    )
