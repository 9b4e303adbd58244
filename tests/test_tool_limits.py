"""What one model turn may ask of its tools (rollout.max_tool_calls, rollout.turn_deadline_s): a turn of 100
python calls runs at most the cap and stops at its deadline; a trajectory the loop drops (step deadline,
environment timeout) leaves no program running and its sandbox worker free; async tools are cancelled at the
deadline. Real sandbox, real turn loops (lockstep and continuous) with test_turns' scripted engines."""
import asyncio
import time

import pytest

from rlcore.rollout import continuous
from rlcore.rollout.env import Limits, call_all, time_left, within
from rlcore.rollout.tools import Toolbox, ToolEnv, ToolStats, python
from rlcore.rollout.turns import Trajectory, rollout
from rlcore.run import Envs
from rlcore.sandbox import pool as sandbox
from test_continuous import StepEngine
from test_turns import STOP, ScriptedEngine


@pytest.fixture
def one_worker():
    """The rank's shared sandbox with a single worker, so that a worker still held would block the next call."""
    sandbox.configure(sandbox.SandboxConfig(timeout_s=20, cpu_s=20, workers=1))
    assert python("print(1)") == "1\n"  # started before any clock runs
    yield sandbox.shared()
    sandbox.configure(sandbox.SandboxConfig())  # closes it


def calls(code: str, n: int, name: str = "python") -> str:
    """One Hermes turn with n calls of `code` (k in it replaced by the call's number)."""
    return "".join(f'<tool_call>{{"name": "{name}", "arguments": {{"code": "{code.replace("k", str(k))}"}}}}'
                   f"</tool_call>" for k in range(n))


class Coder(ToolEnv):
    toolbox = Toolbox([python], format="hermes")


def test_a_turn_of_100_calls_keeps_to_its_cap_and_deadline(one_worker):
    """100 calls of a 0.3 s program, cap 8, a 1 s turn (tools stop 0.25 s early, so the answer is back before
    the loop would give up): the first calls run (two, here), the one running at the deadline is stopped, the
    rest of the 8 are not started, the other 92 are refused; one bounded observation after about 0.75 s, not
    30 s. On a loaded machine the second program may end just past the deadline: then nothing is stopped."""
    env, t0 = Coder({}), time.perf_counter()
    [out] = call_all([lambda: env.step(calls("import time; time.sleep(0.3); print(k)", 100), [])], timeout_s=60,
                     workers=1, turn_s=1.0, max_tool_calls=8)
    took = time.perf_counter() - t0
    messages = out.value.observation
    ran = [m["content"] for m in messages if m.get("name") == "python" and m["content"].strip().isdigit()]
    stopped = [m for m in messages if m["content"] == "[timeout: the turn's time ran out]"]
    assert 0.7 < took < 1.5 and 1 <= len(ran) <= 2 and len(stopped) <= 1  # 0.77 s here
    assert ran == [f"{k}\n" for k in range(len(ran))]
    not_run = 8 - len(ran) - len(stopped)
    assert messages[len(ran) + len(stopped):] == [
        {"role": "tool", "content": f"error: {not_run} tool calls were not run: the turn's time ran out"},
        {"role": "tool", "content": "error: 92 more tool calls were not run: at most 8 per turn"}]
    late = env.stats.deadline - not_run - len(stopped)  # 1 if the last program that ran ended past the deadline
    assert env.stats == ToolStats(calls=100, too_many_calls=92, deadline=env.stats.deadline) and late in (0, 1)
    assert len(stopped) + late == 1  # exactly one call met the deadline while running
    assert python("print(2)") == "2\n"  # the worker is free again


def test_the_cap_alone(one_worker):
    """No deadline in sight: exactly the first 8 calls run, in order."""
    env = Coder({})
    step = within(Limits(max_tool_calls=8), env.step, calls("print(k)", 100), [])
    assert [m["content"] for m in step.observation] == [f"{k}\n" for k in range(8)] + [
        "error: 92 more tool calls were not run: at most 8 per turn"]
    assert env.stats == ToolStats(calls=100, too_many_calls=92)


RECORD: dict = {}


def sleeper(code: str) -> str:
    """Run a program, noting when each call ended and what it answered.

    Args:
        code: the program
    """
    try:
        return RECORD.setdefault("answers", []).append(python(code)) or RECORD["answers"][-1]
    finally:
        RECORD.setdefault("ended", []).append(time.perf_counter())


class Sleeper(ToolEnv):
    toolbox = Toolbox([sleeper], format="hermes")
    max_turns = 10_000


def sleeper_envs(factory, timeout_s: float, max_turns: int) -> Envs:
    """Every model turn reads as 100 calls of a program that sleeps for 100 s."""
    action = calls("import time; time.sleep(100)", 100, name="sleeper")
    return Envs(factory, factory.__name__, max_turns, [STOP], timeout_s, 4, lambda obs: [99], lambda ids: action,
                turn_s=30.0, max_tool_calls=8)


def test_a_step_deadline_stops_the_program_and_frees_the_worker(one_worker):
    """continuous, 1 s step deadline: the first program is stopped 0.25 s before it, every later turn's calls
    are answered "not run" at once, without reaching the tool (tools stop 0.25 s before the deadline), and
    the trajectory is dropped at the deadline. When the rollout returns, no program runs and the single
    sandbox worker takes a call at once."""
    RECORD.clear()
    traj, t0 = Trajectory([40, 10, 11], {}, seed=1, owner=0), time.perf_counter()
    stats = continuous.rollout(StepEngine({40: [[5, STOP]] * 10_000}), [traj], sleeper_envs(Sleeper, 60.0, 10_000),
                               4, 100_000, 1.0, 0, None, step_deadline_s=1.0)
    returned = time.perf_counter()
    assert stats.deadline_truncated == 1 and traj.truncated and 0.95 < returned - t0 < 1.5
    assert RECORD["answers"] == ["[timeout: the turn's time ran out]"] and 0.7 < RECORD["ended"][0] - t0 < 1.2
    assert RECORD["ended"][0] < returned and len(traj.turns) > 1
    stepped = traj.env.stats.calls // 100  # the last turn may have been cut before its step
    assert stepped in (len(traj.turns) - 1, len(traj.turns))
    assert traj.env.stats == ToolStats(calls=100 * stepped, too_many_calls=92 * stepped, deadline=8 * stepped)
    assert one_worker.run("print(3)", timeout_s=0.5).stdout == "3\n"  # a held worker would time out


class Stubborn:
    """An environment that ignores its deadline: a program, then 1 s of pure Python, then another program."""
    max_turns = 1

    def __init__(self, row):
        pass

    def step(self, action, action_ids):
        sleeper("import time; time.sleep(100)")
        time.sleep(1.0)
        sleeper("print(4)")
        RECORD["done"] = time.perf_counter()
        return "never read", 0.0, True


def test_an_abandoned_environment_starts_no_more_programs(one_worker):
    """lockstep, 1 s environment timeout: the loop gives up on the call at 1 s (the trajectory times out); its
    program was stopped at 0.75 s, and the program the abandoned thread asks for after is never started."""
    RECORD.clear()
    traj, t0 = Trajectory([40, 10, 11], {}, seed=1, owner=0), time.perf_counter()
    rollout(ScriptedEngine({40: [[5, STOP]]}), [traj], sleeper_envs(Stubborn, 1.0, 1), 4, 24, 1, 1.0, 0, None)
    returned = time.perf_counter()
    assert traj.timed_out and traj.abandoned is False and 0.95 < returned - t0 < 1.3
    assert RECORD["answers"] == ["[timeout: the turn's time ran out]"] and RECORD["ended"][0] < returned
    assert one_worker.run("print(3)", timeout_s=0.5).stdout == "3\n"  # free while the thread still sleeps
    while "done" not in RECORD:
        time.sleep(0.05)
    assert RECORD["answers"] == ["[timeout: the turn's time ran out]", "[not run: the turn's time ran out]"]


def test_async_tools_are_cancelled_at_the_deadline():
    async def wait(seconds: float) -> str:
        """Wait.

        Args:
            seconds: how long
        """
        await asyncio.sleep(seconds)
        return "waited"

    class Waiter(ToolEnv):
        toolbox = Toolbox([wait], format="hermes")

    env, t0 = Waiter({}), time.perf_counter()
    turn = '<tool_call>{"name": "wait", "arguments": {"seconds": 0.05}}</tool_call>' + \
           '<tool_call>{"name": "wait", "arguments": {"seconds": 10}}</tool_call>' * 2
    step = within(Limits(time.monotonic() + 0.5, 8), env.step, turn, [])
    assert time.perf_counter() - t0 < 1.0
    assert [m["content"] for m in step.observation] == [
        "waited", "error: stopped: the turn's time ran out", "error: 1 tool call was not run: the turn's time ran out"]
    assert env.stats == ToolStats(calls=3, deadline=2)


def test_limits_of_a_call():
    """Outside a rollout: no deadline and the config's cap; inside: what the loop gave, 0.25 s early."""
    assert time_left() == float("inf") and Limits().max_tool_calls == 8
    left = within(Limits.starting_now(2.0, 3), time_left)
    assert 1.0 < left <= 1.75  # 2 s less the quarter; the lower bound leaves a loaded machine room
    assert within(Limits.starting_now(0.4, 3), time_left) <= 0.3  # a quarter of a short call
