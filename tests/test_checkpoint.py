"""Long runs: exact-once resume, faults in a step and in a save, resharding 2 -> 1, HF export, bad resume
paths, non-finite steps. Real torchrun processes on 2 CPU ranks, real FSDP2, real vLLM engines."""
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import ENGINE_BOUND, ROOT, WORKERS, rank_exit_codes, torchrun, torchrun_warm, train_warm

pytestmark = pytest.mark.slow  # real torchrun processes and vLLM engines: `make test-fast` leaves them out

SMALL = ("rollout.prompts_per_step=8", "rollout.group_size=4", "train.micro_batch_size=8", "data.eval_path=")
RUN = ("recipe=demo", "train.steps=4", "train.save_every=2", *SMALL)
VOLATILE = ("time/", "throughput/", "memory/")


def read_metrics(run_dir) -> list[dict]:
    """Per-step metrics, timings and memory left out (they differ between any two runs)."""
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE)}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def python(*args, timeout=300) -> subprocess.CompletedProcess:
    return pythons([args], timeout)[0]


def pythons(commands: list, timeout=300) -> list[subprocess.CompletedProcess]:
    """`python ARGS` for each ARGS in commands, all at once (one thread each: the machine's cores share them)."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, *map(str, args)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for args in commands]
    try:
        outputs = [proc.communicate(timeout=timeout) for proc in procs]
    finally:  # as subprocess.run on a timeout: no process is left running behind a failed test
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [subprocess.CompletedProcess(proc.args, proc.returncode, *out) for proc, out in zip(procs, outputs)]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted reference run: 4 steps on 2 ranks, checkpoints at 2 and 4, HF export at 4."""
    out = tmp_path_factory.mktemp("straight")
    proc = train_warm(*RUN, f"output_dir={out}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out / "demo"


PPO_RUN = ("recipe=ppo_tiny", *RUN[1:])


@pytest.fixture(scope="module")
def straight_ppo(tmp_path_factory):
    """PPO uninterrupted: the policy and the critic, each with its own optimizer and schedule."""
    out = tmp_path_factory.mktemp("straight_ppo")
    proc = train_warm(*PPO_RUN, f"output_dir={out}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out / "ppo_tiny"


def test_kill_in_step_then_resume_is_exact_once(straight_ppo, tmp_path):
    """PPO (actor + critic, two optimizers): rank 1 is SIGKILLed in the middle of step 3 (after the step-2
    checkpoint); resume=auto continues from step 2 and the run logs the same numbers for every step (the
    critic's value/* included), and ends with the same weights bit for bit, as the run that was never
    interrupted (the engine gets the checkpointed weights first)."""
    straight = straight_ppo
    proc = torchrun(WORKERS / "faults.py", *PPO_RUN, f"output_dir={tmp_path}",
                    env={"KILL_RANK": "1", "KILL_AT_UPDATE": "3"})
    assert proc.returncode != 0 and -9 in rank_exit_codes(proc), proc.stderr[-4000:]
    run = tmp_path / "ppo_tiny"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2"]
    assert [r["step"] for r in read_metrics(run)] == [1, 2]

    proc = train_warm(*PPO_RUN, f"output_dir={tmp_path}", "resume=auto")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"resume: continuing after step 2 from {run / 'checkpoints' / 'step_2'}" in proc.stdout + proc.stderr
    ours, theirs = read_metrics(run), read_metrics(straight)
    assert [r["step"] for r in ours] == [1, 2, 3, 4]
    assert ours == theirs
    assert ours[-1]["value/mean"] != 0.0 and ours[-1]["value/loss"] > 0  # the critic was trained and resumed
    assert all(r["rollout/logprob_diff_max"] < 1e-3 for r in ours)
    weights = "hf/step_4/model.safetensors"
    assert (run / weights).read_bytes() == (straight / weights).read_bytes()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2", "step_4"]


def test_full_disk_and_kill_in_save_then_resume_on_one_rank(tmp_path):
    """2 ranks save step 1; saving step 2, a full disk on rank 1 stops the save on both ranks with the
    temporary removed; then rank 1 is SIGKILLed mid-save. resume=auto on ONE rank reports the partial
    step 2, loads step 1, and holds exactly the model and optimizer values the 2 ranks saved."""
    from rlcore.tasks import tiny
    tiny.prepare(None)
    model = tiny.model_dir()
    proc = torchrun(WORKERS / "ckpt_worker.py", "save", model, tmp_path, timeout=300)
    assert -9 in rank_exit_codes(proc), proc.stderr[-4000:]
    saved = json.loads((tmp_path / "save.json").read_text())
    assert saved["save_error"].startswith(f"cannot write checkpoint {tmp_path}/checkpoints/step_2: [Errno 28] "
                                          f"No space left on device")
    assert saved["after_full_disk"] == ["step_1"]  # previous one intact, temporary gone
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [".step_2.tmp", "step_1"]

    proc = torchrun_warm(WORKERS / "ckpt_worker.py", "load", model, tmp_path, nproc=1, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads((tmp_path / "load.json").read_text())
    assert r["path"] == str(tmp_path / "checkpoints" / "step_1") and r["loop"] == {"step": 1}
    assert "ignoring incomplete checkpoint(s) (a save was cut short): .step_2.tmp" in r["notes"][0]
    assert any("per-rank RNG states are not carried over" in n for n in r["notes"])
    assert r["max_diff"] == 0.0  # weights, exp_avg, exp_avg_sq, step: equal after resharding 2 -> 1
    assert r["lr"][0] == r["lr"][1] == [0.005]  # the scheduler too (warmup step 2 of 4)


def test_hf_export_loads_in_transformers_and_vllm(straight, tmp_path):
    """hf/step_4 loads with transformers and vllm.LLM and scores fixed sequences as the trainer does
    with the step-4 checkpoint loaded on 1 rank; the convert command rebuilds it byte for byte."""
    from safetensors.torch import load_file
    from rlcore.tasks import tiny

    hf_dir, ckpt = straight / "hf" / "step_4", straight / "checkpoints" / "step_4"
    logprobs, modes = {}, (("trainer", tiny.model_dir(), ckpt), ("hf", hf_dir), ("vllm", hf_dir))
    runs = pythons([(WORKERS / "hf_logprobs.py", mode, *args, tmp_path / f"{mode}.json") for mode, *args in modes]
                   + [(ROOT / "launch" / "convert.py", ckpt, tmp_path / "converted")])
    for (mode, *_), proc in zip(modes, runs):
        assert proc.returncode == 0, proc.stderr[-4000:]
        logprobs[mode] = json.loads((tmp_path / f"{mode}.json").read_text())["logprobs"]
    for mode in ("hf", "vllm"):
        diff = max(abs(a - b) for x, y in zip(logprobs["trainer"], logprobs[mode]) for a, b in zip(x, y))
        # transformers runs the trainer's own forward on the same weights (0.0 by construction, 1e-5 to spare);
        # vLLM runs other kernels: the engine bound (conftest.ENGINE_BOUND; measured 3.8e-6)
        assert diff < (1e-5 if mode == "hf" else ENGINE_BOUND), (mode, diff)
    trained, initial = load_file(hf_dir / "model.safetensors"), load_file(tiny.model_dir() / "model.safetensors")
    assert trained.keys() == initial.keys()
    assert max((trained[k] - initial[k]).abs().max().item() for k in trained) > 1e-5  # 4 steps moved it

    assert runs[-1].returncode == 0, runs[-1].stderr[-4000:]  # launch/convert.py
    for f in hf_dir.iterdir():
        assert (tmp_path / "converted" / f.name).read_bytes() == f.read_bytes(), f.name


NAN_RECIPE = '''
import os
from dataclasses import dataclass
from pathlib import Path

from rlcore.algorithms.grpo import GRPO
from rlcore.config.cli import load_recipe


@dataclass
class NaNAtSteps(GRPO):
    """GRPO whose loss is NaN at the chosen steps of this process (advantages() runs once per step)."""
    nan_steps: str = os.environ.get("RLCORE_NAN_STEPS", "2,4,5")
    step: int = 0

    def advantages(self, *args, **kwargs):
        self.step += 1
        return super().advantages(*args, **kwargs)

    def loss(self, *args, **kwargs):
        loss, metrics = super().loss(*args, **kwargs)
        if str(self.step) in self.nan_steps.split(","):
            loss = loss + float("nan")
        return loss, metrics


def config():
    cfg = load_recipe("demo", Path(ROOT) / "recipes")
    cfg.algorithm = NaNAtSteps()
    return cfg
'''


def test_non_finite_steps_are_skipped_and_stop_the_run(tmp_path):
    """NaN loss at steps 2, 4, 5 with train.max_skipped_steps=2: each is counted and not applied (the
    exported weights stay bit for bit, the engine keeps matching the trainer); the run stops at step 5."""
    recipe = tmp_path / "nan_grpo.py"
    recipe.write_text(f"ROOT = {str(ROOT)!r}\n" + NAN_RECIPE)
    proc = train_warm(f"recipe={recipe}", f"output_dir={tmp_path}", "train.steps=6", "train.export_every=1",
                      "train.max_skipped_steps=2", "optim.warmup_steps=0", *SMALL)
    assert rank_exit_codes(proc) == {3}, proc.stderr[-4000:]
    assert ("rlcore: error: 2 steps in a row had a non-finite loss or gradient (train.max_skipped_steps=2); "
            "stopped at step 5") in proc.stderr
    rows = read_metrics(tmp_path / "demo")
    assert [r["train/skipped_steps"] for r in rows] == [0, 1, 1, 2, 3]
    assert [r["optim/steps_applied"] for r in rows] == [1, 0, 1, 0, 0]
    assert all(r["rollout/logprob_diff_max"] < 1e-3 for r in rows)  # the engine always held the policy
    weights = {s: (tmp_path / "demo" / "hf" / f"step_{s}" / "model.safetensors").read_bytes() for s in (1, 2, 3, 4)}
    assert weights[2] == weights[1] and weights[3] != weights[2] and weights[4] == weights[3]
    assert not (tmp_path / "demo" / "hf" / "step_5").exists()


def test_bad_resume_paths_fail_before_training(entry, straight, tmp_path):
    """Missing, incomplete, another model, another recipe's algorithm: exit 2, one line naming it."""
    ckpt = straight / "checkpoints" / "step_4"
    partial = tmp_path / "step_9"
    partial.mkdir()
    (partial / ".metadata").write_text("")
    recipe = tmp_path / "nan_grpo.py"
    recipe.write_text(f"ROOT = {str(ROOT)!r}\n" + NAN_RECIPE)
    cases = [
        (["recipe=demo", f"resume={tmp_path}/nope"], f"resume='{tmp_path}/nope' does not exist"),
        (["recipe=demo", f"resume={partial}"], f"resume='{partial}' is not a complete checkpoint (no COMPLETE.json"),
        (["recipe=demo", f"resume={ckpt}", f"model.path={straight}/hf/step_4"],
         f"was saved by a run with model.path '"),
        ([f"recipe={recipe}", f"resume={ckpt}"],
         "was saved by a run with algorithm 'rlcore.algorithms.grpo.GRPO', but this run has algorithm '"),
    ]
    for args, expected in cases:
        proc = entry.train(*args, f"output_dir={tmp_path}/out")
        lines = [line for line in proc.stderr.splitlines() if line.startswith("rlcore: error:")]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
        assert expected in lines[0], lines[0]
    assert not (tmp_path / "out").exists()
    # A resume of a run already at train.steps has nothing to do: one line, exit 0, before anything loads (the
    # checkpoint and the run folder untouched); fewer steps than the checkpoint's is the same.
    end = straight / "checkpoints" / "step_4"
    files = {f: f.read_bytes() for f in sorted(straight.rglob("*")) if f.is_file()}
    for steps in (4, 3):
        proc = entry.train(*RUN, f"train.steps={steps}", f"output_dir={straight.parent}", "resume=auto")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout == (f"rlcore: run 'demo' is complete: checkpoint {end} is at step 4 (train.steps={steps}); "
                               f"its export is {straight / 'hf' / 'step_4'}. Raise train.steps to train longer\n")
    assert {f: f.read_bytes() for f in sorted(straight.rglob("*")) if f.is_file()} == files


def test_stop_signal_records_sigterm_and_sigusr1():
    from rlcore.outputs.checkpoint import StopSignal

    stop = StopSignal()
    try:
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            os.kill(os.getpid(), sig)
            assert stop.received == sig
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


# With token-budget packing: the rows have holes (observation tokens) and packing must keep resume exact.
MULTI_TURN = ("recipe=reinforce_pp_tiny", *RUN[1:], "rollout.env=tests/envs/plumbing.py:Retry",
              "rollout.max_total_tokens=16", "train.max_tokens_per_micro_batch=64")


@pytest.mark.slow
def test_multi_turn_kill_then_resume_is_exact_once(tmp_path):
    """Two-turn rollouts (REINFORCE++, returns carried across the observation), packed into 64-token
    micro-batches: a rank SIGKILLed in step 3
    and resume=auto log the same numbers at every step, and export the same bytes, as the run straight
    through. Turn seeds derive from (run seed, step, trajectory, turn), so nothing depends on process state."""
    proc = train_warm(*MULTI_TURN, f"output_dir={tmp_path / 'straight'}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    straight = tmp_path / "straight" / "reinforce_pp_tiny"
    proc = torchrun(WORKERS / "faults.py", *MULTI_TURN, f"output_dir={tmp_path}",
                    env={"KILL_RANK": "0", "KILL_AT_UPDATE": "3"})
    assert -9 in rank_exit_codes(proc), proc.stderr[-4000:]
    proc = train_warm(*MULTI_TURN, f"output_dir={tmp_path}", "resume=auto")
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "reinforce_pp_tiny"
    ours, theirs = read_metrics(run), read_metrics(straight)
    assert [r["step"] for r in ours] == [1, 2, 3, 4] and ours == theirs
    assert all(r["env/turns_mean"] == 2.0 and r["rollout/logprob_diff_max"] < 1e-4 for r in ours)
    weights = "hf/step_4/model.safetensors"
    assert (run / weights).read_bytes() == (straight / weights).read_bytes()
