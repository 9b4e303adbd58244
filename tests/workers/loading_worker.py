"""torchrun worker: a model loaded with meta=True (each rank reads only its shards, rlcore/models/load.py) has
the same FSDP2 shards as one loaded whole and then sharded, bit for bit. (tests/test_loading.py)

    torchrun --nproc-per-node 2 tests/workers/loading_worker.py WORK_DIR OUT_JSON

Rank 0 writes the checkpoints (every architecture of tests/archs.py), then for each case every rank loads both
ways and compares each parameter's local shard and each buffer, bit for bit, with dtype, device, placement,
requires_grad, tied weights, config, the conversions kept for saving and what the load drew from the global
RNG (from_pretrained initialises a critic's new head before it is zeroed). Cases: the causal LM of every
architecture (fp32; bf16 for some, cast on load), the critic (its new zero head) and the reward model where
transformers has the class, a saved critic, LoRA on the base, an index of several safetensors files (experts
split across files), rows that do not split evenly, and a torch .bin checkpoint (the fallback: loaded whole).
On CUDA also frozen models offloaded to pinned CPU memory (model.offload_frozen). One rank per GPU:

    torchrun --nproc-per-node 1 tests/workers/loading_worker.py WORK_DIR OUT_JSON    # one GPU
"""
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import archs  # noqa: E402
from rlcore.config import CriticConfig, LoraConfig, ModelConfig  # noqa: E402
from rlcore.distributed.parallel import ParallelDims, build_meshes, init_distributed  # noqa: E402
from rlcore.models import build as models  # noqa: E402
from rlcore.models import lora  # noqa: E402

work, out = Path(sys.argv[1]), Path(sys.argv[2])
init_distributed()
rank = dist.get_rank()
mesh, _ = build_meshes(ParallelDims(dist.get_world_size(), 1))


def save(model_class, config, folder: Path, **kwargs) -> str:
    torch.manual_seed(len(folder.name))
    model_class.from_config(config).save_pretrained(folder, **kwargs)
    return str(folder)


def checkpoints() -> dict:
    """{case name: (kind, path, dtype)}; rank 0 writes the folders."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoModelForTokenClassification
    from transformers.models.auto.modeling_auto import (MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES as SEQ,
                                                        MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES as TOKEN)

    cases = {}
    for arch in archs.ARCHS:
        config = archs.hf_config(arch)
        path = save(AutoModelForCausalLM, config, work / arch)
        cases[f"{arch}/causal_lm"] = ("causal_lm", path, "float32")
        if config.model_type in TOKEN:
            cases[f"{arch}/critic"] = ("critic", path, "float32")
        if config.model_type in SEQ:
            config.num_labels = 1
            cases[f"{arch}/reward"] = ("reward", save(AutoModelForSequenceClassification, config,
                                                       work / f"{arch}_reward"), "float32")
    for arch in ("qwen2_tied", "gemma2", "qwen3_moe"):
        cases[f"{arch}/causal_lm/bf16"] = ("causal_lm", str(work / arch), "bfloat16")
    cases["qwen2/causal_lm/lora"] = ("lora", str(work / "qwen2"), "float32")
    config = archs.hf_config("qwen2")
    config.num_labels = 1
    cases["qwen2/saved_critic"] = ("saved_critic", save(AutoModelForTokenClassification, config,
                                                        work / "qwen2_critic"), "float32")
    # 11 shards of ~40 kB: an index, and one layer's experts spread over several files
    cases["qwen3_moe/causal_lm/index"] = ("causal_lm", save(AutoModelForCausalLM, archs.hf_config("qwen3_moe"),
                                                            work / "qwen3_moe_index", max_shard_size="40KB"), "float32")
    config = archs.hf_config("qwen2")
    config.vocab_size, config.intermediate_size = 33, 250  # 17 + 16 rows and 125 + 125: uneven and even
    cases["qwen2/causal_lm/uneven"] = ("causal_lm", save(AutoModelForCausalLM, config, work / "qwen2_uneven"),
                                       "float32")
    folder = work / "qwen2_bin"  # torch pickles, not safetensors: the fallback
    model = AutoModelForCausalLM.from_config(archs.hf_config("qwen2"))
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    cases["qwen2/causal_lm/bin"] = ("causal_lm", str(folder), "float32")
    if torch.cuda.is_available():  # a frozen model's shards offloaded to pinned CPU memory (CUDA only)
        cases["qwen3_moe/reference/offload"] = ("reference", str(work / "qwen3_moe"), "float32")
        cases["qwen2/reward/offload"] = ("reward", str(work / "qwen2_reward"), "float32")
    return cases


def load(kind: str, path: str, dtype: str, meta: bool) -> torch.nn.Module:
    cfg = ModelConfig(path=path, dtype=dtype)
    if kind in ("causal_lm", "reference"):
        return models.load_causal_lm(cfg, trainable=kind == "causal_lm", meta=meta)
    if kind == "lora":
        return lora.apply(models.load_causal_lm(cfg, meta=meta), LoraConfig(enabled=True, rank=8, alpha=16.0), seed=3)
    if kind in ("critic", "saved_critic"):
        return models.load_critic(CriticConfig(path="policy" if kind == "critic" else path), cfg, meta=meta)
    return models.load_reward_model(path, cfg, meta=meta)


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def bits(t: torch.Tensor) -> torch.Tensor:
    return local(t).detach().reshape(-1).view(torch.uint8)


def differences(old: torch.nn.Module, new: torch.nn.Module) -> list[str]:
    found = []
    for what, a_all, b_all in (("parameter", dict(old.named_parameters()), dict(new.named_parameters())),
                               ("buffer", dict(old.named_buffers()), dict(new.named_buffers()))):
        if a_all.keys() != b_all.keys():
            found.append(f"{what} names: {sorted(a_all.keys() ^ b_all.keys())}")
        for name in a_all.keys() & b_all.keys():
            a, b = a_all[name], b_all[name]
            aspects = {"type": type, "dtype": lambda t: t.dtype, "shape": lambda t: t.shape,
                       "device": lambda t: t.device, "requires_grad": lambda t: t.requires_grad,
                       "pinned": lambda t: local(t).is_pinned(), "local device": lambda t: local(t).device,
                       "placements": lambda t: getattr(t, "placements", None)}
            unlike = [k for k, f in aspects.items() if f(a) != f(b)]
            if not unlike and not torch.equal(bits(a), bits(b)):
                unlike = ["values"]
            if unlike:
                found.append(f"{what} {name}: {', '.join(unlike)}")
    tied = [m.get_output_embeddings() is not None and
            m.get_output_embeddings().weight is m.get_input_embeddings().weight for m in (old, new)]
    if tied[0] != tied[1]:
        found.append(f"tied: {tied}")
    if repr(getattr(old, "_weight_conversions", None)) != repr(getattr(new, "_weight_conversions", None)):
        found.append("_weight_conversions")
    if old.config.to_dict() != new.config.to_dict() or old.training != new.training:
        found.append("config or training mode")
    return found


cases = checkpoints() if rank == 0 else None
holder = [cases]
dist.broadcast_object_list(holder, src=0)
result = {}
for case, (kind, path, dtype) in holder[0].items():
    cfg = ModelConfig(path=path, dtype=dtype, offload_frozen=case.endswith("offload"))
    frozen = kind in ("reference", "reward")
    torch.manual_seed(0)
    old = models.shard(load(kind, path, dtype, meta=False), mesh, cfg, frozen=frozen)
    drawn_after_old = torch.rand(4)
    torch.manual_seed(0)
    new = load(kind, path, dtype, meta=True)
    on_meta = all(p.is_meta for n, p in new.named_parameters() if "lora_" not in n and not n.startswith("score."))
    new = models.shard(new, mesh, cfg, frozen=frozen)
    rng = [] if torch.equal(torch.rand(4), drawn_after_old) else ["draws from the global RNG"]
    first = local(next(new.parameters()))
    result[case] = {"differences": differences(old, new) + rng, "on_meta": on_meta, "device": str(first.device),
                    "pinned": first.is_pinned(), "params": len(list(new.parameters())),
                    "sharded": sum(isinstance(p, DTensor) and p.to_local().numel() < p.numel()
                                   for p in new.parameters())}
every = [None] * dist.get_world_size()
dist.all_gather_object(every, result)  # the last rank may hold empty shards: its differences count too
if rank == 0:
    for case in result:
        result[case]["differences"] = sorted({d for r in every for d in r[case]["differences"]})
    out.write_text(json.dumps(result, indent=1))
dist.barrier()  # neither rank leaves while the other still talks to it (gloo aborts on a vanished peer)
dist.destroy_process_group()
