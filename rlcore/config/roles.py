"""Which of the four models a run builds (a reference copy, the adapters switched off, or none; a critic; LoRA in
the engine or merged), decided once from its config (rlcore/config/sections.py) and asked by setup, the plan, preflight,
LoRA, the engine and the layout lines. It imports nothing of rlcore, so the config's own checks can ask it too."""
from __future__ import annotations

from typing import NamedTuple


class Models(NamedTuple):
    """Which of the four models a run builds, and what its engines serve: decided once from the config, and
    asked by setup, the plan, preflight, LoRA, the engine and the layout lines."""
    reference: str  # "copy": a frozen copy of the policy; "adapters_off": the policy with its LoRA adapters off; "none"
    critic: bool  # the algorithm trains a value model (PPO)
    engine_lora: bool  # the engines serve the LoRA adapters (lora.sync=adapter), not merged full weights
    lora: bool  # the policy is trained as LoRA adapters over a frozen base


def models_of(cfg) -> Models:
    """The one place that decides the run's models from the config (an engine-only tool's config may have no
    algorithm: then no reference and no critic)."""
    algorithm, lora = cfg.algorithm, cfg.lora.enabled
    needs_reference = algorithm is not None and algorithm.needs_reference
    return Models(reference="adapters_off" if needs_reference and lora else "copy" if needs_reference else "none",
                  critic=algorithm is not None and algorithm.needs_critic,
                  engine_lora=lora and cfg.lora.sync == "adapter", lora=lora)
