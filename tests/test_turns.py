"""The turn loop (rlcore/rollout/turns.py) with a scripted engine and scripted environments: exact token
layouts and every ending rule, pinned by hand. No processes, no vLLM: the engine below answers as vLLM does
(a turn stops at EOS or a stop token, both kept, or at max_tokens with finish_reason "length")."""
import time

import pytest
import torch

from rlcore.rollout.env import Env, Step, as_step, call_all, check_env, EnvError
from rlcore.rollout.turns import Trajectory, rollout, to_batch
from rlcore.run import Envs

EOS, STOP = 2, 18


class ScriptedEngine:
    """Each prompt's first token names a script: the list of what the model 'wants' to say, turn by turn.
    A sampled token t gets logprob -t / 100, so every position is identifiable."""

    def __init__(self, scripts: dict[int, list[list[int]]]):
        self.scripts, self.calls = scripts, []

    def generate(self, prompts, n, max_tokens, temperature, seeds, stop_token_ids=None):
        from rlcore.engine.rollout_engine import Sample
        self.calls.append({"prompts": [list(p) for p in prompts], "n": n, "max_tokens": max_tokens, "seeds": seeds})
        out = []
        for p, k, cap in zip(prompts, n, max_tokens):
            turn = sum(1 for t in p if t == 99)  # every observation below starts with 99
            want = self.scripts[p[0]][turn]
            ids, finish = [], "length"
            for t in want[:cap]:
                ids.append(t)
                if t == EOS or t in (stop_token_ids or []):
                    finish = "stop"
                    break
            out.append([Sample(ids, [-t / 100 for t in ids], finish) for _ in range(k)])
        return out


class ScriptedEnv(Env):
    """Answers turn i with row["obs"][i] (reward row["rewards"][i], done row["done"][i]); records its steps."""
    max_turns = 3
    stop = ("?",)
    steps: list = []

    def __init__(self, row):
        self.row, self.turn = row, 0

    def step(self, action, action_ids):
        ScriptedEnv.steps.append((self.row["name"], self.turn, action, list(action_ids)))
        i, self.turn = self.turn, self.turn + 1
        if self.row.get("sleep", [0] * 9)[i]:
            time.sleep(self.row["sleep"][i])
        if self.row.get("raise_at") == i:
            raise KeyError("no such tool")
        return Step(self.row["obs"][i], self.row["rewards"][i], self.row["done"][i])


def envs(max_turns=3, stop_ids=(STOP,), timeout=5.0, factory=ScriptedEnv) -> Envs:
    return Envs(factory, "ScriptedEnv", max_turns, list(stop_ids), timeout, 4, lambda obs: list(obs),
                lambda ids: " ".join(map(str, ids)))


def run(rows, scripts, max_new_tokens=4, max_total=24, **kw):
    ScriptedEnv.steps = []
    engine = ScriptedEngine(scripts)
    trajs = [Trajectory([r["first"], 10, 11], r, seed=100 + i, owner=0) for i, r in enumerate(rows)]
    stats = rollout(engine, trajs, envs(**kw), max_new_tokens, max_total, 1, 1.0, 0, None)
    return trajs, stats, engine


def test_three_turn_trajectory_exact_layout():
    """Three model turns (ended by the stop token, the stop token, EOS) with two observations between them:
    input_ids, loss_mask and rollout logprobs by hand; the final observation is not appended."""
    row = {"name": "a", "first": 40, "obs": [[99, 21], [99, 23, 24], [99, 25]], "rewards": [0.5, 0.25, 1.0],
           "done": [False, False, True]}
    trajs, stats, engine = run([row], {40: [[5, 6, STOP, 7], [7, STOP], [8, 9, EOS]]})
    x = trajs[0]
    assert x.tokens == [5, 6, 18, 99, 21, 7, 18, 99, 23, 24, 8, 9, 2]
    assert x.sampled == [1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1]
    assert x.turns == [[5, 6, 18], [7, 18], [8, 9, 2]]
    assert (x.done, x.truncated, x.timed_out, x.env_reward) == (True, False, False, 1.75)
    assert stats.active == [1, 1, 1]
    assert [s[1:] for s in ScriptedEnv.steps] == [(0, "5 6 18", [5, 6, 18]), (1, "7 18", [7, 18]),
                                                   (2, "8 9 2", [8, 9, 2])]
    # Each turn's cap is min(max_new_tokens, what is left of max_total); seeds change from turn to turn.
    assert [c["max_tokens"] for c in engine.calls] == [[4], [4], [4]]
    assert engine.calls[0]["seeds"] == [100] and len({c["seeds"][0] for c in engine.calls}) == 3
    assert engine.calls[2]["prompts"][0] == [40, 10, 11, 5, 6, 18, 99, 21, 7, 18, 99, 23, 24]
    batch = to_batch(trajs, 0, 1, 12)
    assert batch.input_ids.tolist() == [[40, 10, 11, 5, 6, 18, 99, 21, 7, 18, 99, 23, 24, 8, 9, 2]]
    # position t scores token t + 1: the prompt's last position scores the first sampled token
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1]]
    lp = [0, 0, -.05, -.06, -.18, 0, 0, -.07, -.18, 0, 0, 0, -.08, -.09, -.02]
    assert batch.rollout_logprobs[0].tolist() == pytest.approx(lp)
    assert batch.loss_mask.sum().item() == x.model_tokens == 8 and batch.max_model_tokens == 12


def test_every_ending_rule():
    """One trajectory per rule, in one batch: done, out of turns, an action cut by the per-turn cap (stop
    tokens declared: not stepped), an action cut by the total budget, and an observation that overflows."""
    go = {"rewards": [0.1, 0.1, 0.1], "done": [False] * 3}
    rows = [
        {"name": "done", "first": 41, "obs": [[99], [99], [99]], "rewards": [1, 0, 0], "done": [True, False, False]},
        {"name": "turns", "first": 42, "obs": [[99, 1], [99, 2], [99, 3]], **go},
        {"name": "cap", "first": 43, "obs": [[99], [99], [99]], **go},
        {"name": "budget", "first": 44, "obs": [[99, 30, 31, 32, 33], [99], [99]], **go},
        {"name": "overflow", "first": 45, "obs": [[99] + [7] * 7, [99], [99]], **go},
    ]
    scripts = {41: [[5, STOP]], 42: [[5, STOP], [6, STOP], [7, STOP]], 43: [[5, 5, 5, 5, 5]],
               44: [[5, STOP], [6, 6, 6, 6]], 45: [[5, STOP], [6, STOP]]}
    trajs, stats, engine = run(rows, scripts, max_new_tokens=4, max_total=10)
    done, turns, cap, budget, overflow = trajs
    assert (done.tokens, done.done, done.truncated, done.env_reward) == ([5, 18], True, False, 1.0)
    # out of turns: the third observation is dropped, the trajectory ends on the model's token
    assert turns.tokens == [5, 18, 99, 1, 6, 18, 99, 2, 7, 18] and turns.truncated
    assert turns.env_reward == pytest.approx(0.3)
    # 4 tokens without a stop token while the env declares one: an incomplete action, never shown to the env
    assert (cap.tokens, cap.truncated, cap.env_reward) == ([5, 5, 5, 5], True, 0.0)
    # 2 + 5 observation tokens leave 3 of the 10: the second turn is capped at 3 and cut there
    assert budget.tokens == [5, 18, 99, 30, 31, 32, 33, 6, 6, 6] and budget.truncated
    assert engine.calls[1]["max_tokens"] == [4, 3]  # "turns" and "budget" are still active
    # 2 + 8 observation tokens would fill the budget: no room for a model token, so it ends before it
    assert (overflow.tokens, overflow.truncated) == ([5, 18], True)
    stepped = sorted((name, turn) for name, turn, *_ in ScriptedEnv.steps)
    assert stepped == [("budget", 0), ("done", 0), ("overflow", 0), ("turns", 0), ("turns", 1), ("turns", 2)]
    assert stats.active == [5, 2, 1]
    assert all(x.done for x in trajs) and not any(x.timed_out or x.error for x in trajs)


def test_one_token_actions_without_stop_tokens_are_complete():
    """A game whose action is one token (max_new_tokens 1, no stop tokens): a turn cut at the cap is a whole
    action, so the environment is stepped."""
    row = {"name": "g", "first": 46, "obs": [[99, 14], [99, 15], [99, 17]], "rewards": [0, 0, 1],
           "done": [False, False, True]}
    trajs, _, _ = run([row], {46: [[7], [3], [5]]}, max_new_tokens=1, max_total=16, stop_ids=())
    assert trajs[0].tokens == [7, 99, 14, 3, 99, 15, 5] and trajs[0].env_reward == 1 and not trajs[0].truncated


def test_without_an_environment_one_turn_is_the_whole_rollout():
    trajs = [Trajectory([47, 10, 11], {}, seed=5, owner=0)]
    engine = ScriptedEngine({47: [[5, 6, 7, 8, 9]]})
    single = Envs(None, "", 1, [], 1.0, 1, lambda o: [], lambda ids: "")
    stats = rollout(engine, trajs, single, 4, 4, 1, 1.0, 0, None)
    assert trajs[0].tokens == [5, 6, 7, 8] and trajs[0].sampled == [1] * 4 and trajs[0].done
    assert stats.active == [1] and stats.env_s == 0.0


def test_first_turn_of_a_group_is_one_request_with_n():
    """Single-turn sampling shape: a prompt group is one request with n = group size and seed s (vLLM draws
    sample j with s + j); after the first turn, each trajectory is its own request."""
    rows = [{"name": f"n{j}", "first": 48, "obs": [[99], [99]], "rewards": [0, 0], "done": [False, True]}
            for j in range(3)]
    engine = ScriptedEngine({48: [[5, STOP], [6, EOS]]})
    trajs = [Trajectory([48, 10, 11], r, seed=70 + j, owner=0) for j, r in enumerate(rows)]
    ScriptedEnv.steps = []
    rollout(engine, trajs, envs(), 4, 16, 3, 1.0, 0, None)
    assert engine.calls[0]["n"] == [3] and engine.calls[0]["seeds"] == [70]
    assert engine.calls[1]["n"] == [1, 1, 1] and len(set(engine.calls[1]["seeds"])) == 3


def test_slow_and_raising_environments():
    """A call past env_timeout_s ends its trajectory (timed out) without waiting for it; an exception is kept
    as one line naming the turn and the error, for the run to stop on."""
    slow = {"name": "slow", "first": 50, "obs": [[99], [99]], "rewards": [1, 1], "done": [False, True],
            "sleep": [3.0, 0]}
    bad = {"name": "bad", "first": 51, "obs": [[99], [99]], "rewards": [0, 0], "done": [False, True], "raise_at": 1}
    ok = {"name": "ok", "first": 52, "obs": [[99], [99]], "rewards": [0, 1], "done": [False, True]}
    t0 = time.perf_counter()
    trajs, _, _ = run([slow, bad, ok], {50: [[5, STOP]], 51: [[5, STOP], [6, STOP]], 52: [[5, STOP], [6, EOS]]},
                      timeout=0.3)
    assert time.perf_counter() - t0 < 2.5  # nobody waited for the 3 s call
    slow_x, bad_x, ok_x = trajs
    assert slow_x.timed_out and slow_x.done and slow_x.tokens == [5, 18]
    assert bad_x.error.startswith("turn 2: KeyError: 'no such tool' (at test_turns.py:")
    assert ok_x.env_reward == 1 and not ok_x.error


def test_step_results_are_checked():
    assert as_step(("obs", 1, True)) == Step("obs", 1.0, True)
    for bad, says in ((("obs", 1), "a tuple of 2"), ({"obs": 1}, "dict"), (Step({"a": 1}), "observation"),
                      (Step("x", "high"), "reward 'high'"), (Step("x", float("nan")), "NaN")):
        with pytest.raises(EnvError, match=says):
            as_step(bad)


def test_startup_check_of_an_instance():
    vocab = {"?": [18], "ab": [4, 5]}.get
    assert check_env(ScriptedEnv({}), "s", vocab) == (3, [18])

    class NoStep:
        pass

    class TwoTokenStop(ScriptedEnv):
        stop = ("ab",)

    class NoTurns(ScriptedEnv):
        max_turns = 0

    for env, says in ((NoStep(), "without a step"), (TwoTokenStop({}), "not one token"),
                      (NoTurns({}), "max_turns must be a whole number >= 1")):
        with pytest.raises(ValueError, match=says):
            check_env(env, "s", vocab)


def test_call_all_runs_calls_concurrently():
    t0 = time.perf_counter()
    out = call_all([lambda: time.sleep(0.3) or 1 for _ in range(4)], timeout_s=5, workers=4)
    assert [o.value for o in out] == [1] * 4 and time.perf_counter() - t0 < 1.0
    assert torch.tensor([o.seconds for o in out]).min() >= 0.29
