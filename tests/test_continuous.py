"""The continuous schedule's logic (rlcore/rollout/continuous.py) with a scripted step-by-step engine: the same
trajectories as the lockstep loop, the deadline and the per-trajectory budget, async environments. No vLLM
here: tests/workers/continuous_worker.py drives the real engine at TP=2."""
import asyncio
import json
import time

import pytest

from conftest import WORKERS, torchrun_warm
from rlcore.rollout import continuous
from rlcore.rollout.turns import Trajectory, rollout, to_batch
from test_turns import EOS, STOP, ScriptedEngine, ScriptedEnv, envs


class StepEngine:
    """submit / step / busy / abort as RolloutEngine has them: a request's scripted turn (ScriptedEngine's)
    comes out after one step per token, so short turns overtake long ones."""

    def __init__(self, scripts):
        self.scripted, self.live, self.calls = ScriptedEngine(scripts), {}, []

    def submit(self, rid, prompt, max_tokens, temperature, seed, stop_token_ids=None):
        self.calls.append(("add", rid, seed))
        (s,), = self.scripted.generate([prompt], [1], [max_tokens], temperature, [seed], stop_token_ids)
        self.live[rid] = [s, max(len(s.token_ids), 1)]

    def step(self):
        out = []
        for rid in list(self.live):
            self.live[rid][1] -= 1
            if self.live[rid][1] == 0:
                out.append((rid, self.live.pop(rid)[0]))
        return out

    def busy(self):
        return bool(self.live)

    def abort(self, rids):
        if rids:
            self.calls.append(("abort", list(rids)))
        for rid in rids:
            del self.live[rid]


def both(rows, scripts, max_new_tokens=4, max_total=24, **kw):
    """The same rows through both schedules -> (lockstep trajectories, continuous ones, continuous stats)."""
    out = []
    for schedule in ("lockstep", "continuous"):
        ScriptedEnv.steps = []
        trajs = [Trajectory([r["first"], 10, 11], r, seed=100 + i, owner=0) for i, r in enumerate(rows)]
        if schedule == "lockstep":
            rollout(ScriptedEngine(scripts), trajs, envs(**kw), max_new_tokens, max_total, 1, 1.0, 0, None)
        else:
            stats = continuous.rollout(StepEngine(scripts), trajs, envs(**kw), max_new_tokens, max_total, 1.0, 0,
                                       None)
        out.append(trajs)
    return out[0], out[1], stats


def fields(x):
    return (x.tokens, x.sampled, x.logprobs, x.turns, x.done, x.truncated, x.timed_out, x.env_reward, x.error)


def test_same_trajectories_as_lockstep_for_every_ending_rule():
    """test_turns' rows (three turns; done, out of turns, cut by the cap, by the budget, an overflowing
    observation), with tool latencies that reorder them: every trajectory as lockstep builds it."""
    go = {"rewards": [0.1, 0.1, 0.1], "done": [False] * 3}
    rows = [
        {"name": "three", "first": 40, "obs": [[99, 21], [99, 23, 24], [99, 25]], "rewards": [0.5, 0.25, 1.0],
         "done": [False, False, True], "sleep": [0.05, 0, 0]},
        {"name": "done", "first": 41, "obs": [[99], [99], [99]], "rewards": [1, 0, 0], "done": [True, False, False]},
        {"name": "turns", "first": 42, "obs": [[99, 1], [99, 2], [99, 3]], **go, "sleep": [0, 0.03, 0]},
        {"name": "cap", "first": 43, "obs": [[99], [99], [99]], **go},
        {"name": "overflow", "first": 45, "obs": [[99] + [7] * 21, [99], [99]], **go},
    ]
    scripts = {40: [[5, 6, STOP, 7], [7, STOP], [8, 9, EOS]], 41: [[5, STOP]], 42: [[5, STOP], [6, STOP], [7, STOP]],
               43: [[5, 5, 5, 5, 5]], 45: [[5, STOP], [6, STOP]]}
    lock, cont, stats = both(rows, scripts)
    for a, b in zip(lock, cont):
        assert fields(a) == fields(b)
    assert to_batch(lock, 0, 1, 12).loss_mask.tolist() == to_batch(cont, 0, 1, 12).loss_mask.tolist()
    assert stats.active == [5, 2, 2] and stats.env_calls == 5 + 8  # five resets, eight steps
    assert stats.idle_s > 0.02 and stats.deadline_truncated == stats.budget_truncated == 0


def test_a_step_deadline_ends_a_stuck_tool_on_its_last_model_turn():
    """One tool sleeps 3 s in its second call: at the 0.4 s deadline its trajectory ends truncated, ending on
    its second model turn; the others finish as usual, and nobody waits for the stuck call."""
    stuck = {"name": "stuck", "first": 50, "obs": [[99, 21], [99], [99]], "rewards": [0.5, 1, 1],
             "done": [False, False, True], "sleep": [0, 3.0, 0]}
    ok = {"name": "ok", "first": 52, "obs": [[99], [99]], "rewards": [0, 1], "done": [False, True]}
    scripts = {50: [[5, STOP], [6, STOP]], 52: [[5, STOP], [6, EOS]]}
    trajs = [Trajectory([r["first"], 10, 11], r, seed=7 + i, owner=0) for i, r in enumerate([stuck, ok])]
    engine, t0 = StepEngine(scripts), time.perf_counter()
    stats = continuous.rollout(engine, trajs, envs(), 4, 24, 1.0, 0, None, step_deadline_s=0.4)
    assert 0.4 <= time.perf_counter() - t0 < 1.0
    x, y = trajs
    assert x.tokens == [5, 18, 99, 21, 6, 18] and x.sampled[-1] == 1 and x.truncated and x.abandoned
    assert x.env_reward == 0.5 and not x.timed_out
    assert (y.done, y.truncated, y.env_reward) == (True, False, 1)
    assert stats.deadline_truncated == 1 and not engine.live


def test_a_trajectory_budget_aborts_its_request_and_drops_the_observation():
    """The budget passes while a long turn is in the engine: the request is aborted (the same abort every TP
    rank makes) and the observation before it dropped, so the trajectory ends on its first model turn."""
    row = {"name": "long", "first": 53, "obs": [[99, 21], [99]], "rewards": [0, 1], "done": [False, True],
           "sleep": [0.2, 0]}
    trajs = [Trajectory([53, 10, 11], row, seed=3, owner=0)]

    class Slow(StepEngine):
        def step(self):  # the second turn never finishes by itself
            return [] if any(rid.endswith(".1") for rid in self.live) else super().step()

    engine = Slow({53: [[5, STOP], [6, 6, 6, 6]]})
    stats = continuous.rollout(engine, trajs, envs(), 4, 24, 1.0, 0, None, trajectory_timeout_s=0.5)
    x = trajs[0]
    assert x.tokens == [5, 18] and x.truncated and stats.budget_truncated == 1
    assert engine.calls[-1][0] == "abort" and engine.calls[-1][1][0].endswith(".0.1") and not engine.live


class AsyncEnv(ScriptedEnv):
    async def step(self, action, action_ids):
        await asyncio.sleep(0.2)
        return super().step(action, action_ids)


def test_async_environments_run_concurrently_on_one_event_loop():
    rows = [{"name": f"a{j}", "first": 54, "obs": [[99], [99]], "rewards": [0, 1], "done": [False, True]}
            for j in range(6)]
    trajs = [Trajectory([54, 10, 11], r, seed=j, owner=0) for j, r in enumerate(rows)]
    t0 = time.perf_counter()
    continuous.rollout(StepEngine({54: [[5, STOP], [6, EOS]]}), trajs, envs(factory=AsyncEnv), 4, 24, 1.0, 0, None)
    assert time.perf_counter() - t0 < 1.0  # 12 calls of 0.2 s, 4 at a time: 0.6 s, not 2.4 s
    assert all(x.env_reward == 1 and x.tokens == [5, 18, 99, 6, 2] for x in trajs)


@pytest.mark.parametrize("timeout", [0.3])
def test_a_slow_or_raising_environment_as_in_lockstep(timeout):
    slow = {"name": "slow", "first": 50, "obs": [[99], [99]], "rewards": [1, 1], "done": [False, True],
            "sleep": [3.0, 0]}
    bad = {"name": "bad", "first": 51, "obs": [[99], [99]], "rewards": [0, 0], "done": [False, True], "raise_at": 1}
    ok = {"name": "ok", "first": 52, "obs": [[99], [99]], "rewards": [0, 1], "done": [False, True]}
    t0 = time.perf_counter()
    lock, cont, _ = both([slow, bad, ok], {50: [[5, STOP]], 51: [[5, STOP], [6, STOP]], 52: [[5, STOP], [6, EOS]]},
                         timeout=timeout)
    assert time.perf_counter() - t0 < 2.0
    assert [fields(x) for x in lock] == [fields(x) for x in cont] and cont[0].timed_out
    assert cont[1].error.startswith("turn 2: KeyError: 'no such tool' (at test_turns.py:")  # the run stops on it


@pytest.mark.slow
def test_continuous_at_tp2_identical_engine_calls_deadline_and_calculator(tiny_models, tmp_path):
    """One real engine over two ranks (tests/workers/continuous_worker.py): under tools of random latency both
    ranks make exactly the same engine calls, transcripts agree and the engine's logprobs match the trainer's;
    a stuck tool ends its trajectory at the step deadline (the same abort on both ranks); the calculator task
    keeps lockstep's per-trajectory guarantees."""
    out = tmp_path / "continuous.json"  # seeds s + j per sample, as collect.run_turns gives them
    proc = torchrun_warm(WORKERS / "continuous_worker.py", tiny_models["qwen2"], out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    a, b = json.loads(out.read_text())
    for name in ("latency", "deadline", "calculator"):
        assert a[name]["calls"] == b[name]["calls"], name
        assert a[name]["tokens"] == b[name]["tokens"] and a[name]["sampled"] == b[name]["sampled"]
        for r in (a[name], b[name]):
            assert r["diff"] < 1e-3 and r["ends_on_model"] and r["mask_is_sampled"] and r["within_budget"]
    lat = a["latency"]
    assert lat["turns"] == [2 + (i + j) % 3 for i in range(8) for j in range(2)]
    adds = [c for c in lat["calls"] if c[0] == "add"]
    assert len(adds) == sum(lat["turns"]) and len({c[1] for c in adds}) == len(adds)
    assert lat["ticks"] > 3 and not any(lat["truncated"])
    dl = a["deadline"]
    assert 4.0 <= dl["seconds"] < 12 and dl["deadline_truncated"] == 1  # not the stuck tool's 30 s
    assert dl["truncated"] == [True] + [False] * 15 and dl["turns"][0] == 2
    assert dl["sampled"][0][-1] == 1 and len(dl["tokens"][0]) == 3 + 2 + 3  # two turns, one observation
    calc, lock = a["calculator"], a["calculator"]["lockstep"]
    assert all(set(o) <= set("0123456789?=") for o in calc["observations"])
    assert lock["ends_on_model"] and lock["mask_is_sampled"]
    # the same seeds per trajectory and turn: the first turns (one n=4 request in lockstep) sample alike
    assert [t[:1] for t in calc["tokens"]] == [t[:1] for t in lock["tokens"]]


@pytest.mark.parametrize("override, says", [
    ({"schedule": "async"}, "rollout.schedule must be one of lockstep, continuous (got 'async')"),
    ({"step_deadline_s": -1.0}, "rollout.step_deadline_s must be >= 0 (got -1.0)"),
    ({"schedule": "continuous", "env_workers": 0}, "rollout.env_workers must be >= 1 (got 0)"),
    ({"trajectory_timeout_s": 30.0}, "need rollout.schedule=continuous"),
])
def test_bad_schedule_settings(override, says):
    from rlcore.algorithms.grpo import GRPO
    from rlcore.config import Config, RewardSpec, RolloutConfig, validate
    from rlcore.distributed.parallel import ParallelDims

    cfg = Config(algorithm=GRPO(), rewards=[RewardSpec(fn="x:y")], rollout=RolloutConfig(**override))
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        validate(cfg, ParallelDims(1, 1))
