"""torchrun worker: launch/train.py with a fault injected (tests/test_checkpoint.py).

    KILL_RANK=1 KILL_AT_UPDATE=3 torchrun --nproc-per-node 2 tests/workers/faults.py recipe=demo ...

Rank KILL_RANK sends itself SIGKILL inside its KILL_AT_UPDATE-th update (after that step's rollout,
before its optimizer step): a rank dying mid-step. Arguments are passed to launch/train.py unchanged.
"""
import os
import runpy
import signal
import sys
from pathlib import Path

from rlcore.train import update as update_stage

update, calls = update_stage.update, [0]


def dying_update(run, batch, **kwargs):
    calls[0] += 1
    if calls[0] == int(os.environ["KILL_AT_UPDATE"]) and int(os.environ["RANK"]) == int(os.environ["KILL_RANK"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return update(run, batch, **kwargs)


update_stage.update = dying_update
train_py = Path(__file__).resolve().parents[2] / "launch" / "train.py"
sys.argv = [str(train_py), *sys.argv[1:]]
runpy.run_path(str(train_py), run_name="__main__")
