"""What a run is told: the typed config a recipe returns (sections.py) and its checks (checks.py), the recipe loader and
`key=value` overrides (cli.py), `--help` (help.py), which models a run builds (roles.py), one-line errors (errors.py).

A recipe imports the sections from here: `from rlcore.config import Config, ModelConfig, ...`."""
from rlcore.config.checks import check_stream, check_values, validate
from rlcore.config.sections import (Config, CriticConfig, DataConfig, LoggingConfig, LoraConfig, ModelConfig,
                                    OptimConfig, PlanConfig, RewardSpec, RolloutConfig, SandboxConfig, TrainConfig)

__all__ = ["Config", "CriticConfig", "DataConfig", "LoggingConfig", "LoraConfig", "ModelConfig", "OptimConfig",
           "PlanConfig", "RewardSpec", "RolloutConfig", "SandboxConfig", "TrainConfig", "check_stream",
           "check_values", "validate"]
