"""What a run tells its user: the launch-time plan check, measured memory next to the plan, the run summary
(after a finished run and after a stopped one), and the optional wandb mirror in its offline mode."""
import json

import pytest

from conftest import ROOT, rank_exit_codes, train_cmd
from test_plan import SHAPE_72B, model_dir
from rlcore.metrics import STEP_KEYS

pytestmark = pytest.mark.slow  # real torchrun processes and vLLM engines: `make test-fast` leaves them out

# Measured peak / plan on the tiny CPU demo was 0.87 for both phases (2 ranks, 2-core machine): the plan
# counts the whole KV cache (vLLM on CPU does not touch all of it) and 1 GB of process runtime per rank.
PLAN_FACTOR = 1.5


def test_launch_check_stops_a_run_that_does_not_fit_before_any_engine(tmp_path):
    big = model_dir(tmp_path, "q72", SHAPE_72B)  # config.json only: the run must stop before it needs weights
    proc = train_cmd("recipe=demo", "prepare=", f"model.path={big}", f"output_dir={tmp_path}/runs", timeout=300)
    assert rank_exit_codes(proc) == {2}, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("rlcore: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    line = lines[0]
    assert line.startswith("rlcore: error: the launch plan does not fit: the TRAIN bar needs "), line
    assert "GB over the" in line and "levers: " in line and "(plan.strict=false runs it anyway)" in line
    assert "cpu_worker" not in proc.stdout + proc.stderr, "no engine (vLLM's CPU worker) may start"
    assert not (tmp_path / "runs").exists()
    # plan.strict=false: the plan no longer stops it; the next check does (this folder has no weights)
    loose = train_cmd("recipe=demo", "prepare=", f"model.path={big}", "plan.strict=false",
                      f"output_dir={tmp_path}/runs", timeout=300)
    assert rank_exit_codes(loose) == {2}
    assert "has no weights" in loose.stderr and "the launch plan does not fit" not in loose.stderr


def test_demo_measures_memory_against_the_plan_writes_a_summary_and_mirrors_to_wandb(tmp_path):
    proc = train_cmd("recipe=demo", "train.steps=3", "train.eval_every=2", "logging.wandb=true",
                     f"output_dir={tmp_path}", env={"WANDB_MODE": "offline"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "demo" / "metrics.jsonl").read_text().splitlines()]
    for m in (m for m in steps if m["step"] > 0):
        for phase, plan in (("generate", "generation"), ("train", "train")):
            measured, planned = m[f"memory/{phase}_peak_gb"], m[f"memory/plan_{plan}_gb"]
            assert planned / PLAN_FACTOR <= measured <= planned * PLAN_FACTOR, (phase, measured, planned)
    summary = (tmp_path / "demo" / "summary.md").read_text()
    assert "status: finished" in summary and "steps run: 3" in summary
    table = summary.split("| stage | mean s/step | share | rate |")[1].split("\n\n")[0].strip().splitlines()[1:]
    stages = {row.split("|")[1].strip(): float(row.split("|")[3].strip().rstrip("%")) for row in table}
    assert {"generate", "reward", "logprobs", "train", "sync", "eval", "checkpoint"} <= set(stages), summary
    assert abs(sum(stages.values()) - 100) < 0.5, summary  # the stages (and "other") add up to the whole step
    assert "bottleneck: **" in summary and "eval: eval/accuracy" in summary
    assert "# rlcore run summary: demo" in proc.stdout + proc.stderr  # printed too
    # stdout is a pipe here, as a log file under Slurm: one plain line per step, no progress bar or redraws
    assert "\r" not in proc.stdout and "rlcore:  " not in proc.stdout and "step/s" not in proc.stdout
    shown = [line.split(":")[0] for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert shown == ["step 0/3", "step 1/3", "step 2/3", "step 3/3"], proc.stdout
    # wandb, offline: the run file holds every step key and the config
    [record] = list((tmp_path / "demo" / "wandb").glob("offline-run-*/run-*.wandb"))
    data = record.read_bytes()
    assert all(key.encode() in data for key in STEP_KEYS), [k for k in STEP_KEYS if k.encode() not in data]
    assert b"arithmetic_exact" in data and b"max_new_tokens" in data  # the config


STOPS_AT_STEP_2 = '''
calls = 0

def reward(prompts, completions, **columns):
    global calls
    calls += 1
    if calls == 2:
        raise RuntimeError("grader crashed")
    return [0.0] * len(prompts)
'''


def test_a_stopped_run_still_writes_its_summary(tmp_path):
    (tmp_path / "flaky.py").write_text(STOPS_AT_STEP_2)
    proc = train_cmd("recipe=demo", f"rewards.0.fn={tmp_path}/flaky.py:reward", "data.eval_path=", "train.steps=4",
                     "rollout.prompts_per_step=4", "rollout.group_size=2", f"output_dir={tmp_path}", timeout=600)
    assert rank_exit_codes(proc) == {3}, proc.stderr[-3000:]
    summary = (tmp_path / "demo" / "summary.md").read_text()
    assert "status: stopped: RunError: reward function 'reward' raised" in summary, summary
    assert "steps run: 1" in summary and "bottleneck: **" in summary
    # the error is still the last thing the user reads
    assert proc.stderr.strip().splitlines()[-1] != "" and "grader crashed" in proc.stderr.split("Root Cause")[-1]
