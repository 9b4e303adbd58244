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
    """GRPO on rlcore.tasks.tooladd with SlowAdder (as the task's recipe): `recipe=benchmarks/slow_add.py`."""
    from rlcore.algorithms.grpo import GRPO
    from rlcore.config import Config, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig, TrainConfig
    from rlcore.rollout.tools import tool_calls
    from rlcore.tasks import tooladd
    return Config(
        name="tooladd-slow", seed=0, prepare="rlcore.tasks.tooladd:prepare",
        model=ModelConfig(path=str(tooladd.model_dir())),
        data=DataConfig(path=str(tooladd.train_file()), eval_path="", prompt_column="prompt", chat_template=True,
                        max_prompt_tokens=32),
        rollout=RolloutConfig(group_size=8, prompts_per_step=8, max_new_tokens=tooladd.MAX_TOTAL_TOKENS,
                              max_total_tokens=tooladd.MAX_TOTAL_TOKENS, env=SlowAdder, env_workers=64,
                              temperature=1.0, cpu_kv_cache_gb=0.5, logprob_diff_threshold=1e-3),
        optim=OptimConfig(lr=1e-4, warmup_steps=5, schedule="constant", max_grad_norm=1.0),
        train=TrainConfig(steps=6, mini_batches=1, micro_batch_size=32),
        rewards=[RewardSpec(fn="rlcore.rewards:arithmetic_exact", weight=1.0), RewardSpec(fn=tool_calls, weight=0.0)],
        algorithm=GRPO(clip_low=0.2, clip_high=0.2, kl_coef=0.0, loss_agg="token-mean"),
    )
