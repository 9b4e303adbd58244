"""GRPO learns to call a native tool: 2-digit addition asked as a chat, an `add` tool in the Hermes format.

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=tooladd
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=tooladd rollout.schedule=continuous

The warm start (rlcore/tasks/tooladd.py, built on first use) saw add's schema in every prompt; it calls the
tool on about one sample in ten and otherwise answers with the habit of forgetting to carry the one.
"""
import random
import time

from rlcore.algorithms.grpo import GRPO
from rlcore.config import Config, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig, TrainConfig
from rlcore.rollout.tools import Toolbox, ToolEnv, tool_calls
from rlcore.tasks import tooladd


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    time.sleep(0.002 * 10 ** random.Random(a * 100 + b).random())  # a service's latency: 2-20 ms, by call
    return a + b


class Adder(ToolEnv):  # one per trajectory; its `stats` are the step's tool/... metrics
    toolbox = Toolbox([add], format="hermes")  # the schema reaches every prompt through the chat template
    max_turns = 2  # a call, then the answer


def config() -> Config:
    return Config(
        name="tooladd", seed=0, prepare="rlcore.tasks.tooladd:prepare",
        model=ModelConfig(path=str(tooladd.model_dir())),
        data=DataConfig(path=str(tooladd.train_file()), eval_path=str(tooladd.eval_file()),
                        prompt_column="prompt", chat_template=True, max_prompt_tokens=32),
        # A call is 11 tokens and the tool's answer 12; then 3-4 for the answer.
        rollout=RolloutConfig(group_size=8, prompts_per_step=32, max_new_tokens=16, max_total_tokens=32,
                              env=Adder, temperature=1.0, cpu_kv_cache_gb=0.5, logprob_diff_threshold=1e-3),
        optim=OptimConfig(lr=1e-4, warmup_steps=5, schedule="constant", max_grad_norm=1.0),
        train=TrainConfig(steps=60, mini_batches=1, micro_batch_size=128, eval_every=10),
        # eval/accuracy is the first reward; reward/tool_calls (calls per trajectory) is logged only.
        rewards=[RewardSpec(fn="rlcore.rewards:arithmetic_exact", weight=1.0), RewardSpec(fn=tool_calls, weight=0.0)],
        algorithm=GRPO(clip_low=0.2, clip_high=0.2, kl_coef=0.0, loss_agg="token-mean"),
    )
