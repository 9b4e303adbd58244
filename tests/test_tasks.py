"""The two tiny multi-turn tasks learn through the real entry point (rlcore/tasks/, recipes/guess.py and
recipes/calculator.py): greedy held-out success rises by >= 30 points, with exact logprobs on every turn."""
import json

import pytest

from conftest import train_cmd

pytestmark = pytest.mark.slow  # real torchrun processes and vLLM engines: `make test-fast` leaves them out


def read_metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_guess_game_learns_to_use_feedback(tmp_path):
    """The warm start knows the format only (greedy repeats one digit: 1 secret in 10); GRPO on the
    environment's hit reward learns to bisect. 80 of the recipe's 200 steps, to keep the suite short."""
    proc = train_cmd("recipe=guess", f"output_dir={tmp_path}", "train.steps=80", "train.eval_every=40")
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = read_metrics(tmp_path / "guess")
    start, end = rows[0]["eval/accuracy"], rows[-1]["eval/accuracy"]
    assert start <= 0.2 and end - start >= 0.3, (start, end)
    assert all(r["rollout/logprob_diff_max"] < 1e-4 and 1 <= r["env/turns_mean"] <= 4 for r in rows[1:])
    first, last = (sum(r["reward/mean"] for r in part) / 5 for part in (rows[1:6], rows[-5:]))
    assert last > first + 0.2, (first, last)  # sampled success rises too
    assert rows[-1]["env/turns_mean"] < rows[1]["env/turns_mean"]  # fewer guesses per game


def test_calculator_tool_learns(tmp_path):
    """The demo's sloppy-carry start with a calculator it rarely calls: GRPO raises held-out accuracy and
    the rate of tool calls (logged as reward/tool_calls, weight 0)."""
    proc = train_cmd("recipe=calculator", f"output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = read_metrics(tmp_path / "calculator")
    start, end = rows[0]["eval/accuracy"], rows[-1]["eval/accuracy"]
    assert start <= 0.35 and end - start >= 0.3, (start, end)
    assert all(r["rollout/logprob_diff_max"] < 1e-4 for r in rows[1:])
    assert rows[1]["reward/tool_calls"] < 0.3 and rows[-1]["reward/tool_calls"] > 0.6
    assert rows[-1]["env/turns_mean"] > rows[1]["env/turns_mean"]  # a call adds a turn
