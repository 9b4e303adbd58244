"""The rollout stage: a step's prompt rows in, one rank's training `Batch` out.

    engine.py   the colocated vLLM engine and the weight sync (the only module that imports vLLM)
    collect.py  sampling through the engine, dynamic sampling's extra draws, rewards, greedy eval
    agents.py   rollout.agent: a user's openai-client agent per trajectory, through endpoint.py (an
                OpenAI-compatible server over the engine) and sessions.py (each call's token ids recorded)
    standards.py  environments of a standard (TRL's environment_factory) on the native tool path (tools.py)
"""
from rlcore.rollout.engine import RolloutEngine, Sample, SyncStats

__all__ = ["RolloutEngine", "Sample", "SyncStats"]
