"""GRPO with a calculator tool on GSM8K: one node of 8 GPUs, four TP=2 vLLM engines, bf16, up to 4 turns.

    torchrun --nproc-per-node 8 launch/train.py recipe=grpo_tools
    torchrun --nproc-per-node 8 launch/train.py recipe=grpo_tools rollout.max_turns=2 name=tools-2turns

The tool is a typed Python function (rlcore.rollout.tools); the model's chat template (Qwen2.5-1.5B-Instruct's)
shows its JSON schema in every prompt. The model calls it natively, in the Hermes format,
<tool_call>{"name": "calculator", "arguments": {"expression": "12*4-6"}}</tool_call>, and ends its turn; the
answer comes back as a tool message, encoded by the model's own chat template (rlcore.rollout.chat), and the
model continues. A bad call (malformed JSON, an unknown tool, a wrong argument, an expression the calculator
refuses) is answered with an error message the model can read. A turn without a tool call is the final
answer; the reward is the built-in gsm8k check of that last turn, and `tool_calls` / `bad_tool_calls` (weight
0) log the calls per trajectory. Needs the hub or local copies, as recipes/grpo.py says.
"""
import ast
import operator

from rlcore.algorithms.grpo import GRPO
from rlcore.config import (Config, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig,
                           TrainConfig)
from rlcore.rollout.tools import Toolbox, ToolEnv, bad_tool_calls, tool_calls

SYSTEM = ("Solve the math problem step by step. Use the calculator tool for arithmetic. End your final answer "
          "with a line '#### <number>'.")
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.Pow: operator.pow, ast.Mod: operator.mod, ast.FloorDiv: operator.floordiv, ast.USub: operator.neg,
       ast.UAdd: operator.pos}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses.

    Args:
        expression: the arithmetic to evaluate, e.g. "12*4-6"
    """
    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"unsupported expression: {ast.dump(node)[:40]}")
    value = ev(ast.parse(expression.replace(",", ""), mode="eval").body)
    return f"{value:g}" if isinstance(value, float) else str(value)


class Calculator(ToolEnv):
    """One per trajectory; its `stats` count the calls (rlcore.rollout.tools.ToolStats)."""
    toolbox = Toolbox([calculator], format="hermes")
    max_turns = 4


def config() -> Config:
    return Config(
        name="grpo-tools-gsm8k",
        seed=0,
        model=ModelConfig(path="Qwen/Qwen2.5-1.5B-Instruct", dtype="float32", mixed_precision="bfloat16",
                          activation_checkpointing=True),
        data=DataConfig(path="openai/gsm8k", name="main", split="train", prompt_column="question",
                        chat_template=True, system_prompt=SYSTEM, eval_path="openai/gsm8k", eval_split="test",
                        eval_size=512, max_prompt_tokens=768),  # + the tools block of the system turn
        rollout=RolloutConfig(tensor_parallel=2, group_size=8, prompts_per_step=128, max_new_tokens=512,
                              max_total_tokens=1536, env=Calculator, env_timeout_s=10.0, temperature=1.0,
                              gpu_memory_utilization=0.4),
        optim=OptimConfig(lr=1e-6, weight_decay=0.0, warmup_steps=10, schedule="constant", max_grad_norm=1.0),
        train=TrainConfig(steps=500, epochs_per_step=1, mini_batches=4, micro_batch_size=8, eval_every=25,
                          # Packed: padding stripped, at most the tokens of 8 padded rows per micro-batch.
                          max_tokens_per_micro_batch=8 * 2304, save_every=25),
        rewards=[RewardSpec(fn="rlcore.rewards:gsm8k", weight=1.0), RewardSpec(fn=tool_calls, weight=0.0),
                 RewardSpec(fn=bad_tool_calls, weight=0.0)],
        algorithm=GRPO(clip_low=0.2, clip_high=0.28, kl_coef=0.001, loss_agg="token-mean"),
    )
