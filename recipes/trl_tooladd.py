"""TRL's environment_factory convention, trained by rlcore: the tool task of recipes/tooladd.py written as a
TRL-style environment class and TRL-style reward functions (no import of TRL), run through rlcore's native
tool path (rlcore/rollout/standards.py).

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=trl_tooladd
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=trl_tooladd rollout.ranks=1   # split

The environment owns the problem: each row holds only its numbers (columns a, b) and the answer, and reset()
writes "47+38=" into the prompt's user message, which rlcore renders again with the chat template, so the
prompt is token for token the one the tooladd warm start saw (rlcore/tasks/tooladd.py: it calls the tool on 7%
of samples and otherwise forgets to carry the one; held-out greedy accuracy 23.4% at the start).
"""
import random
import time

from rlcore.algorithms.grpo import GRPO
from rlcore.config import Config, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig, TrainConfig
from rlcore.rollout.standards import trl_environment, trl_rewards
from rlcore.rollout.tools import tool_calls
from rlcore.tasks import tooladd


class Adder:
    """A TRL-style environment: one instance per trajectory; its public methods are the model's tools."""

    def reset(self, a: int, b: int, **row) -> str:
        self.calls = 0
        return f"{a}+{b}="  # added to the user message (the dataset's prompt is empty)

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first
            b: the second
        """
        self.calls += 1
        time.sleep(0.002 * 10 ** random.Random(a * 100 + b).random())  # a service's latency: 2-20 ms, by call
        return a + b


def correct(completions, answer, **kwargs) -> list[float]:
    """1 when the last assistant message is the answer (TRL's conversational completions)."""
    return [float(c[-1]["content"].strip() == a) for c, a in zip(completions, answer)]


def used_add(completions, environments, **kwargs) -> list[float]:
    """Whether the trajectory called add, read from its environment (logged, weight 0)."""
    return [float(env.calls > 0) for env in environments]


def config() -> Config:
    return Config(
        name="trl_tooladd", seed=0, prepare="rlcore.tasks.tooladd:prepare_columns",
        model=ModelConfig(path=str(tooladd.model_dir())),
        data=DataConfig(path=str(tooladd.columns_file("train.jsonl")),
                        eval_path=str(tooladd.columns_file("eval.jsonl")), prompt_column="prompt",
                        chat_template=True, max_prompt_tokens=32),
        # One tool round (a call, then the answer), as TRL's max_tool_calling_iterations=1.
        rollout=RolloutConfig(group_size=8, prompts_per_step=32, max_new_tokens=16, max_total_tokens=32,
                              env=trl_environment(Adder, format="hermes", max_tool_calling_iterations=1),
                              temperature=1.0, cpu_kv_cache_gb=0.5, logprob_diff_threshold=1e-3),
        optim=OptimConfig(lr=1e-4, warmup_steps=5, schedule="constant", max_grad_norm=1.0),
        train=TrainConfig(steps=60, mini_batches=1, micro_batch_size=128, eval_every=10),
        # eval/accuracy is the first reward; the others are logged only.
        rewards=[*trl_rewards([correct, used_add], env=Adder, weights=[1.0, 0.0]),
                 RewardSpec(fn=tool_calls, weight=0.0)],
        algorithm=GRPO(clip_low=0.2, clip_high=0.2, kl_coef=0.0, loss_agg="token-mean"),
    )
