"""The four models of RL post-training, as transformers models:

    actor (policy)  trained    a causal LM                         load_causal_lm
    reference       frozen     the same causal LM at its init      load_causal_lm(trainable=False)
    critic          trained    a value head on the same backbone   load_critic   (TokenClassification, 1 label)
    reward model    frozen     a sequence classifier, 1 label      load_reward_model

Model code holds no parallelism: each loader returns a plain transformers model and `shard` applies FSDP2
from outside, one `fully_shard` per decoder layer plus the root, the same for all four. With meta=True a loader
returns the model on the meta device instead, and `shard` fills it: each rank reads only its shards of the
checkpoint (rlcore/models/load.py), so a node holds one copy of the model, not one per rank.

Why one file of ~350 lines: the four models' loading, sharding and forwards share one set of FSDP2 and dtype
rules, written once.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from rlcore.config import CriticConfig, ModelConfig, OptimConfig
from rlcore.models import head_logprobs, load

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def check_model(path: str, field: str = "model.path"):
    """Read config.json only (no weights) and check it is a causal LM. Returns the HF config."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    hf_config = _read_config(path, field)
    if hf_config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ValueError(f"{field} '{path}' is a '{hf_config.model_type}' model, not a causal LM "
                         f"(e.g. qwen2, qwen3, llama)")
    # A qwen2 reward model (Qwen2ForSequenceClassification) has a causal LM's model type, but loading it as
    # one would drop its head and start a new, random LM head.
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    other = [a for a in hf_config.architectures or [] if a not in causal]
    if other:
        raise ValueError(f"{field} '{path}' is a {', '.join(other)}, which transformers cannot build as a causal "
                         f"LM (a *ForCausalLM, e.g. {MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[hf_config.model_type]})")
    return hf_config


def check_reward_model(path: str, field: str):
    """A reward model must be a sequence classifier with one label (its logit is the reward)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    hf_config = _read_config(path, field)
    archs = hf_config.architectures or []
    if not any(a.endswith("ForSequenceClassification") for a in archs) or \
            hf_config.model_type not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES:
        raise ValueError(f"{field} '{path}' is a {', '.join(archs) or hf_config.model_type}, not a sequence "
                         f"classifier (a reward model is a *ForSequenceClassification with num_labels=1)")
    if hf_config.num_labels != 1:
        raise ValueError(f"{field} '{path}' has num_labels={hf_config.num_labels}; a reward model has 1")
    return hf_config


def _read_config(path: str, field: str):
    from transformers import AutoConfig

    local = os.path.exists(path)
    looks_local = path.startswith(("/", ".", "~")) or path.count("/") > 1 or not path
    if not local and looks_local:
        raise ValueError(f"{field} '{path}' does not exist (expected a local model folder or a hub id)")
    if local and not os.path.isdir(path):
        raise ValueError(f"{field} '{path}' is a file; expected a model folder (config.json + weights) or a hub id")
    try:
        return AutoConfig.from_pretrained(path)
    except Exception as e:  # missing, empty or corrupted config.json, or one of an unknown kind
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{field} '{path}' is not a loadable transformers model: {first}") from None


def is_value_model(path: str) -> bool:
    """A saved critic (token classifier) rather than a causal LM backbone."""
    config = os.path.join(path, "config.json")
    return os.path.isfile(config) and "ForTokenClassification" in open(config).read()


def check_weights(path: str, field: str = "model.path") -> None:
    """A local model folder's weights are all there and whole: every *.safetensors file (or every shard its
    index names) has a readable header whose tensors end exactly at the end of the file. Reads headers only.
    Hub ids are checked by the download itself."""
    if not os.path.isdir(path):
        return
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{field} '{path}': model.safetensors.index.json is not a valid index ({e})") from None
    else:
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        if any(f.endswith(".bin") for f in os.listdir(path)):
            return  # torch pickles: no cheap check; transformers reports a bad one by name
        raise ValueError(f"{field} '{path}' has no weights (*.safetensors or pytorch_model.bin)")
    for name in files:
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise ValueError(f"{field} '{path}': weights file {name} is missing (named in the index)")
        size = os.path.getsize(file)
        try:
            with open(file, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                if not 2 <= n <= size - 8:
                    raise ValueError("no safetensors header")
                header = json.loads(f.read(n))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            raise ValueError(f"{field} '{path}': {name} is not a safetensors file (empty or corrupted header, "
                             f"{size} bytes)") from None
        if 8 + n + end != size:
            raise ValueError(f"{field} '{path}': {name} is truncated or corrupted: its header needs "
                             f"{8 + n + end} bytes, the file has {size}")


def own_class(auto_class, config):
    """The transformers class `auto_class` picks for `config`, from a private copy of its modeling module.

    vLLM serves some architectures (OLMo 2 here; its registry's "transformers" entries) through its
    Transformers backend, which changes transformers' decoder class in place: it adds a torch.compile
    wrapper base and replaces __init__. A trainer model built after the engine then fails in __init__,
    and one built before it fails in forward (the wrapper needs vLLM's config). With its own copy of
    the module the trainer's classes are not the ones vLLM changes, so the load order does not matter."""
    shared = auto_class._model_mapping[type(config)]
    spec = importlib.util.find_spec(shared.__module__)
    if spec is None or not shared.__module__.startswith("transformers.models."):
        return shared  # not a transformers built-in: nothing of vLLM's touches it
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, shared.__name__)


def load_causal_lm(cfg: ModelConfig, trainable: bool = True, meta: bool = False) -> torch.nn.Module:
    """meta=True (all four loaders): on the meta device, for `shard` to fill (LoRA may be applied between)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model_class = own_class(AutoModelForCausalLM, AutoConfig.from_pretrained(cfg.path))
    model = _pretrained(model_class, cfg.path, cfg, meta)
    if trainable and cfg.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.train(trainable)
    model.requires_grad_(trainable)
    return model


def _pretrained(model_class, path: str, cfg: ModelConfig, meta: bool, config=None, new: tuple[str, ...] = ()):
    """from_pretrained, or with `meta` the same model on the meta device (whole when the checkpoint does not
    allow it: rlcore.models.load.on_meta). `new`: modules the checkpoint lacks; the caller sets them."""
    kwargs = dict(dtype=DTYPES[cfg.dtype], attn_implementation=cfg.attn_implementation)
    model = load.on_meta(model_class, path, config, real=new, **kwargs) if meta else None
    return model if model is not None else model_class.from_pretrained(path, config=config, **kwargs)


def reference_config(model: ModelConfig, teacher: str) -> ModelConfig:
    """The frozen reference model's settings: the policy's, or its path swapped for a distillation teacher's."""
    return dataclasses.replace(model, path=teacher) if teacher else model


def load_critic(critic: CriticConfig, cfg: ModelConfig, meta: bool = False) -> torch.nn.Module:
    """A value head (one output per token) on the policy's backbone, or on the backbone of `critic.path`.
    From a causal LM the head is new: it starts at zero, so V = 0 everywhere before the first update."""
    from transformers import AutoConfig, AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    path = cfg.path if critic.path == "policy" else critic.path
    config = AutoConfig.from_pretrained(path, num_labels=1)
    config.classifier_dropout = 0.0  # dropout would make V differ between the rollout pass and the update
    new_head = critic.path == "policy" or "ForTokenClassification" not in str(config.architectures)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the LM head is dropped and the value head is new: expected
    model_class = own_class(AutoModelForTokenClassification, config)
    model = _pretrained(model_class, path, cfg, meta, config=config, new=("score",) if new_head else ())
    hf_logging.set_verbosity(verbosity)
    if new_head:
        torch.nn.init.zeros_(model.score.weight)
        if model.score.bias is not None:
            torch.nn.init.zeros_(model.score.bias)
    if cfg.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model.train()


def load_reward_model(path: str, cfg: ModelConfig, meta: bool = False) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForSequenceClassification

    model_class = own_class(AutoModelForSequenceClassification, AutoConfig.from_pretrained(path))
    model = _pretrained(model_class, path, cfg, meta)
    model.config.use_cache = False
    return model.eval().requires_grad_(False)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    return model.get_decoder().layers


def shard(model: torch.nn.Module, mesh: DeviceMesh, cfg: ModelConfig, frozen: bool = False) -> torch.nn.Module:
    """FSDP2: each decoder layer is one all-gather unit, the root holds embeddings, norm and head.
    Frozen models (reference, reward) may keep their shards in CPU memory between uses (CUDA only).

    Mixture-of-experts: a decoder layer and all of its experts are one unit. transformers 5 keeps a layer's
    experts as 3-D tensors ([E, 2I, H], [E, H, I]); FSDP2 shards them along the expert dim like any other
    parameter, so at rest each GPU holds 1/W of every layer's experts, and in forward, backward and the
    weight sync one whole layer's experts are gathered at a time (Qwen3-30B-A3B: 128 x 3 x 2048 x 768 =
    0.6B parameters, 1.2 GB in bf16, plus the next layer's when prefetching). Expert parallelism (experts
    resident on different ranks, tokens routed between them) is out of scope: each rank runs its own
    tokens through the whole gathered layer, paying an all-gather of every expert per layer instead of
    EP's all-to-all of tokens."""
    mp = None
    if cfg.mixed_precision != "none":
        mp = MixedPrecisionPolicy(param_dtype=DTYPES[cfg.mixed_precision], reduce_dtype=torch.float32)
    kwargs = {"mesh": mesh} | ({"mp_policy": mp} if mp else {})
    if frozen and cfg.offload_frozen and mesh.device_type == "cuda":
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    if load.pending(model):  # built on the meta device (meta=True): each rank reads its own shards now
        load.fill(model, mesh.device_type, offload="offload_policy" in kwargs)
    # Losses are already divided by a global token count (rlcore.algorithms.objectives.aggregate): reduce
    # gradients as a SUM over ranks, not FSDP's default mean. Plain SUM collectives (gloo has no
    # pre-multiplied sum).
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    return model


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                   temperature: float, with_entropy: bool = False, chunk_tokens: int = 0,
                   position_ids: torch.Tensor | None = None):
    """log p(input_ids[:, t+1] | input_ids[:, :t+1]) at `temperature`, as vLLM's processed logprobs.

    Returns logprobs [B, T=L-1] (and entropy [B, T] of the full next-token distribution).
    chunk_tokens > 0: the LM head, log-softmax and entropy run fused on that many tokens at a time
    (rlcore.models.head_logprobs.HeadLogprobs), recomputed per chunk in backward, so at most one chunk of [tokens, V] fp32 logits exists
    (a 152k vocab at 8k tokens is ~22 GB unchunked); the values equal the unchunked ones up to rounding.
    position_ids (with attention_mask None) carry packed sequences (rlcore.train.packing)."""
    if not chunk_tokens or not plain_lm_head(model):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=False).logits  # [B, L, V]
        return head_logprobs.from_logits(logits[:, :-1], input_ids[:, 1:], temperature, with_entropy)
    hidden = final_hidden_states(model, input_ids, attention_mask, position_ids)[:, :-1]  # [B, T, H]
    B, T, H = hidden.shape
    head = model.get_output_embeddings()
    if isinstance(head.weight, DTensor):
        raise RuntimeError("the LM head is still sharded after forward: token_logprobs needs the FSDP root "
                           "unit kept gathered after forward (fully_shard's default for the root)")
    hidden, targets = hidden.reshape(B * T, H), input_ids[:, 1:].reshape(B * T)  # [B*T, H], [B*T]
    outs = []
    for s in range(0, max(B * T, 1), chunk_tokens):  # one (empty) chunk when there is no next token
        h, t = hidden[s:s + chunk_tokens], targets[s:s + chunk_tokens]
        if isinstance(head, torch.nn.Linear):
            outs.append(head_logprobs.HeadLogprobs.apply(h, head.weight, head.bias, t, temperature, with_entropy))
        else:  # an unusual head module: recompute each chunk through it in backward
            outs.append(checkpoint(head_logprobs.through_module, head, h, t, temperature, with_entropy,
                                   use_reentrant=False))
    if not with_entropy:
        return torch.cat([o[0] for o in outs]).view(B, T)
    return torch.cat([o[0] for o in outs]).view(B, T), torch.cat([o[1] for o in outs]).view(B, T)


# Config fields of architectures whose logits are more than the LM head's output (soft-capped or scaled):
# token_logprobs computes those through the model's own forward, unchunked.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def plain_lm_head(model: torch.nn.Module) -> bool:
    """Are the model's logits exactly its output embedding applied to its decoder's last hidden state?"""
    config = model.config.get_text_config()
    return model.get_output_embeddings() is not None and \
        not any(getattr(config, name, None) not in (None, 1, 1.0) for name in LOGIT_TRANSFORMS)


def final_hidden_states(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                        position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The decoder's last hidden state [B, L, H] (after the final norm), through the model's own forward.

    The whole model runs (logits of the last position only), not its decoder alone: under FSDP2 the
    embedding, final norm and LM head belong to the root unit, which is gathered by the root's forward and
    whose gradients are reduced by the root's backward hooks; the root stays gathered after forward, so the
    caller can apply the head. use_cache=False: with a cache, sdpa and eager attention ignore packing."""
    seen = []
    handle = model.get_decoder().register_forward_hook(lambda module, args, out: seen.append(out.last_hidden_state))
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
              logits_to_keep=1)
    finally:
        handle.remove()
    return seen[0]


def token_values(critic: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The critic's V before each next token, aligned with logprobs: values[:, t] scores the state that
    produced input_ids[:, t + 1]. Returns [B, T=L-1]. position_ids (with attention_mask None): packed rows."""
    return critic(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                  use_cache=False).logits[:, :-1, 0].float()


def sequence_scores(reward_model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                    position_ids: torch.Tensor | None = None, last: torch.Tensor | None = None):
    """One scalar per right-padded sequence [B]: the classifier's logit at its last real token. A packed
    row (input_ids [1, N], position_ids, attention_mask None) gives one per sequence, read at `last` [b].

    The model's own pooling finds that token from pad_token_id, which picks the wrong one when the pad id is
    also the EOS a response ends with; so the per-token logits are read off the `score` head instead (the
    whole model still runs its forward, which FSDP needs)."""
    seen = []
    handle = reward_model.score.register_forward_hook(lambda module, args, out: seen.append(out))
    try:
        reward_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    finally:
        handle.remove()
    scores = seen[0][..., 0].float()  # [B, L]
    if last is not None:
        return scores.reshape(-1)[last]  # [b]: `last` indexes the flattened packed rows
    last = attention_mask.sum(-1) - 1  # [B]
    return scores[torch.arange(len(last)), last]  # [B]


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, total_steps: int):
    """AdamW over the trainable parameters only (with LoRA: the adapters; the frozen base has no state)."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, betas=tuple(cfg.betas),
                            eps=cfg.eps, weight_decay=cfg.weight_decay)

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
