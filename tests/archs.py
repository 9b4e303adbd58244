"""Tiny random models of every architecture the matrix tests (tests/test_archs.py), built locally, and the
recipe the matrix trains them with:

    torchrun --nproc-per-node 2 launch/train.py recipe=tests/archs.py model.path=DIR rollout.tensor_parallel=2

Each is the same small shape in its own family: 2 layers, hidden 128, 4 query heads of head_dim 32 (vLLM's
CPU attention needs >= 32) over 2 key/value heads, vocab 32 (rlcore.tasks.tiny's character tokenizer, so the
demo's arithmetic prompts and rewards work unchanged). The mixture-of-experts families get 4 experts, 2
routed per token, so FSDP2 over 2 ranks splits each layer's expert tensors. `tie_word_embeddings` is
explicit everywhere: both ways are covered (qwen2 and qwen2_tied, and gemma2 always ties).
"""
from __future__ import annotations

from pathlib import Path

SHAPE = dict(vocab_size=32, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
MOE = dict(num_experts_per_tok=2)


def hf_config(arch: str):
    """The transformers config of one tiny architecture (see ARCHS)."""
    import transformers as t

    head_dim = dict(head_dim=32)  # families whose config derives it (phi3, olmo2) take hidden / heads = 32
    configs = {
        "llama": lambda: t.LlamaConfig(**SHAPE, **head_dim, tie_word_embeddings=False),
        "mistral": lambda: t.MistralConfig(**SHAPE, **head_dim, tie_word_embeddings=False),
        "qwen2": lambda: t.Qwen2Config(**SHAPE, tie_word_embeddings=False),
        "qwen2_tied": lambda: t.Qwen2Config(**SHAPE, tie_word_embeddings=True),
        "qwen3": lambda: t.Qwen3Config(**SHAPE, **head_dim, tie_word_embeddings=False),
        "gemma2": lambda: t.Gemma2Config(**SHAPE, **head_dim, query_pre_attn_scalar=32, tie_word_embeddings=True),
        "phi3": lambda: t.Phi3Config(**SHAPE, tie_word_embeddings=False),
        "olmo2": lambda: t.Olmo2Config(**SHAPE, tie_word_embeddings=False),
        "mixtral": lambda: t.MixtralConfig(**SHAPE, **head_dim, **MOE, num_local_experts=4, tie_word_embeddings=False),
        "qwen3_moe": lambda: t.Qwen3MoeConfig(**SHAPE, **head_dim, **MOE, num_experts=4, moe_intermediate_size=64,
                                              tie_word_embeddings=False),
    }
    return configs[arch]()


ARCHS = ["llama", "mistral", "qwen2", "qwen2_tied", "qwen3", "gemma2", "phi3", "olmo2", "mixtral", "qwen3_moe"]
MOE_ARCHS = ["mixtral", "qwen3_moe"]


def build(arch: str, out_dir: str | Path, seed: int = 0) -> Path:
    """A random-init model of `arch` + the tiny tokenizer, saved as a local HF folder."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcore.tasks import tiny

    torch.manual_seed(seed)
    return tiny._save(AutoModelForCausalLM.from_config(hf_config(arch)), Path(out_dir))


def digits(prompts: list[str], completions: list[str], **_) -> list[float]:
    """Share of a completion's characters that are digits: a reward a random model's samples differ in, so
    every step has non-zero advantages and moves every weight."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def config():
    """The demo's prompts and GRPO, small: 8 prompts x 4 samples a step, 3 steps, a learning rate that moves
    every weight visibly, and the exact-sync bound as the run's own stop threshold."""
    from rlcore.algorithms.grpo import GRPO
    from rlcore.config import (Config, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig,
                               TrainConfig)
    from rlcore.tasks import tiny

    return Config(
        name="arch", seed=0, prepare="rlcore.tasks.tiny:prepare",
        model=ModelConfig(path="", dtype="float32"),
        data=DataConfig(path=str(tiny.train_file()), prompt_column="prompt", max_prompt_tokens=16),
        rollout=RolloutConfig(tensor_parallel=1, group_size=4, prompts_per_step=8, max_new_tokens=8,
                              temperature=1.0, cpu_kv_cache_gb=0.25, logprob_diff_threshold=1e-4),
        optim=OptimConfig(lr=1e-3, warmup_steps=0, schedule="constant", max_grad_norm=1.0),
        train=TrainConfig(steps=3, mini_batches=1, micro_batch_size=8, eval_every=10),
        rewards=[RewardSpec(fn=f"{__file__}:digits", weight=1.0)],
        algorithm=GRPO(clip_low=0.2, clip_high=0.2, kl_coef=0.0, loss_agg="token-mean"),
    )
