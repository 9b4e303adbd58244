"""The trained and frozen transformers models: actor (policy) and reference.

Model code holds no parallelism: `load_causal_lm` returns a plain transformers model and `shard`
applies FSDP2 from outside, one `fully_shard` per decoder layer plus the root. The critic (PPO) will
live here too, as a value head on the same kind of backbone.
"""
from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlcore.config import ModelConfig, OptimConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def check_model(path: str):
    """Read config.json only (no weights) and check it is a causal LM. Returns the HF config."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    local = os.path.exists(path)
    looks_local = path.startswith(("/", ".", "~")) or path.count("/") > 1 or not path
    if not local and looks_local:
        raise ValueError(f"model.path '{path}' does not exist (expected a local model folder or a hub id)")
    try:
        hf_config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"model.path '{path}' is not a loadable transformers model: {first}") from None
    if hf_config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ValueError(f"model.path '{path}' is a '{hf_config.model_type}' model, not a causal LM "
                         f"(e.g. qwen2, qwen3, llama)")
    return hf_config


def load_causal_lm(cfg: ModelConfig, trainable: bool = True) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(cfg.path, dtype=DTYPES[cfg.dtype],
                                                 attn_implementation=cfg.attn_implementation)
    if trainable and cfg.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.train(trainable)
    model.requires_grad_(trainable)
    return model


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    return model.get_decoder().layers


def shard(model: torch.nn.Module, mesh: DeviceMesh, cfg: ModelConfig) -> torch.nn.Module:
    """FSDP2: each decoder layer is one all-gather unit, the root holds embeddings, norm and head."""
    mp = None
    if cfg.mixed_precision != "none":
        mp = MixedPrecisionPolicy(param_dtype=DTYPES[cfg.mixed_precision], reduce_dtype=torch.float32)
    kwargs = {"mesh": mesh} | ({"mp_policy": mp} if mp else {})
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    # Losses are already divided by a global token count (rlcore.objectives.aggregate): reduce
    # gradients as a SUM over ranks, not FSDP's default mean. Plain SUM collectives (gloo has no
    # pre-multiplied sum).
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    return model


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float, with_entropy: bool = False):
    """log p(input_ids[:, t+1] | input_ids[:, :t+1]) at `temperature`, as vLLM's processed logprobs.

    Returns logprobs [B, T=L-1] (and entropy [B, T] of the full next-token distribution)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # [B, L, V]
    logits = logits[:, :-1].float() / temperature
    logp = F.log_softmax(logits, dim=-1)  # [B, T, V]
    logprobs = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # [B, T]
    if not with_entropy:
        return logprobs
    entropy = -(logp.exp() * logp).sum(-1)  # [B, T]
    return logprobs, entropy


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, total_steps: int):
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                            weight_decay=cfg.weight_decay)

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
        decay = 1.0 - progress if cfg.schedule == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay

    if cfg.schedule not in ("constant", "linear", "cosine"):
        raise ValueError(f"optim.schedule must be one of constant, linear, cosine (got '{cfg.schedule}')")
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Global gradient norm over all shards (clipped to max_norm unless it is 0)."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else math.inf)
    return (norm.full_tensor() if isinstance(norm, DTensor) else norm).item()
