"""Model shapes from a config.json, and the counts the launch plan (rlcore/preflight/plan.py) builds its bars from:
parameters per role, KV-cache bytes per token, activation bytes per token. Arithmetic only: no weights.

Notation: L layers, h hidden, I MLP width, V vocab, n_q / n_kv attention / key-value heads, d head_dim.

Counts (qwen2 / qwen3 / llama decoders: RMSNorm, SwiGLU MLP, grouped-query attention):
  layer  = 2*h*n_q*d + 2*h*n_kv*d + 3*h*I + 2*h   [+ n_q*d + 2*n_kv*d qkv biases: qwen2, attention_bias]
           [+ h o_proj bias: attention_bias]   [+ 2*d q/k norms: qwen3]
  actor, reference   P = L*layer + V*h embedding + h final norm [+ V*h lm_head when not tied]
  critic             P without the lm_head + h + 1 (value head, with bias)
  LoRA adapters      A = L * r * sum over lora.targets of (in + out): q (h, n_q*d), k and v (h, n_kv*d),
                     o (n_q*d, h), gate and up (h, I), down (I, h); other names count 0
  reward model       P without the lm_head + h (score head, no bias)
  KV per token       2 (K and V) * L * max(1, n_kv/k) * d * bytes, k the rollout TP degree (vLLM shards KV
                     heads over TP, replicating them when k > n_kv)
  activations        bytes/2 * L*(10h + 4*n_kv*d + 8I) per token without activation checkpointing,
                     bytes/2 * (2h*L + 10h + 4*n_kv*d + 8I) with it (each layer's input kept, one layer live)
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass


@dataclass
class Shapes:
    """What the formulas need from a config.json."""
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False

    @classmethod
    def from_config(cls, c: dict) -> Shapes:
        h, heads = c["hidden_size"], c["num_attention_heads"]
        bias = bool(c.get("attention_bias", False))
        return cls(h, c["num_hidden_layers"], heads, c.get("num_key_value_heads") or heads,
                   c.get("head_dim") or h // heads, c["intermediate_size"], c["vocab_size"],
                   bool(c.get("tie_word_embeddings", False)), qkv_bias=bias or c.get("model_type") == "qwen2",
                   o_bias=bias, qk_norm=c.get("model_type") == "qwen3")

    @property
    def layer(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return (2 * h * q + 2 * h * kv + 3 * h * self.intermediate + 2 * h + (q + 2 * kv) * self.qkv_bias
                + h * self.o_bias + 2 * self.head_dim * self.qk_norm)

    def adapter_params(self, rank: int, targets: list[str]) -> int:
        """LoRA parameters over all layers: r * (in + out) for each adapted linear (rlcore/models/lora.py)."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        sides = {"q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h, "gate_proj": h + i,
                 "up_proj": h + i, "down_proj": i + h}
        return self.layers * rank * sum(sides.get(t, 0) for t in set(targets))

    @property
    def root(self) -> int:  # the FSDP root unit: embedding, final norm, lm_head when untied
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def params(self, role: str = "actor") -> int:
        backbone = self.layers * self.layer + self.vocab * self.hidden + self.hidden
        head = {"critic": self.hidden + 1, "reward": self.hidden}.get(role, 0 if self.tied else self.vocab * self.hidden)
        return backbone + head

    def kv_bytes_per_token(self, tp: int, dtype_bytes: int) -> int:
        return 2 * self.layers * max(1, self.kv_heads // tp) * self.head_dim * dtype_bytes

    def activation_bytes_per_token(self, checkpointing: bool, dtype_bytes: int) -> float:
        one = 10 * self.hidden + 4 * self.kv_heads * self.head_dim + 8 * self.intermediate
        return dtype_bytes / 2 * (2 * self.hidden * self.layers + one if checkpointing else self.layers * one)


def read_config(path: str, field_: str = "model.path") -> dict:
    """config.json of a local model folder, or of a hub id already in the hub cache (never the network)."""
    local = os.path.join(os.path.expanduser(path), "config.json")
    if not os.path.isfile(local):
        local = None
        if path and not path.startswith(("/", ".", "~")) and path.count("/") <= 1:
            from huggingface_hub import try_to_load_from_cache
            found = try_to_load_from_cache(path, "config.json")
            local = found if isinstance(found, str) else None
    if local is None:
        raise ValueError(f"{field_} '{path}' has no config.json locally or in the hub cache; the plan reads "
                         f"model shapes from there (download the model, or run the recipe's prepare first)")
    try:
        with open(local) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{field_} '{path}': config.json is not readable JSON ({e})") from None
