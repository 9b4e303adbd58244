"""Multi-turn rollouts through real vLLM engines and the real entry point: single-turn equivalence, a 4-turn
rollout at TP=2, environment failures, and bad environment settings."""
import json
import time

import pytest

from conftest import WORKERS, rank_exit_codes, torchrun_warm, train_cmd, train_warm

SMALL = ("rollout.prompts_per_step=8", "rollout.group_size=4", "train.micro_batch_size=8")
ENVS = "tests/envs/plumbing.py"


def read_metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("tp, extra", [(1, "data.eval_size=32"), (2, "data.eval_path=")])
def test_without_an_environment_batches_are_bit_identical(tmp_path, tp, extra):
    """The turn loop with no environment against the single-turn rollout it replaced, kept verbatim in the
    worker: same rows and seeds, every batch tensor equal bit for bit, and the same greedy eval."""
    out = tmp_path / "checks.json"
    proc = torchrun_warm(WORKERS / "single_turn_worker.py", out, "recipe=demo", f"output_dir={tmp_path}",
                         f"rollout.tensor_parallel={tp}", *SMALL, *extra.split())
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert len(result["ranks"]) == 2 and result["rows"] == 8 // (2 // tp)
    for checks in result["ranks"]:
        assert len(checks) == (13 if tp == 1 else 12) and all(checks.values()), checks


@pytest.mark.slow
def test_four_turns_at_tp2_identical_transcripts_exact_logprobs(tiny_models, tmp_path):
    """One engine over both ranks: both see the same transcripts, every environment is stepped exactly once
    per turn (by the rank that trains its trajectory), and the engine's logprobs of every model token of every
    turn match the trainer's. Each engine step's computed tokens as vLLM's scheduler counts them: a prompt's, then
    one a step."""
    out = tmp_path / "turns.json"
    proc = torchrun_warm(WORKERS / "turns_worker.py", tiny_models["qwen2"], 2, out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    a, b = result["ranks"]
    assert a["transcripts"] == b["transcripts"] and a["sampled"] == b["sampled"]
    assert a["turns"] == [4] * 8 and a["active"] == [8, 8, 8, 8]
    assert result["stepped"] == 32 and result["step_counts"] == [1] * 32  # 8 trajectories x 4 turns, once each
    assert {len(r["steps"]) for r in result["ranks"]} == {16}  # each rank stepped its own half
    for r in result["ranks"]:
        assert r["diff"] < 1e-4 and r["model_tokens"] == 4 * 3 * 4  # 4 trajectories x 4 turns x 3 tokens
        steps = r["computed"]  # a step's tokens: the prompt's, then one a step (at most 3: a sample may end at EOS)
        assert r["stop_ok"] and steps[0] == 7 and steps[1:] == [1] * (len(steps) - 1) and len(steps) <= 3
    for t in a["transcripts"]:  # every observation is the environment's "+-", appended once per turn
        assert len(t) == 4 * 3 + 3 * 2


@pytest.mark.slow
def test_a_multi_turn_run_logs_the_environment(tmp_path):
    """The demo task with a two-turn environment: metrics for turns, tokens and time, an exact sync check over
    every model token of both turns, and reward functions scoring the last turn."""
    proc = train_warm("recipe=demo", f"output_dir={tmp_path}", "train.steps=2", "data.eval_size=16",
                      f"rollout.env={ENVS}:Retry", "rollout.max_total_tokens=16", *SMALL)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = read_metrics(tmp_path / "demo")
    for r in rows[1:]:
        assert r["env/turns_mean"] == 2.0 and r["env/active_turn1"] == 32 and r["env/active_turn2"] == 32
        assert r["tokens/env_mean"] == 1.0 and r["env/timeouts"] == 0 and r["env/truncated_frac"] == 0
        assert 2 <= r["tokens/model_mean"] <= 16 and r["rollout/logprob_diff_max"] < 1e-4
        assert r["reward/mean"] == pytest.approx(r["reward/arithmetic_exact"])  # env rewards are all 0
        assert r["time/env_s"] > 0
    assert "active=32/32" in proc.stdout + proc.stderr
    assert "environment tests/envs/plumbing.py:Retry: up to 2 turns" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_raising_environment_stops_every_rank(tmp_path):
    proc = train_warm("recipe=demo", f"output_dir={tmp_path}", "train.steps=2", "data.eval_path=",
                      f"rollout.env={ENVS}:Raising", "rollout.max_total_tokens=16", *SMALL)
    assert proc.returncode != 0 and rank_exit_codes(proc) == {3}, proc.stderr[-4000:]
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("rlcore: error:"))
    assert f"environment '{ENVS}:Raising' failed on sample 0 of prompt" in line
    assert "turn 2: ValueError: the sandbox is gone (at plumbing.py:" in line
    assert not (tmp_path / "demo" / "checkpoints").exists()


@pytest.mark.slow
def test_a_slow_environment_times_out_without_hanging(tmp_path):
    proc = train_cmd("recipe=demo", f"output_dir={tmp_path}", "train.steps=1", "data.eval_path=",
                     f"rollout.env={ENVS}:Slow", "rollout.max_total_tokens=16", "rollout.env_timeout_s=0.5",
                     *SMALL, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (r,) = read_metrics(tmp_path / "demo")
    assert r["env/timeouts"] > 0 and r["time/env_s"] < 3 * r["env/active_turn1"]
    assert r["env/turns_mean"] < 2.0  # timed-out trajectories ended after their first turn


@pytest.mark.parametrize("override, says", [
    (f"rollout.env={ENVS}:Nowhere", f"rollout.env '{ENVS}:Nowhere': '{ENVS}' has no function 'Nowhere'"),
    ("rollout.env=no_such_module:Env", "rollout.env 'no_such_module:Env': cannot import module 'no_such_module'"),
    (f"rollout.env={ENVS}:not_an_env rollout.max_total_tokens=16", "returned a dict without a step() method"),
    (f"rollout.env={ENVS}:TwoTokenStop rollout.max_total_tokens=16", "stop token '12' is not one token of the tokenizer"),
    (f"rollout.env={ENVS}:NoTurns rollout.max_total_tokens=16", "max_turns must be a whole number >= 1"),
    (f"rollout.env={ENVS}:Retry rollout.max_total_tokens=4", "rollout.max_total_tokens=4 is smaller than one turn"),
    (f"rollout.env={ENVS}:Retry rollout.max_total_tokens=16 rollout.max_turns=-1", "rollout.max_turns must be >= 0 (got -1)"),
    ("rollout.max_turns=3", "rollout.max_turns and rollout.max_total_tokens need an environment"),
])
def test_bad_environment_settings(entry, tmp_path, override, says):
    """Found while loading inputs, on every rank alike: checked at world size 1 (tests/test_bad_input.py's
    class (e) covers what 2 ranks do with an error)."""
    proc = entry.train("recipe=demo", f"output_dir={tmp_path}", *override.split())
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("rlcore: error:")]
    assert len(errors) == 1 and says in errors[0], proc.stderr[-3000:]
    assert not (tmp_path / "demo" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_step_of_the_wrong_shape_stops_the_run(tmp_path):
    proc = train_warm("recipe=demo", f"output_dir={tmp_path}", "train.steps=1", "data.eval_path=",
                      f"rollout.env={ENVS}:WrongShape", "rollout.max_total_tokens=16", *SMALL)
    assert rank_exit_codes(proc) == {3}, proc.stderr[-3000:]
    assert "turn 1: step() returned a tuple of 2; it must return Step(observation, reward, done)" in proc.stderr


@pytest.mark.slow
def test_truncated_trajectories_get_the_fixed_reward(tmp_path):
    """rollout.max_turns=1 cuts the two-turn environment after its first step: every trajectory is truncated
    (out of turns), and rollout.truncated_reward replaces whatever the reward functions gave."""
    proc = train_warm("recipe=demo", f"output_dir={tmp_path}", "train.steps=1", "data.eval_path=",
                      f"rollout.env={ENVS}:Retry", "rollout.max_total_tokens=16", "rollout.max_turns=1",
                      "rollout.truncated_reward=-0.5", *SMALL)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (r,) = read_metrics(tmp_path / "demo")
    assert r["env/truncated_frac"] == 1.0 and r["env/turns_mean"] == 1.0 and "env/active_turn2" not in r
    assert r["reward/mean"] == -0.5 and r["reward/std"] == 0.0
    assert r["reward/arithmetic_exact"] > 0  # the scored reward, before the truncation rule replaced it


@pytest.mark.slow
def test_continuous_schedule_with_a_step_deadline(tmp_path):
    """rollout.schedule=continuous through the real entry point: a third of the tools never answer in time, the
    5 s step deadline ends those trajectories truncated (counted) and the step goes on; the exact sync check
    holds over every model token; the stuck calls do not hold up the end of the run."""
    t0 = time.perf_counter()
    proc = train_cmd("recipe=demo", f"output_dir={tmp_path}", "train.steps=1", "data.eval_path=",
                     f"rollout.env={ENVS}:Stuck", "rollout.max_total_tokens=16", "rollout.schedule=continuous",
                     "rollout.step_deadline_s=5", "rollout.env_timeout_s=500", *SMALL, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert time.perf_counter() - t0 < 200  # not the stuck calls' 600 s
    (r,) = read_metrics(tmp_path / "demo")
    assert r["rollout/deadline_truncated"] > 0 and r["env/truncated_frac"] > 0 and r["env/timeouts"] == 0
    assert r["env/calls_per_s"] > 0 and 0 <= r["rollout/engine_idle_frac"] < 1
    assert r["rollout/logprob_diff_max"] < 1e-4 and 5 <= r["time/step_s"] < 60
