"""GRPO with a sandboxed Python tool on GSM8K: one node of 8 GPUs, four TP=2 vLLM engines, bf16, up to 4 turns.

    torchrun --nproc-per-node 8 launch/train.py recipe=grpo_python_tool
    torchrun --nproc-per-node 8 launch/train.py recipe=grpo_python_tool sandbox.timeout_s=10 sandbox.memory_mb=2048

The model (Qwen2.5-1.5B-Instruct) sees one tool in every prompt, through its chat template: `python(code)`
(rlcore.rollout.tools.python). It calls it natively, in the Hermes format,
<tool_call>{"name": "python", "arguments": {"code": "print(48 * 3 - 6)"}}</tool_call>, and ends its turn. The
program runs in the rank's sandbox (rlcore.sandbox: warm workers, a fresh child process per call, an empty
environment, no network where the system allows it, the limits of the `sandbox` section below), and the model
reads what it printed, its traceback, or why it stopped ("[timeout: stopped after 5 s]"), as a tool message
encoded by its own chat template; then it continues. A bad call (malformed JSON, an unknown tool, no `code`) is
answered with an error message it can read. A turn without a call is the final answer, scored by the built-in
gsm8k check; `tool_calls` / `bad_tool_calls` (weight 0) log the calls per trajectory.

Sizing: each rank owns 128 trajectories a step and steps their environments in 8 threads (rollout.env_workers);
the sandbox has as many workers, so no program waits for one. A program gets 5 s of wall clock and of CPU and
1 GiB of address space; 1 KiB of output per stream is kept, so one flood cannot fill the context. Needs the hub
or local copies, as recipes/grpo.py says.
"""
from rlcore.algorithms.grpo import GRPO
from rlcore.config import (Config, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig,
                           SandboxConfig, TrainConfig)
from rlcore.rollout.tools import Toolbox, ToolEnv, bad_tool_calls, python, tool_calls

SYSTEM = ("Solve the math problem step by step. You can run Python programs with the python tool; it returns what "
          "the program prints. End your final answer with a line '#### <number>'.")


class PythonTool(ToolEnv):
    """One per trajectory; its `stats` count the calls (rlcore.rollout.tools.ToolStats)."""
    toolbox = Toolbox([python], format="hermes")
    max_turns = 4


def config() -> Config:
    return Config(
        name="grpo-python-gsm8k",
        seed=0,
        model=ModelConfig(path="Qwen/Qwen2.5-1.5B-Instruct", dtype="float32", mixed_precision="bfloat16",
                          activation_checkpointing=True),
        data=DataConfig(path="openai/gsm8k", name="main", split="train", prompt_column="question",
                        chat_template=True, system_prompt=SYSTEM, eval_path="openai/gsm8k", eval_split="test",
                        eval_size=512, max_prompt_tokens=768),  # + the tools block of the system turn
        # A turn's calls get env_timeout_s in all: several 5-s programs, and the sandbox's grace past each.
        rollout=RolloutConfig(tensor_parallel=2, group_size=8, prompts_per_step=128, max_new_tokens=512,
                              max_total_tokens=2048, env=PythonTool, env_timeout_s=60.0, env_workers=8,
                              temperature=1.0, gpu_memory_utilization=0.4),
        sandbox=SandboxConfig(timeout_s=5.0, cpu_s=5.0, memory_mb=1024, max_output_bytes=1024, workers=8),
        optim=OptimConfig(lr=1e-6, weight_decay=0.0, warmup_steps=10, schedule="constant", max_grad_norm=1.0),
        train=TrainConfig(steps=500, epochs_per_step=1, mini_batches=4, micro_batch_size=8, eval_every=25,
                          # Packed: padding stripped, at most the tokens of 8 padded rows per micro-batch.
                          max_tokens_per_micro_batch=8 * 2816, save_every=25),
        rewards=[RewardSpec(fn="rlcore.rewards:gsm8k", weight=1.0), RewardSpec(fn=tool_calls, weight=0.0),
                 RewardSpec(fn=bad_tool_calls, weight=0.0)],
        algorithm=GRPO(clip_low=0.2, clip_high=0.28, kl_coef=0.001, loss_agg="token-mean"),
    )
