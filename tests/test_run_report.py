"""What a run tells its user: the launch-time plan check and the summary of a stopped run. (Measured memory
next to the plan, the summary of a finished run, the wandb mirror and the log-file lines are checked on the
demo's own run: tests/test_train.py.)"""
import pytest

import hub_configs
from conftest import rank_exit_codes, train_cmd, train_warm
from test_plan import SHAPE_72B, model_dir

pytestmark = pytest.mark.slow  # real torchrun processes and vLLM engines: `make test-fast` leaves them out

# Measured peak / plan on the tiny CPU demo was 0.87 for both phases (2 ranks, 2-core machine): the plan
# counts the whole KV cache (vLLM on CPU does not touch all of it) and 1 GB of process runtime per rank.
PLAN_FACTOR = 1.5


def test_launch_check_stops_a_run_that_does_not_fit_before_any_engine(tmp_path):
    big = model_dir(tmp_path, "q72", SHAPE_72B)  # config.json only: the run must stop before it needs weights
    proc = train_warm("recipe=demo", "prepare=", f"model.path={big}", f"output_dir={tmp_path}/runs", timeout=300)
    assert rank_exit_codes(proc) == {2}, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("rlcore: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    line = lines[0]
    assert line.startswith("rlcore: error: the launch plan does not fit: the TRAIN bar needs "), line
    assert "GB over the" in line and "levers: " in line and "(plan.strict=false runs it anyway)" in line
    assert "cpu_worker" not in proc.stdout + proc.stderr, "no engine (vLLM's CPU worker) may start"
    assert not (tmp_path / "runs").exists()
    # plan.strict=false: the plan no longer stops it; the next check does (this folder has no weights)
    loose = train_warm("recipe=demo", "prepare=", f"model.path={big}", "plan.strict=false",
                       f"output_dir={tmp_path}/runs", timeout=300)
    assert rank_exit_codes(loose) == {2}
    assert "has no weights" in loose.stderr and "the launch plan does not fit" not in loose.stderr


def test_launch_check_stops_a_mixture_of_experts_that_does_not_fit(tmp_path):
    """Qwen3-30B-A3B (config.json only): its 30.5B parameters with all their experts overflow two CPU ranks' host;
    one line names the bar, exit 2, no engine, no run folder."""
    moe = hub_configs.model_dir(tmp_path, "Qwen/Qwen3-30B-A3B")
    proc = train_warm("recipe=demo", "prepare=", f"model.path={moe}", f"output_dir={tmp_path}/runs", timeout=300)
    assert rank_exit_codes(proc) == {2}, proc.stderr[-3000:]
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("rlcore: error:")]
    assert line.startswith("rlcore: error: the launch plan does not fit: the TRAIN bar needs "), line
    # fp32 weights, grads and AdamW alone are 16 bytes x 30.5B (455 GiB) on the host the two ranks share (the
    # engines' weights come on top); a plan that missed the experts would count a tenth of it
    assert float(line.split("the TRAIN bar needs ")[1].split(" GB")[0]) > 16 * 30_532_122_624 / 2**30
    assert "cpu_worker" not in proc.stdout + proc.stderr and not (tmp_path / "runs").exists()


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
