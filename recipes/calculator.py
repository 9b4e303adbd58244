"""GRPO learns to use a calculator tool for 2-digit addition (rlcore.tasks.calculator), on 2 CPU ranks.

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=calculator

The demo's task and held-out problems, with a tool: the model may write "?" (a stop token), the tool
answers "85=" and the model copies the sum. The warm start (built locally on first use) has rlcore.tasks.tiny's
habit of forgetting to carry the one, calls the tool on about one sample in ten and copies its answer well.
The reward is arithmetic_exact on the last model turn; the number of calls is logged (reward/tool_calls, weight
0) and becomes a cost per call with rewards.1.weight=-0.1.

Measured on 2 CPU cores shared with other jobs (seed 0; seed=1 the same): eval/accuracy 21.1% -> 100% in
60 steps, 59-68 s for the whole command (100% from step 30). The first run builds the warm start: +80 s.
Tool calls on the held-out problems (rlcore.tasks.calculator.evaluate on the exported model), before -> after:
greedy 0% -> 100% on problems with a carry and 0% -> 100% without; sampled 10% -> 99% and 6% -> 99%. Without a
cost the tool takes over everywhere: its route is right 98% of the time from the start, while the model's own
answer is right only where there is no carry (90%).

With a cost per call (rewards.1.weight=-0.1, or -0.05) the tool is a passing crutch: calls rise from about 9% to
24% of the trajectories by step 20, then fall to ~3% as the model learns to carry by itself; 21% -> 91% after
200 steps, greedy calls 7% with a carry and 5% without, and the model now carries too often (72% right on
no-carry problems, from 90%). A warm start that calls 3x as often (TOOL_SHARE=0.3) does the same.
"""
from rlcore.algorithms.grpo import GRPO
from rlcore.config import (Config, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig,
                           TrainConfig)
from rlcore.tasks import calculator


def config() -> Config:
    return Config(
        name="calculator",
        seed=0,
        prepare="rlcore.tasks.calculator:prepare",
        model=ModelConfig(path=str(calculator.model_dir())),
        data=DataConfig(path=str(calculator.train_file()), eval_path=str(calculator.eval_file()),
                        prompt_column="prompt", max_prompt_tokens=16),
        # A turn is an answer (3 digits and EOS) or a call ("?"); a turn cut at 5 tokens without either is
        # an incomplete action and ends the trajectory. 16 tokens hold "?", "123=" and "123<eos>".
        rollout=RolloutConfig(tensor_parallel=1, group_size=8, prompts_per_step=32, max_new_tokens=5,
                              max_total_tokens=16, temperature=1.0, cpu_kv_cache_gb=0.5,
                              logprob_diff_threshold=1e-3, env="rlcore.tasks.calculator:CalculatorEnv"),
        optim=OptimConfig(lr=1e-4, warmup_steps=5, schedule="constant", max_grad_norm=1.0),
        train=TrainConfig(steps=60, mini_batches=1, micro_batch_size=128, eval_every=10),
        # The first reward function scores held-out correctness (eval/accuracy). The second is logged only
        # (reward/tool_calls = calls per trajectory); a negative weight makes it a cost (see above).
        rewards=[RewardSpec(fn="rlcore.rewards:arithmetic_exact", weight=1.0),
                 RewardSpec(fn="rlcore.tasks.calculator:tool_calls", weight=0.0)],
        algorithm=GRPO(clip_low=0.2, clip_high=0.2, kl_coef=0.0, loss_agg="token-mean"),
    )
