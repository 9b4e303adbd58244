"""Whole runs of launch/train.py under torchrun: 2 CPU ranks, gloo, real vLLM engines, real FSDP2. (Every
architecture's runs, with a reference model and activation checkpointing among them: tests/test_archs.py.)"""
import json
import math
import re

import pytest

from conftest import WORKERS, RunServer, _runs, rank_exit_codes, torchrun_warm, train_cmd, train_warm

pytestmark = pytest.mark.slow  # real torchrun processes and vLLM engines: `make test-fast` leaves them out
from rlcore.outputs.metrics import STEP_KEYS
from test_run_report import PLAN_FACTOR

SMALL = ("rollout.prompts_per_step=8", "rollout.group_size=4", "train.micro_batch_size=8")


def read_metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_demo_recipe_learns_and_reports(tmp_path):
    """The whole demo as `make demo` runs it (with wandb mirroring in its offline mode): every key logged and
    finite at every step, the sync check tight, eval at the right steps, and held-out accuracy from >= 10% up
    by >= 30 points. What the run tells its user: measured memory within PLAN_FACTOR of the launch plan at
    every step, the summary (stages adding up to the step, the bottleneck), the wandb file holding every step
    key and the config, and stdout read as a log file (a pipe here): one plain line per step, no bar.
    (The demo with token-budget packing learns in tests/test_algorithms.py's DAPO variant.)"""
    proc = train_cmd("recipe=demo", f"output_dir={tmp_path}", "logging.wandb=true", env={"WANDB_MODE": "offline"})
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
    # The first screen is rlcore's (rlcore/outputs/library_logs.py): no warning of vLLM's ("(MainProcess pid=..) WARNING")
    # or torch's C++ ("[rank0]:[W..."), no library's deprecation notice, no checkpoint-loading bar
    noise = re.findall(r".*(?:\) WARNING |\]:\[W\d|FutureWarning|DeprecationWarning|it/s\]).*", proc.stderr + proc.stdout)
    assert noise == [], noise[:5]
    report(tmp_path / "demo", rows, proc, steps)


def report(run_dir, rows, proc, steps: int) -> None:
    """(Moved here from tests/test_run_report.py, which ran a 3-step demo of its own for it.)"""
    for m in rows[1:]:
        for phase, plan in (("generate", "generation"), ("train", "train")):
            measured, planned = m[f"memory/{phase}_peak_gb"], m[f"memory/plan_{plan}_gb"]
            assert planned / PLAN_FACTOR <= measured <= planned * PLAN_FACTOR, (phase, measured, planned)
    summary = (run_dir / "summary.md").read_text()
    assert "status: finished" in summary and f"steps run: {steps}" in summary
    table = summary.split("| stage | mean s/step | share | rate |")[1].split("\n\n")[0].strip().splitlines()[1:]
    stages = {row.split("|")[1].strip(): float(row.split("|")[3].strip().rstrip("%")) for row in table}
    assert {"generate", "reward", "logprobs", "train", "sync", "eval", "checkpoint"} <= set(stages), summary
    assert abs(sum(stages.values()) - 100) < 0.5, summary  # the stages (and "other") add up to the whole step
    assert "bottleneck: **" in summary and "eval: eval/accuracy" in summary
    assert "# rlcore run summary: demo" in proc.stdout + proc.stderr  # printed too
    # stdout is a pipe here, as a log file under Slurm: one plain line per step, no progress bar or redraws
    assert "\r" not in proc.stdout and "rlcore:  " not in proc.stdout and "step/s" not in proc.stdout
    shown = [line.split(":")[0] for line in proc.stdout.splitlines() if re.match(r"step \d+/\d+: ", line)]
    assert shown == [f"step {i}/{steps}" for i in range(steps + 1)], proc.stdout
    # wandb, offline: the run file holds every step key and the config
    [record] = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    data = record.read_bytes()
    assert all(key.encode() in data for key in STEP_KEYS), [k for k in STEP_KEYS if k.encode() not in data]
    assert b"arithmetic_exact" in data and b"max_new_tokens" in data  # the config


def test_skipped_sync_stops_the_run(tmp_path):
    """Fault injection, the sync skipped, the engine left awake through training: it keeps the old weights and the
    drift check stops the run. (An engine put to sleep refuses to generate before any sync: tests/workers/
    sync_worker.py on a real engine, tests/test_lifecycle.py for every transition.)"""
    proc = torchrun_warm(WORKERS / "skip_sync.py", "recipe=demo", f"output_dir={tmp_path}", "train.steps=4",
                         "data.eval_path=", "optim.lr=0.01", "rollout.sleep_while_training=false", *SMALL)
    assert proc.returncode != 0 and rank_exit_codes(proc) == {3}, proc.stderr[-4000:]
    assert "the inference engine holds stale or corrupted weights" in proc.stderr
    rows = read_metrics(tmp_path / "demo")
    assert [r["step"] for r in rows] == [1]  # step 1 sampled with the initial weights; step 2 is caught


def test_same_seed_same_run(tmp_path):
    """Rollout seeds come from (run seed, step, prompt): two runs log identical numbers, timings aside, and export
    the same bytes. One is a fresh launch, two run in the slow tier's shared launch (conftest.RunServer), the
    second after a split run in the same processes: what the tests that use it read is what a launch gives. (The
    split run's collectives scope outlived it, and halved the next run's sums, until leave_process_groups reset
    it.)"""
    runs, exports = [], []
    for i, launch in enumerate((train_cmd, train_warm, train_warm)):
        if i == 2:  # a split run first: what one run leaves in the processes must not reach the next
            split = train_warm("recipe=demo", f"output_dir={tmp_path / 'split'}", "train.steps=1", "data.eval_path=",
                               "rollout.ranks=1", *SMALL)
            assert split.returncode == 0, split.stderr[-4000:]
        proc = launch("recipe=demo", f"output_dir={tmp_path / str(i)}", "train.steps=3", "data.eval_size=32",
                      "rollout.tensor_parallel=2", *SMALL)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs.append([{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/", "memory/"))}
                     for r in read_metrics(tmp_path / str(i) / "demo")])
        hf = tmp_path / str(i) / "demo" / "hf" / "step_3"
        exports.append({p.name: p.read_bytes() for p in hf.iterdir() if p.is_file()})
    assert len(runs[0]) == 4 and runs[0] == runs[1] == runs[2]
    assert "model.safetensors" in exports[0] and exports[0] == exports[1] == exports[2]
    assert len({r["reward/mean"] for r in runs[0][1:]}) > 1  # the steps differ from each other


def test_the_shared_launch_outlives_only_a_failed_run_that_left_nothing():
    """The slow tier's shared launch (conftest.RunServer) runs the tests' failing runs too: a run that stops (exit 3)
    and leaves nothing in its processes keeps the job, one that leaves a thread, a child process or an open file
    ends it, and the next run starts a new job. Each rank's exit code reaches the test as torchrun's report would.
    (Last in the file: no shared run of 2 ranks comes after it in the suite's order to pay for the new job.)"""
    server = _runs.setdefault(2, RunServer(2))
    clean = torchrun_warm(WORKERS / "leaves.py", "nothing")
    assert clean.rank_codes == {0: 3, 1: 3} and rank_exit_codes(clean) == {3}, clean.stderr[-3000:]
    job = server.proc
    again = torchrun_warm(WORKERS / "leaves.py", "nothing")
    assert again.rank_codes == {0: 3, 1: 3} and server.proc is job and job.poll() is None, again.stderr[-3000:]
    leaky = torchrun_warm(WORKERS / "leaves.py", "something")
    assert rank_exit_codes(leaky) == {3} and job.poll() is not None, leaky.stderr[-3000:]
    lines = [ln for ln in leaky.stderr.splitlines() if ln.startswith("the shared launch ends: rank ")]
    assert len(lines) == 2, leaky.stderr[-3000:]
    for left in ("threads: ['left-behind", "child processes: ['", "sleep 30", "open files: ['", "leaves.py"):
        assert all(left in ln for ln in lines), (left, lines)
    after = torchrun_warm(WORKERS / "leaves.py", "nothing")
    assert rank_exit_codes(after) == {3} and server.proc is not job, after.stderr[-3000:]
