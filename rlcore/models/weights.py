"""Checkpoint-format weights, one FSDP2 unit at a time: the form in which weights leave the trainer.

transformers 5 keeps some models in memory under other names and layouts than its checkpoint files, and
converts on load (`from_pretrained`) and back on save (`save_pretrained`). A Qwen3-MoE layer, e.g.:

    in memory (what the trainer trains)            checkpoint format (what vLLM and the hub expect)
    mlp.experts.gate_up_proj        [E, 2I, H]  -> mlp.experts.{0..E-1}.gate_proj.weight  [I, H]
                                                   mlp.experts.{0..E-1}.up_proj.weight    [I, H]
    mlp.experts.down_proj           [E, H, I]   -> mlp.experts.{0..E-1}.down_proj.weight  [H, I]

(Mixtral also renames `mlp.` back to `block_sparse_moe.` and the experts to w1 / w3 / w2.) Both the weight
sync into vLLM (`reload_weights(..., is_checkpoint_format=True)`) and the HF export need checkpoint format,
so both read it here, through transformers' own reversal (`revert_weight_conversion`, the function
`save_pretrained` calls), never through a name table of rlcore's. The reversal works on any set of whole
parameters whose conversions are complete within it; a decoder layer holds all of its experts (one FSDP2
unit, rlcore.models.build.shard), so it runs unit by unit and the memory bound of the sync holds: one unit.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from rlcore.models.lora import fold, scale_of


@dataclass
class Unit:
    name: str  # module path ("" for the root)
    module: torch.nn.Module
    params: list[str]  # the parameters this unit owns, by name relative to `module`

    def tensors(self) -> dict[str, torch.Tensor]:
        """{full in-memory name: parameter} as registered now: FSDP2 swaps the sharded DTensors for
        plain full tensors between unshard() and reshard()."""
        current = dict(self.module.named_parameters())
        return {f"{self.name}.{p}" if self.name else p: current[p] for p in self.params}


def units(model: torch.nn.Module) -> list[Unit]:
    """The model's FSDP2 units (each decoder layer, then the root with what no layer owns), or the whole
    model as one unit when it is not sharded. Tied parameters appear once, as in an HF checkpoint."""
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, FSDPModule)] or [("", model)]
    child_prefixes = tuple(f"{name}." for name, _ in found if name)
    return [Unit(name, module, [p for p, _ in module.named_parameters()
                                if name or not p.startswith(child_prefixes)])  # nested units own those
            for name, module in found]


def to_checkpoint_format(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """In-memory names and layouts -> the ones `save_pretrained` writes, by transformers' own reversal of the
    conversions the model was loaded with (or its model type's defaults). Identity for most dense models."""
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(model, tensors)


def checkpoint_weights(model: torch.nn.Module, master: bool = False, stats=None, dtype: torch.dtype | None = None,
                       overlap: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (checkpoint name, full tensor) one FSDP2 unit at a time; a collective, so every rank iterates it.

    master=False (the weight sync): `unshard()` all-gathers a unit in one collective, in the compute dtype
    under mixed precision, and `reshard()` frees it before the next. Sync tensors are copies in `dtype` (the
    engine's; one copy that also converts, where the gathered dtype differs): vLLM may hold one until its layer
    is complete (padded vocab layers wait until the end) while the gathered storage is freed. With `overlap`,
    the next unit's all-gather is started before the current unit is handed to the consumer (the engine's
    load), and waited for only when its turn comes: the sync then holds the current unit's copies and the
    next unit's gathered shards, two units, never more. master=True (the HF export): each parameter's full
    master-dtype tensor, on CPU. Converting a unit (e.g. splitting fused experts) may briefly hold a second
    copy of it. `stats`, if given (rlcore.rollout.SyncStats), counts bytes and the largest unit.
    A model with LoRA adapters (rlcore/models/lora.py) leaves merged: W + (alpha/r) B A, no adapter tensors."""
    found, scale = units(model), scale_of(model)
    if master:
        for unit in found:
            # One parameter on the device at a time; the unit accumulates in CPU memory.
            tensors = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu()
                       for n, p in unit.tensors().items()}
            yield from _counted(model, fold(tensors, scale), stats)
        return
    for tensors in checkpoint_units(model, stats, dtype, overlap):
        yield from tensors.items()


def checkpoint_units(model: torch.nn.Module, stats=None, dtype: torch.dtype | None = None,
                     overlap: bool = True) -> Iterator[dict[str, torch.Tensor]]:
    """The sync side of `checkpoint_weights`, a unit at a time: {checkpoint name: full tensor} per FSDP2 unit
    (a collective; the split mesh's transfer sends each unit as one message, rlcore/modes/split.py)."""
    found, scale = units(model), scale_of(model)
    pending = _unshard(found[0], async_op=overlap)
    for i, unit in enumerate(found):
        if pending is not None:
            pending.wait()
        following = found[i + 1] if i + 1 < len(found) else None
        pending = _unshard(following, async_op=True) if overlap and following else None
        # LoRA (merged sync): each adapted weight leaves as W + s B A, computed before the cast to `dtype`.
        tensors = fold({n: p.detach() for n, p in unit.tensors().items()}, scale)
        tensors = {n: t.to(dtype or t.dtype, copy=True) for n, t in tensors.items()}
        if isinstance(unit.module, FSDPModule):
            unit.module.reshard()
        yield dict(_counted(model, tensors, stats))
        if not overlap and following:
            _unshard(following, async_op=False)


def _unshard(unit: Unit, async_op: bool):
    """All-gather a unit's shards (a handle to wait on when async); nothing to do for an unsharded model."""
    return unit.module.unshard(async_op=async_op) if isinstance(unit.module, FSDPModule) else None


def _counted(model, tensors: dict[str, torch.Tensor], stats) -> Iterator[tuple[str, torch.Tensor]]:
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    if stats is not None:
        stats.bytes += size
        stats.peak_bucket_bytes = max(stats.peak_bucket_bytes, size)
    yield from to_checkpoint_format(model, tensors).items()


_LAYER = re.compile(r"^(.*\.layers\.(\d+))\.")


def by_layer(state: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """A full in-memory state dict split and ordered as `units` splits a live model (the root with what no
    layer owns, then each decoder layer in order), so a saved checkpoint converts, and shards into files,
    exactly as the live model exports."""
    groups: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, tensor in state.items():
        m = _LAYER.match(name)
        groups.setdefault((int(m.group(2)), m.group(1)) if m else (-1, ""), {})[name] = tensor
    return [groups[key] for key in sorted(groups)]
