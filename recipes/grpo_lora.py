"""GRPO on GSM8K with LoRA on a 7B instruct model: one node of 8 GPUs, four TP=2 vLLM engines serving the
adapter, bf16 compute.

    torchrun --nproc-per-node 8 launch/train.py recipe=grpo_lora
    torchrun --nproc-per-node 8 launch/train.py recipe=grpo_lora lora.rank=32 lora.alpha=64 name=gsm8k-lora-r32
    python launch/plan.py recipe=grpo_lora --nproc-per-node 8 --gpu-memory-gb 80   # the memory plan, no GPU

Needs the hub (model Qwen/Qwen2.5-7B-Instruct, dataset openai/gsm8k "main") or local copies:
    ... model.path=/models/qwen2.5-7b-instruct data.path=/data/gsm8k/train.parquet \
        data.eval_path=/data/gsm8k/test.parquet

recipes/grpo.py's task, data, rollout and GRPO settings with a 5x larger model, trained through low-rank
adapters (rlcore/models/lora.py); the sources of every choice follow.
- Adapters on every attention and MLP linear (q, k, v, o, gate, up, down), r=16, alpha=32 (alpha = 2r): the
  defaults of torchtune and prime-rl; TML "LoRA Without Regret" finds every-linear targeting matters, MLP
  included, and RL works even at r=1, so r=16 is not the limit. r=16 adds 40.4M trained parameters, 0.53%
  of the model's 7.62B.
- LR: the adapters train at lora.lr_scale=10 x optim.lr = 1e-5, optim.lr being grpo.py's full fine-tuning
  1e-6: LoRA's best LR is ~10x full fine-tuning's (TML "LoRA Without Regret"; the Tinker cookbook's fixed
  factor; TRL docs/source/lora_without_regret.md runs GRPO at 1e-5 LoRA vs 1e-6 full; verl
  docs/advance/ppo_lora.rst).
- Adapter sync (lora.sync=adapter): each step the engines load a ~81 MB bf16 PEFT adapter instead of 15 GB
  of weights; the price is unmerged LoRA kernels in generation (reported 1.33-1.39x time per output token,
  TRL #7017). lora.sync=merged streams merged full weights into plain engines instead.
- No reference copy: the KL term's reference is the policy with its adapters switched off.
- Memory per GPU (launch/plan.py, GB = 2^30; tests/test_recipes.py checks it by hand): the frozen fp32 base
  3.55 GB (/8), the adapters with their grads and AdamW 0.08 GB; the train bar 13.6 GB of 72 usable, against
  30.6 GB with lora=false (trained params, grads and AdamW 14.2 GB, a 3.55 GB reference copy, 2.9 GB more
  gathered gradient). The engine (0.4 x 80 GB) sleeps while training.
- LoRA tolerates very large batches worse than full fine-tuning (TML); grpo.py's 128 x 8 samples is kept
  for comparison with it. Halve rollout.prompts_per_step if learning stalls.
"""
from rlcore.algorithms.grpo import GRPO
from rlcore.config import (Config, DataConfig, LoraConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig,
                           TrainConfig)

SYSTEM = ("Solve the math problem step by step. End your answer with a line '#### <number>' "
          "giving only the final number.")


def config() -> Config:
    return Config(
        name="grpo-lora-gsm8k",
        seed=0,
        # fp32 master copy of the frozen base (3.8 GB a GPU, /8) and bf16 compute, as grpo.py.
        model=ModelConfig(path="Qwen/Qwen2.5-7B-Instruct", dtype="float32", mixed_precision="bfloat16",
                          activation_checkpointing=True),
        data=DataConfig(path="openai/gsm8k", name="main", split="train", prompt_column="question",
                        chat_template=True, system_prompt=SYSTEM, eval_path="openai/gsm8k", eval_split="test",
                        eval_size=512, max_prompt_tokens=512),
        rollout=RolloutConfig(tensor_parallel=2, group_size=8, prompts_per_step=128, max_new_tokens=1024,
                              temperature=1.0, gpu_memory_utilization=0.4),
        # The full fine-tuning LR of grpo.py; the adapters train at lora.lr_scale (10) x it = 1e-5.
        optim=OptimConfig(lr=1e-6, weight_decay=0.0, warmup_steps=10, schedule="constant", max_grad_norm=1.0),
        train=TrainConfig(steps=500, epochs_per_step=1, mini_batches=4, micro_batch_size=8, eval_every=25,
                          # Packed: padding stripped, at most the tokens of 8 padded rows per micro-batch.
                          max_tokens_per_micro_batch=8 * 1536, save_every=25),
        rewards=[RewardSpec(fn="rlcore.rewards:gsm8k", weight=1.0)],
        algorithm=GRPO(clip_low=0.2, clip_high=0.28, kl_coef=0.001, loss_agg="token-mean"),
        lora=LoraConfig(enabled=True, rank=16, alpha=32.0, lr_scale=10.0, sync="adapter"),
    )
