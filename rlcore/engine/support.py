"""vLLM around the engine object (rlcore/engine/rollout_engine.py): whether it can serve a model, checked before
anything loads (preflight), and at a run's end, after the barrier every rank leaves by, its engines shut down and its
process groups left (launch/train.py)."""
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


_held: list = []  # the vLLM clients of the engines this process built (RolloutEngine), until shut_engines


def hold(client) -> None:
    """Keep an engine's vLLM client until shut_engines (at leave_process_groups). vLLM shuts an engine down when the
    collector frees its client, and that shutdown destroys every process group, torch's default one too: wherever
    it happens. A trainer rank's dormant engine (a split mesh) freed with an error's traceback took its rank's
    groups before the barrier every rank leaves by, so that rank left alone and its peers, waiting there, failed
    with "Connection closed by peer" (hidden by torchrun's SIGTERM in a launch of its own)."""
    _held.append(client)


def shut_engines() -> None:
    """Shut down the engines this process holds: vLLM's shutdown also destroys its process groups and torch's."""
    while _held:
        _held.pop().shutdown()


def leave_process_groups() -> None:
    """Shut the engines down, then destroy every process group left, vLLM's first: torch's destroy_process_group()
    takes all groups with it, and vLLM's own shutdown at exit would then fail on its already-gone groups."""
    shut_engines()
    if "vllm.distributed.parallel_state" in sys.modules:
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel
        destroy_model_parallel()
        destroy_distributed_environment()  # vLLM's world group, then the default one
    if dist.is_initialized():
        dist.destroy_process_group()
