"""A recipe: recipes/tooladd.py with a tool of random latency, 0-30 ms drawn from the OS per call, so two runs never
see the same timings (the recipe's own `add` sleeps a fixed time per argument pair). Its schema is the recipe's,
which the warm start was trained with.

    torchrun --nproc-per-node 2 launch/train.py recipe=tests/workers/stream_tools.py rollout.ranks=1 ...
"""
import random
import time
from pathlib import Path

from rlcore.config import Config
from rlcore.config.cli import load_recipe
from rlcore.rollout.tools import Toolbox, ToolEnv

_latency = random.SystemRandom()


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    time.sleep(_latency.uniform(0.0, 0.03))
    return a + b


class JitteryAdder(ToolEnv):
    toolbox = Toolbox([add], format="hermes")
    max_turns = 2


def config() -> Config:
    cfg = load_recipe("tooladd", Path(__file__).resolve().parents[2] / "recipes")
    cfg.rollout.env = JitteryAdder
    return cfg
