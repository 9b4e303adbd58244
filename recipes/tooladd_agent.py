"""Bring your own agent: the tool task of recipes/tooladd.py, driven by an agent written against the `openai`
client (it reads tool_calls, runs the tool, sends the tool message and reads the answer). rlcore serves it an
OpenAI-compatible endpoint over the in-process engine and trains on the tokens it recorded.

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=tooladd_agent
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=tooladd_agent rollout.ranks=1   # split

The warm start (rlcore/tasks/tooladd.py) calls the tool on 7% of samples and otherwise answers with the habit of
forgetting to carry the one: held-out greedy accuracy 23.4% at the start.
"""
import asyncio
import json
import random

from rlcore.algorithms.grpo import GRPO
from rlcore.config import Config, DataConfig, ModelConfig, OptimConfig, RolloutConfig, TrainConfig
from rlcore.tasks import tooladd

# The schema the warm start saw in every prompt (rlcore.tasks.tooladd.add), as an OpenAI `tools` list.
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "description": "the first"},
                                                    "b": {"type": "integer", "description": "the second"}},
                   "required": ["a", "b"]},
    "return": {"type": "integer"}}}]


async def add(a: int, b: int) -> int:
    await asyncio.sleep(0.002 * 10 ** random.Random(a * 100 + b).random())  # a service's latency: 2-20 ms, by call
    return a + b


async def agent(client, row) -> float:
    """One problem: ask, run the tool the model calls (if it calls one), ask again, check the answer."""
    messages = [{"role": "user", "content": row["prompt"]}]
    reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    message = reply.choices[0].message
    if message.tool_calls:
        call = message.tool_calls[0]
        try:
            result = str(await add(**json.loads(call.function.arguments)))
        except (TypeError, ValueError):  # a malformed call: no answer (the trajectory ends on it)
            return 0.0
        messages += [message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": result}]
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
    return float((message.content or "").strip() == row["answer"])


def config() -> Config:
    return Config(
        name="tooladd_agent", seed=0, prepare="rlcore.tasks.tooladd:prepare",
        model=ModelConfig(path=str(tooladd.model_dir())),
        data=DataConfig(path=str(tooladd.train_file()), eval_path=str(tooladd.eval_file()),
                        prompt_column="prompt", chat_template=True, max_prompt_tokens=32),
        # Two calls per trajectory at most (a tool call, then the answer); the conversation fits 32 + 32 tokens.
        # env_workers: every trajectory of a rank has its agent running at once (they wait on the engine).
        rollout=RolloutConfig(group_size=8, prompts_per_step=32, max_new_tokens=16, max_total_tokens=32,
                              agent=agent, max_turns=2, temperature=1.0, cpu_kv_cache_gb=0.5,
                              logprob_diff_threshold=1e-3, env_workers=256),
        optim=OptimConfig(lr=1e-4, warmup_steps=5, schedule="constant", max_grad_norm=1.0),
        train=TrainConfig(steps=60, mini_batches=1, micro_batch_size=128, eval_every=10),
        algorithm=GRPO(clip_low=0.2, clip_high=0.2, kl_coef=0.0, loss_agg="token-mean"),
    )
