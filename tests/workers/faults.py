"""torchrun worker: launch/train.py with a fault injected (tests/test_checkpoint.py).

    KILL_RANK=1 KILL_AT_UPDATE=3 torchrun --nproc-per-node 2 tests/workers/faults.py recipe=demo ...

Rank KILL_RANK sends itself SIGKILL inside its KILL_AT_UPDATE-th update (after that step's rollout,
before its optimizer step): a rank dying mid-step. With STALL_AT_EXIT_RANK=R instead, rank R finishes the run and
then never reaches the exit (tests/test_watchdog.py). Arguments are passed to launch/train.py unchanged.
"""
import os
import runpy
import signal
import sys
import time
from pathlib import Path

from rlcore import trainer
from rlcore.train import update as update_stage

update, calls, train = update_stage.update, [0], trainer.train


def dying_update(run, batch, **kwargs):
    calls[0] += 1
    if calls[0] == int(os.environ["KILL_AT_UPDATE"]) and int(os.environ["RANK"]) == int(os.environ["KILL_RANK"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return update(run, batch, **kwargs)


def stalling_train(cfg):
    summary = train(cfg)
    if int(os.environ["RANK"]) == int(os.environ["STALL_AT_EXIT_RANK"]):
        Path(os.environ["STALL_MARK"]).write_text(str(time.time()))
        while True:  # in no stage: the other ranks wait for this one in the exit's barrier
            time.sleep(0.1)
    return summary


if "STALL_AT_EXIT_RANK" in os.environ:
    trainer.train = stalling_train  # launch/train.py imports it from rlcore.trainer when it runs, below
else:
    update_stage.update = dying_update
train_py = Path(__file__).resolve().parents[2] / "launch" / "train.py"
sys.argv = [str(train_py), *sys.argv[1:]]
runpy.run_path(str(train_py), run_name="__main__")
