"""The tool of benchmarks/vs_trl_agents.py: rlcore.tasks.tooladd's `add`, with a seeded latency both frameworks share.

rlcore runs it through `recipe=benchmarks/slow_add.py` (GRPO on the task with SlowAdder), TRL as `GRPOTrainer(tools=[add])`: the
very same function. Its latency is log-uniform in [low, high] seconds from $RLCORE_BENCH_TOOL_LATENCY ("low,high";
default 0.02,0.2), drawn from the call's arguments, so the same call waits the same in either framework. The
schema (signature and docstring) is tooladd's, which its warm start saw in every prompt.
"""
from __future__ import annotations

import os
import random
import time

from rlcore.rollout.tools import Toolbox, ToolEnv


def latency(a: int, b: int) -> float:
    low, high = (float(v) for v in os.environ.get("RLCORE_BENCH_TOOL_LATENCY", "0.02,0.2").split(","))
    return low * (high / low) ** random.Random(a * 1000 + b).random() if high > 0 else 0.0


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    time.sleep(latency(a, b))
    return a + b


class SlowAdder(ToolEnv):
    """rlcore.tasks.tooladd.AddEnv with the slow `add`: a call, then the answer."""
    toolbox = Toolbox([add], format="hermes")
    max_turns = 2




def config():
    """recipes/tooladd.py with SlowAdder and no held-out eval: `recipe=benchmarks/slow_add.py` (rollout.env holds
    a class, which only a recipe can set)."""
    from pathlib import Path

    from rlcore.config.cli import load_recipe
    cfg = load_recipe("tooladd", Path(__file__).resolve().parents[1] / "recipes")
    cfg.name, cfg.rollout.env, cfg.data.eval_path = "tooladd-slow", SlowAdder, ""
    return cfg
