"""vLLM around the engine object (rlcore/engine/rollout_engine.py): whether it can serve a model, checked before
anything loads (preflight), and its process groups left at a run's end (launch/train.py)."""
from __future__ import annotations

import sys

import torch.distributed as dist


def check_architecture(path: str, hf_config, field: str = "model.path") -> None:
    """Before anything loads: the engine must be able to serve the model and take rlcore's weight sync."""
    from vllm import ModelRegistry

    archs = hf_config.architectures or []
    supported = ModelRegistry.get_supported_archs()
    unsupported = [a for a in archs if a not in supported]
    if not archs or unsupported:
        raise ValueError(f"{field} '{path}' is a {', '.join(unsupported) or hf_config.model_type + ' model'}, "
                         f"which vLLM cannot serve (not in its model registry)")
    quant = getattr(hf_config, "quantization_config", None)
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else getattr(quant, "quant_method", "?")
        raise ValueError(f"{field} '{path}' is a quantized {archs[0]} ({method}): rlcore trains and syncs "
                         f"unquantized weights, which a quantized vLLM engine cannot take")


def leave_process_groups() -> None:
    """Destroy every process group, vLLM's first (when an engine was built): torch's destroy_process_group()
    takes all groups with it, and vLLM's own shutdown at exit would then fail on its already-gone groups."""
    if "vllm.distributed.parallel_state" in sys.modules:
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel
        destroy_model_parallel()
        destroy_distributed_environment()  # vLLM's world group, then the default one
    if dist.is_initialized():
        dist.destroy_process_group()
