"""Whole runs of launch/train.py under torchrun: 2 CPU ranks, gloo, real vLLM engines, real FSDP2. (Every
architecture's runs, with a reference model and activation checkpointing among them: tests/test_archs.py.)"""
import json
import math

import pytest

from conftest import WORKERS, rank_exit_codes, torchrun, train_cmd

pytestmark = pytest.mark.slow  # real torchrun processes and vLLM engines: `make test-fast` leaves them out
from rlcore.metrics import STEP_KEYS

SMALL = ("rollout.prompts_per_step=8", "rollout.group_size=4", "train.micro_batch_size=8")


def read_metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("packing", ["", "train.max_tokens_per_micro_batch=1024"], ids=["padded", "packed"])
def test_demo_recipe_learns(tmp_path, packing):
    """The whole demo as `make demo` runs it: every key logged and finite at every step, the sync check
    tight, eval at the right steps, and held-out accuracy from >= 10% up by >= 30 points; the same with
    token-budget packing (1024 tokens: each rank's ~3,000 tokens a step in 3-4 packed micro-batches)."""
    proc = train_cmd("recipe=demo", f"output_dir={tmp_path}", *packing.split())
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = read_metrics(tmp_path / "demo")
    steps = json.loads((tmp_path / "demo" / "config.json").read_text())["train"]["steps"]
    assert [r["step"] for r in rows] == list(range(steps + 1))
    assert [r["step"] for r in rows if "eval/accuracy" in r] == list(range(0, steps + 1, 10))
    for r in rows[1:]:
        missing = set(STEP_KEYS) - set(r)
        assert not missing, missing
        assert all(math.isfinite(v) for v in r.values())
        assert r["rollout/logprob_diff_max"] < 1e-3  # fp32 engine and trainer agree after every sync
        assert 0.0 <= r["reward/mean"] <= 1.0 and 1.0 <= r["response/length_mean"] <= 8.0
        assert r["time/step_s"] >= r["time/generate_s"] + r["time/train_s"]
    start, end = rows[0]["eval/accuracy"], rows[-1]["eval/accuracy"]
    assert start >= 0.10 and end - start >= 0.30, (start, end)
    first, last = (sum(r["reward/mean"] for r in part) / 5 for part in (rows[1:6], rows[-5:]))
    assert last > first + 0.1, (first, last)  # the training reward rises too
    config = json.loads((tmp_path / "demo" / "config.json").read_text())
    assert config["algorithm"]["_target"] == "rlcore.algorithms.grpo.GRPO"
    assert list((tmp_path / "demo" / "tb").glob("events.out.tfevents.*"))
    assert f"eval/accuracy on 256 held-out prompts: start {100 * start:.1f}%" in proc.stderr + proc.stdout


def test_skipped_sync_stops_the_run(tmp_path):
    """Fault injection: with the sync skipped the engine keeps the old weights; the check stops the run."""
    proc = torchrun(WORKERS / "skip_sync.py", "recipe=demo", f"output_dir={tmp_path}", "train.steps=4",
                    "data.eval_path=", "optim.lr=0.01", *SMALL)
    assert proc.returncode != 0 and rank_exit_codes(proc) == {3}, proc.stderr[-4000:]
    assert "the inference engine holds stale or corrupted weights" in proc.stderr
    rows = read_metrics(tmp_path / "demo")
    assert [r["step"] for r in rows] == [1]  # step 1 sampled with the initial weights; step 2 is caught


def test_same_seed_same_run(tmp_path):
    """Rollout seeds come from (run seed, step, prompt): two runs log identical numbers, timings aside."""
    runs = []
    for i in range(2):
        proc = train_cmd("recipe=demo", f"output_dir={tmp_path / str(i)}", "train.steps=3", "data.eval_size=32",
                         "rollout.tensor_parallel=2", *SMALL)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs.append([{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/", "memory/"))}
                     for r in read_metrics(tmp_path / str(i) / "demo")])
    assert len(runs[0]) == 4 and runs[0] == runs[1]
    assert len({r["reward/mean"] for r in runs[0][1:]}) > 1  # the steps differ from each other
