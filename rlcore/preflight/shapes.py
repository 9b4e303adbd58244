"""A model's sizes for the launch plan (rlcore/preflight/plan.py), from its config.json: no weights read.

Parameter counts come from the model itself: the transformers class rlcore builds for the role, instantiated
on the meta device from the config (shapes only, no memory), its parameters summed (tied embeddings once):
  actor, reference   the causal LM (AutoModelForCausalLM)                     rlcore.models.build.load_causal_lm
  critic             the token classifier, 1 label: backbone + value head      load_critic
  reward model       the sequence classifier, 1 label: backbone + score head   load_reward_model
The FSDP2 units are those of rlcore.models.build.shard: one per decoder layer and the root (everything else:
embedding, final norm, the head). `layer` is the largest decoder layer (a mixture-of-experts layer with all of
its experts), `root` the root unit. LoRA adapters: r * (in + out) of each decoder-layer nn.Linear that
lora.targets names, found by rlcore.models.lora.targets_in on the same meta model (MoE experts are 3-D tensors,
not nn.Linear: LoRA leaves them alone and they count 0).

Two per-token figures stay formulas (notation: L layers, h hidden, n_kv key-value heads, d head_dim, M the MLP
activation width: intermediate_size, or for a mixture of experts num_experts_per_tok * moe_intermediate_size
plus any shared expert's width, what one token passes through):
  KV per token       2 (K and V) * L * max(1, n_kv/k) * d * bytes, k the rollout TP degree (vLLM shards KV
                     heads over TP, replicating them when k > n_kv)
  activations        bytes/2 * L*(10h + 4*n_kv*d + 8M) per token without activation checkpointing,
                     bytes/2 * (2h*L + 10h + 4*n_kv*d + 8M) with it (each layer's input kept, one layer live)
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass

# The transformers auto class rlcore builds for each role (rlcore/models/build.py).
AUTO_CLASS = {"actor": "AutoModelForCausalLM", "reference": "AutoModelForCausalLM",
              "critic": "AutoModelForTokenClassification", "reward": "AutoModelForSequenceClassification"}


@dataclass(frozen=True)
class Shapes:
    """One model in one role: its parameter counts (from the meta model) and the widths the formulas need."""
    params: int  # every parameter, tied embeddings once
    layer: int  # the largest decoder layer's parameters: one FSDP unit
    root: int  # the root FSDP unit's: all but the decoder layers (embedding, final norm, untied LM head or head)
    layers: int  # L decoder layers
    linears: dict  # {name: sum over the decoder layers of in + out} of the layers' nn.Linears (LoRA targets)
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int  # M, the MLP activation width of one token (see the module docstring)
    vocab: int

    @classmethod
    def from_config(cls, config: dict, role: str = "actor") -> Shapes:
        """The shapes of the model a parsed config.json builds in `role`; cached, as the plan's levers rebuild
        the plan many times. Raises ValueError when transformers cannot build it."""
        return _shapes(json.dumps(config, sort_keys=True), role)

    def adapter_params(self, rank: int, targets: list[str]) -> int:
        """LoRA parameters over all layers: r * (in + out) for each adapted linear (rlcore/models/lora.py)."""
        return rank * sum(self.linears.get(t, 0) for t in set(targets))

    def kv_bytes_per_token(self, tp: int, dtype_bytes: int) -> int:
        return 2 * self.layers * max(1, self.kv_heads // tp) * self.head_dim * dtype_bytes

    def activation_bytes_per_token(self, checkpointing: bool, dtype_bytes: int) -> float:
        one = 10 * self.hidden + 4 * self.kv_heads * self.head_dim + 8 * self.mlp
        return dtype_bytes / 2 * (2 * self.hidden * self.layers + one if checkpointing else self.layers * one)


@functools.lru_cache(maxsize=64)
def _shapes(text: str, role: str) -> Shapes:
    hf, model = meta_model(json.loads(text), role)
    per_layer = [numel(layer) for layer in model.get_decoder().layers]
    total, heads = numel(model), hf.num_attention_heads
    return Shapes(params=total, layer=max(per_layer), root=total - sum(per_layer), layers=len(per_layer),
                  linears=linear_sides(model), hidden=hf.hidden_size, heads=heads,
                  kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
                  head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads, mlp=mlp_width(hf),
                  vocab=hf.vocab_size)


def meta_model(config: dict, role: str):
    """(the transformers config, the model of `role` on the meta device). ValueError saying what failed."""
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from rlcore.models.build import own_class

    kind = config.get("model_type")
    if kind not in CONFIG_MAPPING:
        raise ValueError("it has no model_type" if kind is None else
                         f"model_type '{kind}' is unknown to transformers {transformers.__version__}")
    auto = getattr(transformers, AUTO_CLASS[role])
    if CONFIG_MAPPING[kind] not in auto._model_mapping:
        raise ValueError(f"transformers {transformers.__version__} has no {AUTO_CLASS[role]} for '{kind}'")
    try:
        # A critic and a reward model have one label (load_critic sets it; checks refuse a reward model without)
        hf = CONFIG_MAPPING[kind].from_dict(config, **({} if role in ("actor", "reference") else {"num_labels": 1}))
        with torch.device("meta"):  # shapes only: no memory, no weights
            model = own_class(auto, hf)._from_config(hf)
    except Exception as e:  # a model's own code may raise anything on a config it cannot build
        reason = " ".join(line.strip() for line in str(e).splitlines() if line.strip())[:300]
        raise ValueError(f"{type(e).__name__}{': ' + reason if reason else ''}") from None
    return hf, model


def numel(module) -> int:
    return sum(p.numel() for p in module.parameters())  # parameters() yields a tied weight once


def linear_sides(model) -> dict[str, int]:
    """{leaf name: sum of in + out} over the decoder layers' nn.Linears, matched as rlcore's LoRA matches them."""
    import torch

    from rlcore.models.lora import targets_in

    names = {n.rsplit(".", 1)[-1] for layer in model.get_decoder().layers for n, m in layer.named_modules()
             if isinstance(m, torch.nn.Linear)}
    return {name: sum(model.get_submodule(p).in_features + model.get_submodule(p).out_features for p in paths)
            for name, paths in targets_in(model, sorted(names)).items()}


def mlp_width(hf) -> int:
    """M: intermediate_size; with experts, the routed experts' widths plus any shared expert's."""
    experts = getattr(hf, "num_experts", None) or getattr(hf, "num_local_experts", None) or \
        getattr(hf, "n_routed_experts", None)
    if not experts:
        return hf.intermediate_size
    expert = getattr(hf, "moe_intermediate_size", None) or hf.intermediate_size
    shared = getattr(hf, "shared_expert_intermediate_size", None) or \
        (getattr(hf, "n_shared_experts", None) or 0) * expert
    return hf.num_experts_per_tok * expert + shared


def model_shapes(path: str, field: str = "model.path", role: str = "actor") -> Shapes:
    """The Shapes of the model at `path` in `role`; ValueError naming the field and the file on bad input."""
    file = config_file(path, field)
    try:
        with open(file) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{field} '{path}': config.json is not readable JSON ({e})") from None
    try:
        return Shapes.from_config(config, role)
    except ValueError as e:
        raise ValueError(f"{field} '{path}': config.json at {file} cannot build a model on the meta device: "
                         f"{e}") from None


def config_file(path: str, field: str) -> str:
    """config.json of a local model folder, or of a hub id already in the hub cache (never the network)."""
    local = os.path.join(os.path.expanduser(path), "config.json")
    if os.path.isfile(local):
        return local
    if path and not path.startswith(("/", ".", "~")) and path.count("/") <= 1:
        from huggingface_hub import try_to_load_from_cache
        found = try_to_load_from_cache(path, "config.json")
        if isinstance(found, str):
            return found
    raise ValueError(f"{field} '{path}' has no config.json locally or in the hub cache; the plan reads "
                     f"model shapes from there (download the model, or run the recipe's prepare first)")
