"""Loading that scales with the node: each rank reads from the checkpoint only the rows its FSDP2 shards keep.

`from_pretrained` on every rank holds W whole copies of the model in a node's host memory (8 x 61 GB for
Qwen3-30B-A3B in bf16, more in fp32) before `fully_shard` keeps 1/W of each. With meta=True the loaders of
rlcore.models.build do this instead:

    1. on_meta  the model from_pretrained would build (same class, config, dtype, attention), on the meta
                device: names, shapes and dtypes, no storage. Keys are mapped to the checkpoint here, by
                headers only. A module the checkpoint lacks (a critic's new value head) is made real on CPU
                and initialised as from_pretrained does. LoRA adapters (rlcore.models.lora), added next, are real.
    2. shard    rlcore.models.build.shard applies fully_shard per unit, still on meta, then calls `fill`.
    3. fill     to_empty gives each rank storage for its own shards only, where FSDP2 keeps them (its GPU,
                pinned CPU memory when offloaded, or CPU). Every tensor still on meta then reads its rows
                from the safetensors files (on CPU, copied to the shard): FSDP2 shards dim 0 as torch.chunk
                does (rows [a, b) of ceil(N / W) each, the last ranks' shorter or empty), and
                `get_slice(key)[a:b]` reads just those bytes. Tensors that were real keep their values.

Conversions: transformers 5 renames and fuses some checkpoint tensors on load (Qwen3-MoE keeps one tensor per
expert on disk, mlp.experts.{e}.gate_proj.weight [I, H], and [E, 2I, H] gate_up_proj in memory). Keys are
mapped by transformers' own machinery, exactly as from_pretrained maps them (get_model_conversion_mapping,
rename_source_key, in its key order), and a fused tensor is built by its WeightConverter's own ops. A converter
that only stacks experts on dim 0 (MergeModulelist, then concatenations along other dims: the MoE case) is fed
only the experts this rank keeps, as transformers' own DTensor loading does; any other converter is built
whole, and then this rank's rows are taken.

Buffers: non-persistent ones (rotary inv_freq, Gemma's embed_scale) are not in checkpoints. from_pretrained
computes them after loading with initialize_weights(), every loaded tensor marked as loaded
(`_is_hf_initialized`) so nothing else is touched; `fill` makes the same call the same way.

Memory per rank: its shards (1/W of the model; on GPU they are on the device) + what one read holds on CPU:
a parameter's rows, or a converted parameter built whole (a layer's fused experts: this rank's experts only),
so at most one FSDP2 unit + a fixed overhead (the meta model, file headers). Reads use pread (safetensors >=
0.8): a memory-mapped read would count every page it touched in the rank's resident memory until the file is
closed. benchmarks/loading.py measures it.

Exactness (tests/test_loading.py): the same values, dtypes, tied weights and buffers as from_pretrained
followed by fully_shard, bit for bit. Casts are elementwise, so casting rows equals taking rows of the cast.

Fallback: `on_meta` returns None, and the loader loads the model whole on every rank as before, when the
checkpoint is not safetensors (model.safetensors or an index of shards: torch .bin files are pickles, read
whole), or when from_pretrained would initialise a tensor itself: one the checkpoint lacks, one of another
shape, or a dtype plan (`_keep_in_fp32_modules`) in effect.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections import defaultdict

import torch
from torch.distributed.tensor import DTensor

PENDING = "rlcore_checkpoint"  # attribute of a model on_meta built: its Sources, read by fill


@dataclasses.dataclass
class Source:
    """Where one model tensor (or, for a converter, the tensors it makes) comes from."""
    converter: object | None  # transformers' WeightConverter; None: read as is, under its own name or a new one
    tensors: list[tuple[str, str, str]]  # (source pattern, file, checkpoint key), in from_pretrained's order


def safetensors_files(path: str) -> list[str] | None:
    """The files from_pretrained reads, in its order of preference: model.safetensors, or those of
    model.safetensors.index.json. A hub id resolves to its cached (or downloaded) snapshot. None when the
    weights are not safetensors."""
    if not os.path.isdir(path):
        from huggingface_hub import snapshot_download

        path = snapshot_download(path, allow_patterns=["model*.safetensors", "model.safetensors.index.json"])
    single, index = os.path.join(path, "model.safetensors"), os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(single):
        return [single]
    if not os.path.isfile(index):
        return None
    with open(index) as f:
        return [os.path.join(path, name) for name in sorted(set(json.load(f)["weight_map"].values()))]


def on_meta(model_class, path: str, config, dtype: torch.dtype, attn_implementation: str | None,
            real: tuple[str, ...] = ()) -> torch.nn.Module | None:
    """from_pretrained's model on the meta device, to be filled by `fill` after fully_shard; None (with a note
    on rank 0): load it whole (the module docstring's fallback). `real`: modules the checkpoint lacks (a
    critic's new head), made real on CPU and initialised as from_pretrained does, drawing the same numbers
    from the global RNG, so that what runs after the load draws what it drew before."""
    from transformers import AutoConfig

    files = safetensors_files(path)
    if files is None:
        return _whole(path, "its weights are not safetensors (model.safetensors or an index of shards)")
    config = copy.deepcopy(config if config is not None else AutoConfig.from_pretrained(path))
    if getattr(config, "transformers_weights", None):
        return _whole(path, "its config names its weights file (transformers_weights)")
    with torch.device("meta"):  # what AutoModel.from_config calls, as from_pretrained builds before loading
        model = model_class._from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    model.config.name_or_path = path
    if model._get_dtype_plan(dtype):
        return _whole(path, "transformers keeps some of its modules in float32 (_keep_in_fp32_modules)")
    for name in real:  # as from_pretrained initialises what the checkpoint lacks: on CPU, from the global RNG
        model._init_weights(model.get_submodule(name).to_empty(device="cpu"))
    sources, missing = _sources(model, files)
    if missing:
        return _whole(path, f"from_pretrained would initialise {', '.join(missing[:3])}"
                            f"{' and others' if len(missing) > 3 else ''} itself (not in the checkpoint, or "
                            f"of another shape)")
    setattr(model, PENDING, sources)
    return model


def _whole(path: str, why: str) -> None:
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"rlcore: {path}: {why}: loaded whole on every rank, then sharded", flush=True)
    return None


def pending(model: torch.nn.Module) -> bool:
    return hasattr(model, PENDING)


def _sources(model: torch.nn.Module, files: list[str]) -> tuple[dict[str, Source], list[str]]:
    """{model name: Source}, as from_pretrained's convert_and_load_state_dict_in_model maps the checkpoint, and
    the names of the tensors still on meta it would not load (missing, or of another shape)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, dot_natural_key, rename_source_key

    conversions = get_model_conversion_mapping(model)
    renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
    converters = [c for c in conversions if isinstance(c, WeightConverter)]
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    expected = model.state_dict()  # every name, tied ones too (fill skips a tied copy the checkpoint holds)
    shapes, where = {}, {}
    for file in files:
        with _open(file) as f:
            for key in f.keys():
                shapes[key], where[key] = f.get_slice(key).get_shape(), file
    sources: dict[str, Source] = {}
    made = set()
    for key in sorted(shapes, key=dot_natural_key):  # the order decides which expert is which when stacked
        target, pattern = rename_source_key(key, renamings, converters, model.base_model_prefix, expected)
        if target not in expected and key in expected:
            target, pattern = rename_source_key(key, [], [], model.base_model_prefix, expected)
        if target not in expected:
            continue  # a tensor the model has no place for: from_pretrained drops it too
        if pattern is None:
            if list(shapes[key]) != list(expected[target].shape):
                continue  # from_pretrained reports a mismatch and initialises the tensor itself
            sources.setdefault(target, Source(None, [])).tensors.append((key, where[key], key))
            made.add(target)
        else:
            converter = by_pattern[pattern]
            sources.setdefault(target, Source(converter, [])).tensors.append((pattern, where[key], key))
            first = converter.target_patterns[0]
            made |= {target.replace(first, t) for t in converter.target_patterns}
    model._weight_conversions = [c for c in conversions if c.was_used()]  # what from_pretrained leaves for saving
    return sources, [n for n, t in _tensors(model) if t.is_meta and n not in made]


def fill(model: torch.nn.Module, device_type: str, offload: bool = False) -> None:
    """Give a model built by `on_meta` and sharded by fully_shard its values: each rank reads its own rows.
    The shards land where FSDP2 keeps them: on this rank's GPU (`offload`: in CPU memory, pinned), or CPU."""
    device = torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    shards = torch.device("cpu") if offload else device
    sources: dict[str, Source] = model.__dict__.pop(PENDING)
    kept = {n: _local(t).clone() for n, t in _tensors(model) if not t.is_meta}  # adapters, a new head
    # to_empty, with FSDP2's shards (DTensors) on their own device: storage for this rank's shards only
    model._apply(lambda t: torch.empty_like(t, device=shards if isinstance(t, DTensor) else device))
    tensors = dict(_tensors(model))
    with torch.no_grad():
        for name, value in kept.items():
            _local(tensors[name]).copy_(value)
        del kept
        readers = {}
        try:
            for target, source in sources.items():
                if target not in tensors:
                    continue  # a tied copy: the tensor it is tied to is filled under its own name
                for name, rows in _rows_of(model, target, source, tensors, readers).items():
                    local = _local(tensors[name])
                    if rows.shape != local.shape:
                        raise RuntimeError(f"rlcore: loading {name}: read {tuple(rows.shape)}, this rank keeps "
                                           f"{tuple(local.shape)}")
                    local.copy_(rows)
        finally:
            for reader in readers.values():
                reader.__exit__(None, None, None)
    for t in tensors.values():
        t._is_hf_initialized = True  # loaded (or kept): initialize_weights leaves it alone
    model.initialize_weights()  # the non-persistent buffers, which to_empty left uninitialised


def _rows_of(model, target: str, source: Source, tensors: dict, readers: dict) -> dict[str, torch.Tensor]:
    """{model name: this rank's rows of it, in its dtype, on CPU} for what one Source makes."""
    dtype = tensors[target].dtype

    def read(file, key, rows=None):
        if file not in readers:
            readers[file] = _open(file).__enter__()
        part = readers[file].get_slice(key)
        if rows is None:
            return part[...].to(dtype)
        a, b = rows
        if a == b:  # an empty shard (more ranks than rows); safetensors refuses an empty slice at the end
            return torch.empty((0, *part.get_shape()[1:]), dtype=dtype)
        return part[a:b].to(dtype)

    if source.converter is None:
        _, file, key = source.tensors[0]  # two keys for one name: from_pretrained keeps the first too
        return {target: read(file, key, _rows(tensors[target]))}
    converter = copy.deepcopy(source.converter)
    experts = _expert_rows(converter, tensors[target])
    if experts is not None and experts[0] == experts[1]:  # more ranks than experts: this one keeps none
        return {target: torch.empty((0, *tensors[target].shape[1:]), dtype=dtype)}
    seen = defaultdict(int)  # per source pattern: the index of the expert this key is (its position in order)
    for pattern, file, key in source.tensors:
        i, seen[pattern] = seen[pattern], seen[pattern] + 1
        skip = experts is not None and not experts[0] <= i < experts[1]
        converter.add_tensor(target, key, pattern, (lambda f=file, k=key, s=skip: None if s else read(f, k)))
    made = converter.convert(target, model=model, config=model.config)
    out = {}
    for name, value in made.items():
        if name in tensors:  # else a tied copy
            value = value[0] if isinstance(value, list) else value
            rows = _rows(tensors[name]) if experts is None else None  # fed this rank's experts: its rows already
            out[name] = value[rows[0]:rows[1]] if rows else value
    return out


def _expert_rows(converter, tensor: torch.Tensor) -> tuple[int, int] | None:
    """This rank's experts [a, b) when `converter` only stacks experts on dim 0 and then concatenates along
    other dims, so that the experts it is fed are exactly the rows it makes; else None (built whole)."""
    from transformers.core_model_loading import Concatenate, MergeModulelist

    ops = converter.operations
    stacks = isinstance(ops[0], MergeModulelist) and ops[0].dim == 0
    if not (stacks and len(converter.target_patterns) == 1 and isinstance(tensor, DTensor)
            and all(isinstance(op, Concatenate) and op.dim >= 1 for op in ops[1:])):
        return None
    return _rows(tensor)


def _rows(tensor: torch.Tensor) -> tuple[int, int] | None:
    """The rows [a, b) of dim 0 that this rank keeps (all for a plain tensor); None for a scalar (read whole)."""
    if not isinstance(tensor, DTensor):
        return (0, tensor.shape[0]) if tensor.dim() else None
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    if tuple(shape[1:]) != tuple(tensor.shape[1:]):
        raise RuntimeError(f"rlcore: loading expects FSDP2's Shard(0), got {tensor.placements}")
    return offset[0], offset[0] + shape[0]


def _tensors(model: torch.nn.Module):
    """(name, tensor) of every parameter (a tied one once) and every persistent buffer: what a checkpoint holds."""
    yield from model.named_parameters()
    for module_name, module in model.named_modules():
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and name not in module._non_persistent_buffers_set:
                yield (f"{module_name}.{name}" if module_name else name), buffer


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor  # under no_grad: the shard itself


def _open(file: str):
    from safetensors import safe_open

    try:
        return safe_open(file, framework="pt", device="cpu", backend="pread")
    except TypeError:  # safetensors < 0.8 has no pread: memory-mapped
        return safe_open(file, framework="pt", device="cpu")
