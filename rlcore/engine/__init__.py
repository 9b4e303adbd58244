"""The vLLM engine each rollout group runs and the weight sync into it (rollout_engine.py).
This folder alone imports vLLM."""
from rlcore.engine.rollout_engine import RolloutEngine, Sample, SyncStats

__all__ = ["RolloutEngine", "Sample", "SyncStats"]
