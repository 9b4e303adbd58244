"""A run goes on whatever the model writes: two steps of rlcore.rollout.collect (the real turn loop, both
schedules, the startup path's environment settings, the tiny tool-calling tokenizer, the reward scoring and
the step metrics over a one-rank gloo group) with a scripted engine whose model writes the turns that stopped
runs before: nesting past the recursion limit, a lone surrogate as a tool name, 50k-character arguments,
NaN, a 5000-digit integer, 5000 unclosed <tool_call> openers, 100 calls in one turn, and a tool output the
chat template refuses. Scripting the engine is the one stand-in: a real model will not write these on demand."""
import asyncio
import json
import re

import pytest
import torch.distributed as dist

from rlcore.engine.rollout_engine import Sample
from rlcore.rollout.tools import Toolbox, ToolEnv
from rlcore.tasks.tiny import HERMES_TEMPLATE, build_chat_tokenizer


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


async def wait(seconds: float) -> str:
    """Wait, then say so.

    Args:
        seconds: how long
    """
    await asyncio.sleep(seconds)
    return "waited"


def echo(text: str) -> str:
    """Repeat a text.

    Args:
        text: what to repeat
    """
    return text


class Tools(ToolEnv):
    toolbox = Toolbox([add, echo, wait], format="hermes")
    max_turns = 3


def call(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


TURNS = [
    "<tool_call>" + "[" * 3000,  # malformed: too deep
    call('{"name": "\\ud800", "arguments": {}}'),  # unknown tool, named by a lone surrogate
    call('{"name": "echo", "arguments": {"text": "\\udfff' + "x" * 50_000 + '"}}'),  # answered, cut to 2000
    call('{"name": "add", "arguments": {"a": NaN, "b": 1e400}}')  # malformed
    + call('{"name": "wait", "arguments": {"seconds": 100}}'),  # stopped at the turn's 0.5 s deadline
    call('{"name": "add", "arguments": {"a": ' + "7" * 5000 + "}}"),  # malformed: past the digit limit
    "<tool_call>" * 5000,  # malformed: one call read to the end
    call('{"name": "add", "arguments": {"a": 1, "b": 2}}') * 100,  # 8 run, 92 refused
    call('{"name": "echo", "arguments": {"text": "BOOM"}}'),  # the template refuses the answer: trajectory fails
]
# trajectory k says TURNS[k], then TURNS[k + 1], then answers (unless its trajectory ended before)
STRICT = ("{%- for m in messages %}{%- if m.role == 'tool' and 'BOOM' in m.content %}"
          "{{ raise_exception('tool output refused') }}{%- endif %}{%- endfor %}" + HERMES_TEMPLATE)


class Model:
    """Scripted turns, found from the prompt ("q<k>?") and the number of assistant turns so far; generate
    (lockstep) and submit/step/busy/abort (continuous) as rlcore.engine.rollout_engine.RolloutEngine has them."""

    def __init__(self, tokenizer):
        self.tok, self.live = tokenizer, {}

    def turn(self, prompt: list[int], cap: int) -> Sample:
        text = self.tok.decode(prompt)
        k, turn = int(re.search(r"q(\d+)\?", text).group(1)), text.count("<|im_start|>assistant") - 1
        say = [TURNS[k % 8], TURNS[(k + 1) % 8], "It is 3."][turn]
        ids = (self.tok.encode(say, add_special_tokens=False) + [self.tok.eos_token_id])[:cap]
        return Sample(ids, [-0.5] * len(ids), "stop" if ids[-1] == self.tok.eos_token_id else "length")

    def generate(self, prompts, n, max_tokens, temperature, seeds, stop_token_ids=None):
        return [[self.turn(p, cap)] * k for p, k, cap in zip(prompts, n, max_tokens)]

    def submit(self, rid, prompt, max_tokens, temperature, seed, stop_token_ids=None):
        self.live[rid] = self.turn(prompt, max_tokens)

    def step(self):
        out, self.live = list(self.live.items()), {}
        return out

    def busy(self):
        return bool(self.live)

    def abort(self, rids):
        for rid in rids:
            self.live.pop(rid, None)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """A one-rank gloo group: collect's agreements and sums run for real."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path_factory.mktemp('pg')}/init", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def make_run(tmp_path, schedule: str):
    from rlcore.algorithms.grpo import GRPO
    from rlcore.config import Config, DataConfig, ModelConfig, RewardSpec, RolloutConfig
    from rlcore.distributed.parallel import ParallelDims
    from rlcore.preflight.checks import load_inputs
    from rlcore.rollout.envs import model_budget
    from rlcore.run import Rollout, Run
    build_chat_tokenizer(STRICT).save_pretrained(tmp_path / "model")
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"prompt": f"q{k}?"}) + "\n" for k in range(8)))
    cfg = Config(model=ModelConfig(path=str(tmp_path / "model")), algorithm=GRPO(),
                 data=DataConfig(path=str(tmp_path / "train.jsonl"), chat_template=True, max_prompt_tokens=4096),
                 rewards=[RewardSpec(fn=lambda prompts, completions, **_: [float(c == "It is 3.") for c in completions])],
                 rollout=RolloutConfig(env=Tools, group_size=1, prompts_per_step=8, max_new_tokens=60_000,
                                       max_total_tokens=120_000, schedule=schedule, turn_deadline_s=0.5))
    tokenizer, reward_fns, table, envs, _ = load_inputs(cfg, 256)

    class Prompts:
        def next_batch(self):
            return [dict(table[k]) for k in range(8)]

    rollout = Rollout(0, 0, None, Prompts(), [], reward_fns, [], envs, model_budget(cfg, envs))
    return Run(cfg=cfg, dims=ParallelDims(1, 1), models=None, tokenizer=tokenizer, engine=Model(tokenizer),
               logger=None, run_dir=tmp_path, rollout=rollout, trainer=None)


@pytest.mark.parametrize("schedule", ["lockstep", "continuous"])
def test_hostile_turns_do_not_stop_the_run(one_rank, tmp_path, schedule):
    from rlcore.rollout.collect import collect
    run = make_run(tmp_path, schedule)
    for step in range(2):
        batch, stats = collect(run, step)
        assert batch.input_ids.shape[0] == 8
        # calls per trajectory k (TURNS[k], TURNS[k + 1]): 1+1, 1+1, 1+2, 2+1, 1+1, 1+100, 100+1, 1
        assert stats["tool/calls"] == 215 and stats["tool/too_many_calls"] == 2 * 92 and stats["tool/deadline"] == 2
        assert stats["tool/malformed"] == 7 and stats["tool/unknown_tool"] == 2 and stats["tool/bad_arguments"] == 0
        assert stats["rollout/failed_trajectories"] == 2  # k = 6 (its second turn) and 7 (its first)
        assert stats["env/turns_mean"] == (6 * 3 + 2 + 1) / 8 and stats["env/truncated_frac"] == 0
        assert stats["reward/mean"] == 6 / 8  # the failed ones score 0; the others answer "It is 3."
        # two observations per finished trajectory, each at most 10 messages of at most 2040 characters
        assert stats["tokens/env_mean"] < 6 / 8 * 2 * 10 * 2100
