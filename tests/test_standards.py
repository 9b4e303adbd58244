"""TRL's environment_factory convention (rlcore/rollout/standards.py): a TRL-style class's tools, reset text,
tool dispatch and reward functions mapped onto rlcore's tool path, checked on hand-written tiny classes; and the
tool task written in that convention (recipes/trl_tooladd.py) learning through the real entry point."""
import asyncio
import json

import pytest

from conftest import train_warm
from rlcore.config import DataConfig
from rlcore.rollout.env import PromptText
from rlcore.rollout.standards import trl_environment, trl_reward, trl_rewards
from rlcore.rollout.turns import Trajectory, apply_reset, reset_ids
from rlcore.run import Envs


class Counter:
    """A TRL-style environment: reset(**row), public methods as tools, private helpers and a property not."""

    def __init__(self):
        self.seen, self.calls = None, 0

    def reset(self, **row) -> str:
        self.seen = row
        return f" (start at {row['start']})"

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first
            b: the second
        """
        self.calls += 1
        return a + b + self._offset()

    async def bump(self, by: int) -> str:
        """Raise the counter.

        Args:
            by: how much
        """
        self.calls += by
        return f"now {self.calls}"

    def get_reward(self) -> float:
        return 0.5 * self.calls

    def _offset(self) -> int:
        return 0

    @property
    def broken(self):
        raise AssertionError("a property must not be evaluated")


ROW = {"prompt": "Count", "start": 3, "answer": "7", "prompt_ids": [1, 2, 3]}
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 5}}\n</tool_call>'


def test_schemas_are_the_public_methods_in_trl_order():
    from transformers.utils import get_json_schema
    env = trl_environment(Counter, max_tool_calling_iterations=2)
    assert env.toolbox.names == ["add", "bump"]  # reset, get_reward, _offset and the property are not tools
    assert env.toolbox.schemas == [get_json_schema(Counter().add), get_json_schema(Counter().bump)]
    assert env.toolbox.schemas[0]["function"]["parameters"]["required"] == ["a", "b"]
    assert env.max_turns == 3 and not hasattr(trl_environment(Counter)(ROW), "max_turns")

    class Prompter:  # no tools: its reset writes the prompt, get_reward scores (a TRL environment may do that)
        def reset(self, **row):
            return "?"

        def get_reward(self) -> float:
            return 1.0

    assert trl_environment(Prompter).toolbox.schemas == [] and trl_environment(Prompter)(ROW).step("4", [0]).done


def test_reset_tool_dispatch_and_completion():
    """reset gets every column but rlcore's prompt_ids; calls run on that trajectory's own instance; a turn
    without a call ends it; a bad call is answered and counted; the completion is what the model saw."""
    env_cls = trl_environment(Counter, max_tool_calling_iterations=2)
    one, two = env_cls(ROW), env_cls(ROW)
    assert one.reset() == PromptText(" (start at 3)") and one.environment.seen == {k: v for k, v in ROW.items()
                                                                                   if k != "prompt_ids"}
    step = one.step(f"Let me add.{CALL}", [0])
    assert step.observation == [{"role": "tool", "name": "add", "content": "7"}] and not step.done
    assert one.environment.calls == 1 and two.environment.calls == 0
    step = one.step('<tool_call>\n{"name": "bump", "arguments": {"by": 4}}\n</tool_call>', [0])
    assert step.observation[0]["content"] == "now 5"  # an async method, run to completion
    step = one.step('<tool_call>\n{"name": "sub", "arguments": {}}\n</tool_call>', [0])
    assert step.observation[0]["content"] == "error: unknown tool 'sub'; tools: add, bump"
    assert (one.stats.calls, one.stats.unknown_tool) == (3, 1)
    assert one.step("7", [0]).done
    messages = one.completion(["", "", "", "7"])
    assert [m["role"] for m in messages] == ["assistant", "tool"] * 3 + ["assistant"]
    assert messages[0]["tool_calls"] == [{"type": "function", "function": {"name": "add",
                                                                            "arguments": {"a": 2, "b": 5}}}]
    # a last turn the loop cut (never stepped) is taken from the turns; tool answers the model never read are not
    two.step(CALL, [0])
    assert [m["role"] for m in two.completion([CALL])] == ["assistant"]
    assert [m["role"] for m in two.completion([CALL, "12"])] == ["assistant", "tool", "assistant"]


def test_reset_text_goes_into_the_user_message():
    """PromptText re-renders the prompt: the row's prompt + reset's text is the user message, tools shown; the
    tool task's empty prompt + "47+38=" is token for token the prompt its warm start saw."""
    from rlcore.rollout.envs import prompt_renderer
    from rlcore.rollout.observation import Unencodable
    from rlcore.tasks import tooladd

    class Adder:
        def reset(self, a: int, b: int, **row) -> str:
            return f"{a}+{b}="

        def add(self, a: int, b: int) -> int:
            """Add two integers.

            Args:
                a: the first
                b: the second
            """
            return a + b

    tok = tooladd.build_tokenizer()
    env_cls = trl_environment(Adder, max_tool_calling_iterations=1)
    assert env_cls.toolbox.schemas == tooladd.AddEnv.toolbox.schemas
    data = DataConfig(prompt_column="prompt", chat_template=True, max_prompt_tokens=32)
    envs = Envs(env_cls, "Adder", 2, [], 60.0, 1, lambda obs: [], tok.decode,
                prompt=prompt_renderer(data, tok, env_cls.toolbox))
    row = {"prompt": "", "a": 47, "b": 38, "answer": "85", "prompt_ids": [0]}
    x = Trajectory([0], row, seed=0, owner=0)
    x.env = env_cls(row)
    res = reset_ids(x.env.reset(), x, envs)
    assert res == {"prompt": tooladd.prompt_ids(tok, "47+38=")} and len(res["prompt"]) == 28
    apply_reset(x, {"value": res}, max_total=32)
    assert x.prompt_ids == res["prompt"] and x.tokens == [] and not x.done
    envs.prompt = prompt_renderer(DataConfig(prompt_column="prompt", chat_template=True, max_prompt_tokens=27), tok,
                                  env_cls.toolbox)
    with pytest.raises(Unencodable, match="it is 28 tokens, more than data.max_prompt_tokens=27"):
        reset_ids(PromptText("47+38="), x, envs)


def test_reward_functions_get_trl_arguments():
    """Keywords as TRL passes them: prompts and completions as messages, environments, the dataset's columns;
    None scores 0; an async reward is awaited; get_reward becomes a reward of weight 1."""
    env_cls = trl_environment(Counter, max_tool_calling_iterations=2)
    envs = [env_cls(ROW), env_cls(ROW)]
    for e in envs:
        e.reset()
    envs[0].step(CALL, [0])
    got = {}

    def exact(prompts, completions, environments, answer, **kwargs):
        got.update(prompts=prompts, completions=completions, environments=environments, answer=answer, **kwargs)
        return [float(c[-1]["content"] == a) for c, a in zip(completions, answer)]

    async def maybe(completions, **kwargs):
        await asyncio.sleep(0)
        return [None, 2.0]

    cols = {"start": [3, 3], "answer": ["7", "9"], "envs": envs, "turns": [[CALL, "7"], ["9"]],
            "transcripts": ["..", ".."]}
    assert trl_reward(exact)(["Count", "Count"], ["7", "9"], **cols) == [1.0, 1.0]
    assert got["prompts"] == [[{"role": "user", "content": "Count (start at 3)"}]] * 2
    assert [[m["role"] for m in c] for c in got["completions"]] == [["assistant", "tool", "assistant"], ["assistant"]]
    assert got["environments"] == [e.environment for e in envs] and got["start"] == [3, 3]
    assert set(got) == {"prompts", "completions", "environments", "answer", "start"}  # no rlcore columns
    assert trl_reward(maybe)(["Count", "Count"], ["7", "9"], **cols) == [0.0, 2.0]
    specs = trl_rewards([exact, maybe], env=Counter, weights=[1.0, 0.5])
    assert [(s.fn.__name__, s.weight) for s in specs] == [("exact", 1.0), ("maybe", 0.5), ("Counter", 1.0)]
    assert specs[2].fn(["Count"] * 2, ["7", "9"], envs=envs) == [0.5, 0.0]


class NoReset:
    def add(self, a: int) -> int:
        """Return a.

        Args:
            a: a number
        """
        return a


class Undocumented:
    def reset(self, **row):
        return None

    def add(self, a: int) -> int:
        return a


class Unhinted:
    def reset(self, **row):
        return None

    def add(self, a):
        """Return a.

        Args:
            a: a number
        """
        return a


def no_kwargs(completions, answer):
    return [1.0]


def needs_ids(completions, completion_ids, **kwargs):
    return [1.0]


@pytest.mark.parametrize("make, says", [
    (lambda: trl_environment(NoReset), "TRL environment 'NoReset' has no reset() method; the convention needs "
                                       "reset(**row) returning text for the prompt or None"),
    (lambda: trl_environment(Undocumented), "TRL environment 'Undocumented': tool 'add' has no docstring; tools "
                                            "need a type hint on every argument"),
    (lambda: trl_environment(Unhinted), "TRL environment 'Unhinted': tool 'add': argument 'a' has no type hint"),
    (lambda: trl_environment(Counter, format="qwen"), "TRL environment 'Counter': unknown tool-call format 'qwen'"),
    (lambda: trl_environment(Counter, max_tool_calling_iterations=-1), "TRL environment 'Counter': "
     "max_tool_calling_iterations must be a whole number >= 0 or None (got -1)"),
    (lambda: trl_reward(no_kwargs), "TRL reward function 'no_kwargs' takes no **kwargs; TRL calls reward "
                                    "functions with prompts=, completions=, environments= and every dataset column"),
    (lambda: trl_reward(needs_ids), "TRL reward function 'needs_ids': parameter 'completion_ids' is not passed by "
                                    "rlcore"),
], ids=["no reset", "no docstring", "no type hint", "unknown format", "negative iterations", "no kwargs",
        "completion_ids"])
def test_bad_declarations(make, says):
    with pytest.raises(ValueError) as e:
        make()
    assert str(e.value).startswith(says) and "\n" not in str(e.value)


@pytest.mark.slow
def test_trl_tooladd_learns(tmp_path):
    """The tool task as a TRL-style environment: the prompt reset() writes is the warm start's (greedy accuracy
    starts at its 23.4%), and GRPO gains +30 points in 8 steps (76.6% measured) with exact logprobs. The
    environments' own counts (reward/used_add: trajectories whose instance ran add, read by a TRL reward function
    from `environments`) are at most rlcore's attempted calls per trajectory, which are tool/calls / 256."""
    proc = train_warm("recipe=trl_tooladd", f"output_dir={tmp_path}", "train.steps=8", "train.eval_every=8")
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "trl_tooladd" / "metrics.jsonl").read_text().splitlines()]
    start, end = rows[0]["eval/accuracy"], rows[-1]["eval/accuracy"]
    # step 0's greedy accuracy as every learning test floors it (a greedy argmax near a tie may flip on another
    # CPU, and a tool transcript compounds it); that reset() writes the warm start's prompt is checked token for
    # token by test_reset_text_goes_into_the_user_message
    assert start >= 0.10 and end - start >= 0.3, (start, end)
    assert all(r["rollout/logprob_diff_max"] < 1e-3 for r in rows[1:])
    assert all(0 < r["reward/used_add"] <= r["reward/tool_calls"] for r in rows[1:])
    assert all(r["tool/calls"] == round(r["reward/tool_calls"] * 256) for r in rows[1:])
