"""Environments for the multi-turn tests on the tiny arithmetic task (tests/test_multiturn.py).

Each is named on the command line as rollout.env=tests/envs/plumbing.py:NAME."""
import time

from rlcore.rollout.env import Env, Step


class Retry(Env):
    """Two turns: the first answer gets "?" back (try again), the second ends the trajectory."""
    max_turns = 2

    def __init__(self, row):
        self.answer, self.turn = row["answer"], 0

    def step(self, action, action_ids):
        self.turn += 1
        return Step("?", reward=0.0, done=self.turn == 2)


class Raising(Retry):
    def step(self, action, action_ids):
        if self.turn == 1:
            raise ValueError("the sandbox is gone")
        return super().step(action, action_ids)


class Slow(Retry):
    """Answers slowly for a third of the problems (those whose answer ends in 1, 4 or 7)."""

    def step(self, action, action_ids):
        if self.answer[-1] in "147":
            time.sleep(3)
        return super().step(action, action_ids)


class Stuck(Retry):
    """Never answers in time for a third of the problems (those whose answer ends in 1, 4 or 7)."""

    def step(self, action, action_ids):
        if self.answer[-1] in "147":
            time.sleep(600)
        return super().step(action, action_ids)


class WrongShape(Retry):
    def step(self, action, action_ids):
        return "?", 0.0


class TwoTokenStop(Retry):
    stop = ("12",)


class NoTurns(Retry):
    max_turns = 0


def not_an_env(row):
    return {"row": row}
