"""The config.json of each hub model the recipes name (and of Qwen2.5-0.5B and the 1.5B base, their small kin), as
published (Qwen/<name>/config.json), with its published parameter count: written into temporary folders by the
tests (tests/test_sizes.py, tests/test_recipes.py) so the launch plan reads the real shapes with no hub and no
weights."""
from __future__ import annotations

import json
from pathlib import Path

QWEN25_0P5B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
    "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.40.1",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}
QWEN25_1P5B_INSTRUCT = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
    "hidden_act": "silu", "hidden_size": 1536, "initializer_range": 0.02, "intermediate_size": 8960,
    "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2", "num_attention_heads": 12,
    "num_hidden_layers": 28, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.43.1",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}
QWEN25_7B_INSTRUCT = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
    "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944,
    "max_position_embeddings": 32768, "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.43.1",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 152064}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936}

# hub id -> (config.json, published parameter count). The counts are the hub's safetensors totals (its "Model
# size"), which the model cards round: 0.49B, 1.54B, 7.61B, 30.5B. Qwen3-30B-A3B's index says total_size
# 61,064,245,248 bytes of bf16 = 2 x 30,532,122,624.
REAL = {
    "Qwen/Qwen2.5-0.5B": (QWEN25_0P5B, 494_032_768),
    # the base model: the Instruct model's shape (only its token ids and version fields differ)
    "Qwen/Qwen2.5-1.5B": (QWEN25_1P5B_INSTRUCT | {"eos_token_id": 151643}, 1_543_714_304),
    "Qwen/Qwen2.5-1.5B-Instruct": (QWEN25_1P5B_INSTRUCT, 1_543_714_304),
    "Qwen/Qwen2.5-7B-Instruct": (QWEN25_7B_INSTRUCT, 7_615_616_512),
    "Qwen/Qwen3-30B-A3B": (QWEN3_30B_A3B, 30_532_122_624),
}


def hub_ids(cfg) -> list[str]:
    """The hub ids a recipe loads models from (local folders are the tiny tasks')."""
    paths = [cfg.model.path, cfg.critic.path, cfg.algorithm.teacher, *(s.model for s in cfg.rewards)]
    return [p for p in paths if p and p != "policy" and not p.startswith(("/", ".", "~")) and p.count("/") == 1]


def model_dir(root: Path, hub_id: str) -> Path:
    """A folder holding only `hub_id`'s config.json."""
    path = root / hub_id.replace("/", "--")
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(REAL[hub_id][0]))
    return path
