"""HF export: a trained model as a consolidated HF folder that transformers and vLLM load.

    runs/<name>/hf/step_<N>/
        model.safetensors             (or model-0000i-of-0000n.safetensors + model.safetensors.index.json)
        config.json, generation_config.json, tokenizer files

Written during a run (train.export_every, and at the end) from the live FSDP2 model, one FSDP2 unit
gathered at a time, or afterwards from any checkpoint by launch/convert.py; both give the same bytes.
Weights are in checkpoint format, as `save_pretrained` writes them (rlcore/models/weights.py: e.g. an MoE
layer's fused experts split back into one tensor per expert). Tensors keep the master dtype
(model.dtype); config.json is the original model's. The folder is written beside itself under a
temporary name and renamed when whole.

A LoRA policy (rlcore/models/lora.py) exports a PEFT adapter folder instead (adapter_config.json +
adapter_model.safetensors, for vLLM's LoRARequest or peft), and on request (lora.export_merged) the merged
full model beside it as hf/step_<N>_merged/.
"""
from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Iterable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from rlcore.distributed import watchdog
from rlcore.models import lora
from rlcore.models.weights import by_layer, checkpoint_weights, to_checkpoint_format
from rlcore.outputs import checkpoint


def write_hf(out: Path, tensors: Iterable[tuple[str, torch.Tensor]], model_files: Path | None, tokenizer=None,
             model_path: str = "", writer: bool = True, shard_bytes: int = 5 * 2**30) -> None:
    """Write an HF model folder atomically: safetensors shards (+ index when more than one), config,
    generation config, tokenizer. Every rank iterates `tensors` (they may be collectives); `writer`
    writes. Files come from `model_files` (a checkpoint's) or else from `model_path` + `tokenizer`."""
    from safetensors.torch import save_file

    tmp = out.with_name(f".{out.name}.tmp")
    if writer:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    shards, shard, size, error = [], {}, 0, None

    def flush():
        nonlocal shard, size
        if shard:
            name = f"shard-{len(shards):05d}.safetensors"
            save_file(shard, tmp / name, metadata={"format": "pt"})
            shards.append((name, list(shard)))
        shard, size = {}, 0

    for name, tensor in tensors:
        if writer and error is None:
            shard[name] = tensor.contiguous()
            size += tensor.numel() * tensor.element_size()
            try:
                if size >= shard_bytes:
                    flush()
            except OSError as e:  # keep iterating: the other ranks are still gathering
                error = e
    if not writer:
        return
    if error is not None:
        raise error
    flush()
    if len(shards) == 1:
        os.rename(tmp / shards[0][0], tmp / "model.safetensors")
    else:
        weight_map = {}
        for i, (name, keys) in enumerate(shards):
            final = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            os.rename(tmp / name, tmp / final)
            weight_map |= dict.fromkeys(keys, final)
        (tmp / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if model_files is not None:
        for f in model_files.iterdir():
            shutil.copy2(f, tmp / f.name)
    else:
        checkpoint.write_model_files(model_path, tokenizer, tmp)
    for f in tmp.iterdir():
        f.chmod(0o644)  # the safetensors writer leaves its files owner-only; a model is for everyone to read
    checkpoint._replace(tmp, out)


@watchdog.stage("export")
def export_hf(out: Path, model: torch.nn.Module, model_path: str, tokenizer, merged: bool = False,
              group=None, writer: int = 0) -> None:
    """Collective over the ranks that hold the model (`group`, default the world): the trained model as an HF
    folder at `out`, written by rank `writer`. A LoRA model exports its adapters as a PEFT folder at `out`
    (adapter_config.json + adapter_model.safetensors, fp32), and with `merged` also the full merged model
    (W + (alpha/r) B A) as an HF folder at `out`_merged."""
    error, writes = None, dist.get_rank() == writer
    if lora.has_lora(model):
        tensors = lora.adapter_tensors(model)  # collective: every rank gathers
        if writes:
            error = _write_adapter(out, tensors, lora.peft_config(lora.config_of(model), model_path,
                                                                 lora.config_of(model).targets))
        checkpoint._agree(error, group)
        if not merged:
            return
        out = out.with_name(f"{out.name}_merged")
    try:
        write_hf(out, checkpoint_weights(model, master=True), None, tokenizer, model_path, writer=writes)
    except Exception as e:  # OSError, or the safetensors writer's own error type
        error = f"cannot write HF export {out}: {e}"
    checkpoint._agree(error, group)


def _write_adapter(out: Path, tensors: dict[str, torch.Tensor], config: dict) -> str | None:
    """A PEFT adapter folder, written beside itself and renamed when whole; an error line, or None."""
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        lora.write_peft(tmp, tensors, config)
        for f in tmp.iterdir():
            f.chmod(0o644)
        checkpoint._replace(tmp, out)
    except Exception as e:  # OSError, or the safetensors writer's own error type
        return f"cannot write LoRA adapter export {out}: {e}"
    return None


def read_model(path: Path, name: str = "policy") -> dict[str, torch.Tensor]:
    """One model's full weights from a DCP checkpoint, in one process (no process group needed)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    prefix = f"{name}.model."
    metadata = FileSystemReader(str(path)).read_metadata()
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in metadata.state_dict_metadata.items()
             if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)}
    if not state:
        raise ValueError(f"checkpoint {path} holds no model '{name}'")
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=path, no_dist=True)
    return {k[len(prefix):]: v for k, v in state.items()}


def checkpoint_format(state: dict[str, torch.Tensor], config_dir: Path) -> Iterable[tuple[str, torch.Tensor]]:
    """A checkpoint's in-memory state dict -> checkpoint format, as the live export converts it (layer by
    layer). transformers' reversal needs the model's modules, not its weights: built on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_dir))
    for group in by_layer(state):
        yield from to_checkpoint_format(model, group).items()
