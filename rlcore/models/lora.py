"""LoRA: low-rank adapters trained on a frozen base, rlcore's own (no peft dependency).

    y = x W^T + b + (alpha / r) * (x A^T) B^T        A [r, in] Kaiming-uniform, B [out, r] zeros

`LoRALinear` is an nn.Linear that keeps the base layer's own `weight` / `bias`, so every base name stays
what it was (`model.layers.0.self_attn.q_proj.weight`): FSDP2 units, checkpoint-format conversion
(rlcore/models/weights.py) and the HF export see the same model. The adapters are two bias-free linears,
`q_proj.lora_A.weight` and `q_proj.lora_B.weight`: exactly the suffixes a PEFT adapter file uses.

- B starts at zero, so before the first update the model is bitwise the base model.
- Only decoder-layer linears are wrapped (never embeddings or the LM head: the head may be tied to the
  embedding, and rlcore's chunked head reads `lm_head.weight` directly). MoE experts (3-D tensors in
  transformers 5) are not nn.Linear and stay frozen.
- `apply` runs before `fully_shard` (rlcore.models.build.shard): base and adapters of a layer share one FSDP2
  unit; FSDP2 reduce-scatters only parameters that have gradients.
- The reference model is this model with its adapters switched off (`adapters_off`): no second copy.

The PEFT folder (`write_peft` / `read_peft`) is what the engine loads in `lora.sync=adapter` mode and what
the export writes: adapter_config.json + adapter_model.safetensors with keys
`base_model.model.<module path>.lora_A.weight` (the layout peft writes and vLLM 0.32 loads).
"""
from __future__ import annotations

import contextlib
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from rlcore.config import LoraConfig, OptimConfig
from rlcore.config.roles import models_of

# The engine's max_lora_rank must be one of these (vllm/config/lora.py, MaxLoRARanks, vLLM 0.32); an
# adapter of any rank up to it is served (vLLM pads it), so rlcore rounds lora.rank up to the next one.
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
PEFT_PREFIX = "base_model.model."


class LoRALinear(torch.nn.Linear):
    """A frozen nn.Linear plus a trainable low-rank update; see the module docstring for the maths."""

    def __init__(self, base: torch.nn.Linear, rank: int, alpha: float, dtype: torch.dtype = torch.float32,
                 generator: torch.Generator | None = None):
        torch.nn.Module.__init__(self)  # not nn.Linear's: it would allocate a new weight
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias  # the base's own parameters, names unchanged
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        device = base.weight.device
        if device.type == "meta":  # a base to be read from its checkpoint later (rlcore/models/load.py): the
            device = torch.device("cpu")  # adapters are not in it, so they are real now and keep these values
        self.lora_A = torch.nn.Linear(self.in_features, rank, bias=False, device=device, dtype=dtype)
        self.lora_B = torch.nn.Linear(rank, self.out_features, bias=False, device=device, dtype=dtype)
        # PEFT's init: A as nn.Linear's default (Kaiming-uniform, a=sqrt(5)), B = 0, so B A = 0 at the start.
        # Drawn on CPU from `generator`: every rank draws the same A before fully_shard keeps its slice.
        a = torch.empty(self.lora_A.weight.shape, dtype=dtype)
        torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
        with torch.no_grad():
            self.lora_A.weight.copy_(a)
        torch.nn.init.zeros_(self.lora_B.weight)
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        self.adapter_on = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        if not self.adapter_on:
            return out
        # The adapters keep their own dtype (fp32) under a bf16 base: cast in, and the update back out.
        delta = self.lora_B(self.lora_A(x.to(self.lora_A.weight.dtype))) * self.scale
        return out + delta.to(out.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, rank={self.rank}, alpha={self.alpha:g}"


def targets_in(model: torch.nn.Module, targets: list[str]) -> dict[str, list[str]]:
    """{target name: module paths of the decoder-layer nn.Linears it names}. A target matches a module
    whose last name component equals it (`q_proj` matches `model.layers.3.self_attn.q_proj`)."""
    found: dict[str, list[str]] = {t: [] for t in targets}
    for path, layer in _decoder_layers(model):
        for name, module in layer.named_modules():
            leaf = name.rsplit(".", 1)[-1]
            if leaf in found and isinstance(module, torch.nn.Linear):
                found[leaf].append(f"{path}.{name}")
    return found


def _decoder_layers(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    layers = model.get_decoder().layers
    prefix = next(n for n, m in model.named_modules() if m is layers)
    for i, layer in enumerate(layers):
        yield f"{prefix}.{i}", layer


def apply(model: torch.nn.Module, cfg: LoraConfig, seed: int = 0) -> torch.nn.Module:
    """Freeze the whole model and wrap cfg.targets in LoRALinear (in place; before rlcore.models.build.shard).
    Identity when LoRA is off. The adapters are fp32 whatever the base dtype; A is drawn from `seed` (the run
    seed) alone, so it is the same on every rank and for any world size or load order."""
    if not cfg.enabled:
        return model
    model.requires_grad_(False)
    found = targets_in(model, cfg.targets)
    missing = [t for t, paths in found.items() if not paths]
    if missing:
        raise ValueError(f"lora.targets: {', '.join(missing)} names no linear layer of the decoder layers")
    generator = torch.Generator().manual_seed(seed)
    for path in sorted(p for paths in found.values() for p in paths):  # one fixed order of draws
        parent_path, _, leaf = path.rpartition(".")
        parent = model.get_submodule(parent_path)
        setattr(parent, leaf, LoRALinear(getattr(parent, leaf), cfg.rank, cfg.alpha, generator=generator))
    return model


def lora_modules(model: torch.nn.Module) -> list[tuple[str, LoRALinear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoRALinear)]


def has_lora(model: torch.nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for m in model.modules())


@contextlib.contextmanager
def adapters_off(model: torch.nn.Module):
    """The base model for the forwards inside: the reference model of a KL term, with no second copy."""
    wrapped = [m for _, m in lora_modules(model)]
    for m in wrapped:
        m.adapter_on = False
    try:
        yield model
    finally:
        for m in wrapped:
            m.adapter_on = True


def optim_config(lora: LoraConfig, optim: OptimConfig) -> OptimConfig:
    """The policy's AdamW settings with LoRA on: the same, at lora.lr_scale x optim.lr."""
    return replace(optim, lr=optim.lr * lora.lr_scale) if lora.enabled else optim


def engine_max_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that serves an adapter of this rank."""
    return next(r for r in VLLM_MAX_LORA_RANKS if r >= rank)


def check(cfg, hf_config, cuda: bool) -> None:
    """Bad LoRA input, before any engine starts (rlcore.preflight.checks.check_models); raises ValueError naming the
    key. `cfg` is the whole Config, `hf_config` the policy's transformers config."""
    lo = cfg.lora
    if not lo.enabled:
        return
    quant = getattr(hf_config, "quantization_config", None)
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else getattr(quant, "quant_method", "?")
        raise ValueError(f"lora.enabled=true needs an unquantized base: model.path '{cfg.model.path}' is quantized "
                         f"({method}); the engine would serve another base than the trainer's (no QLoRA)")
    if models_of(cfg).critic:
        raise ValueError(f"lora.enabled=true with a critic (critic.path='{cfg.critic.path}'): a critic cannot share "
                         f"the policy's adapters; set lora.enabled=false or use a critic-free algorithm (GRPO)")
    experts = getattr(hf_config, "num_experts", 0) or getattr(hf_config, "num_local_experts", 0)
    if experts and not cuda and lo.sync == "adapter":
        raise ValueError(f"lora.sync=adapter: vLLM's CPU engine cannot serve LoRA on a mixture-of-experts model "
                         f"({hf_config.model_type}, {experts} experts); use lora.sync=merged")
    from transformers import AutoModelForCausalLM

    from rlcore.models.build import own_class

    with torch.device("meta"):  # shapes and names only: no memory, no weights read
        model = own_class(AutoModelForCausalLM, hf_config)._from_config(hf_config)
    found = targets_in(model, lo.targets)
    missing = [t for t, paths in found.items() if not paths]
    if not lo.targets or missing:
        names = sorted({n.rsplit(".", 1)[-1] for _, layer in _decoder_layers(model)
                        for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ValueError(f"lora.targets: {', '.join(missing) or 'empty'} names no linear layer of the decoder layers "
                         f"of model.path (its linears: {', '.join(names)})")


# ---------------------------------------------------------------------------------------------- leaving the trainer

def adapter_tensors(model: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """{module path.lora_A.weight: full tensor} of every adapter, on CPU; a collective (every rank calls it,
    and every rank gets the same full tensors). One parameter is gathered at a time, never the base."""
    out = {}
    for name, p in model.named_parameters():
        if ".lora_A." in name or ".lora_B." in name:
            full = p.full_tensor() if isinstance(p, DTensor) else p
            out[name] = full.detach().to("cpu", dtype or full.dtype, copy=True)
    return out


def fold(tensors: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """Full tensors of one unit with adapters -> the same unit with each adapted weight merged out of place,
    W + scale * B @ A (computed in fp32, stored in W's dtype), and no adapter tensors. Identity without
    adapters. Never in place: merging into live weights and back compounds rounding (TRL #6688)."""
    if not any(".lora_A." in n for n in tensors):
        return tensors
    out = {}
    for name, t in tensors.items():
        if ".lora_A." in name or ".lora_B." in name:
            continue
        prefix = name[:-len("weight")] if name.endswith(".weight") else None
        a, b = (tensors.get(f"{prefix}lora_{x}.weight") if prefix else None for x in "AB")
        if a is None:
            out[name] = t
            continue
        out[name] = (t.float() + scale * (b.float() @ a.float())).to(t.dtype)
    return out


def scale_of(model: torch.nn.Module) -> float:
    """alpha / rank of the model's adapters (one value for all of them); 0.0 without adapters."""
    wrapped = lora_modules(model)
    return wrapped[0][1].scale if wrapped else 0.0


def config_of(model: torch.nn.Module) -> LoraConfig:
    """The LoraConfig a model's adapters were made with (rank, alpha, the target names wrapped)."""
    wrapped = lora_modules(model)
    return LoraConfig(enabled=True, rank=wrapped[0][1].rank, alpha=wrapped[0][1].alpha,
                      targets=sorted({n.rsplit(".", 1)[-1] for n, _ in wrapped}))


def peft_config(cfg: LoraConfig, base_path: str, targets: list[str]) -> dict:
    """adapter_config.json as PEFT writes it for a plain LoRA (what vllm/lora/peft_helper.py validates)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": cfg.rank, "lora_alpha": cfg.alpha,
            "target_modules": sorted(targets), "lora_dropout": 0.0, "bias": "none", "use_rslora": False,
            "use_dora": False, "modules_to_save": None, "base_model_name_or_path": base_path,
            "fan_in_fan_out": False, "inference_mode": True}


def write_peft(folder: Path, tensors: dict[str, torch.Tensor], config: dict) -> None:
    """A PEFT adapter folder from adapter_tensors' output (names as the model holds them; for the dense
    attention and MLP linears rlcore wraps these are the checkpoint names too)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({PEFT_PREFIX + n: t.contiguous() for n, t in tensors.items()}, folder / "adapter_model.safetensors",
              metadata={"format": "pt"})
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=1))


def read_peft(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(adapter_config.json, {module path.lora_A.weight: tensor}) of a PEFT adapter folder."""
    from safetensors.torch import load_file

    config = json.loads((Path(folder) / "adapter_config.json").read_text())
    tensors = load_file(Path(folder) / "adapter_model.safetensors")
    return config, {n[len(PEFT_PREFIX):] if n.startswith(PEFT_PREFIX) else n: t for n, t in tensors.items()}


def load_peft(model: torch.nn.Module, folder: Path) -> torch.nn.Module:
    """A plain (unsharded) base model + a PEFT folder -> the model with those adapters (in place)."""
    config, tensors = read_peft(folder)
    cfg = LoraConfig(enabled=True, rank=config["r"], alpha=config["lora_alpha"], targets=config["target_modules"])
    apply(model, cfg)
    params = dict(model.named_parameters())
    unknown = sorted(set(tensors) - set(params))
    if unknown:
        raise ValueError(f"adapter {folder}: {unknown[0]} is no adapter of this model")
    with torch.no_grad():
        for name, t in tensors.items():
            params[name].copy_(t)
    return model
