"""torchrun worker: launch/train.py with the weight sync deliberately skipped (fault injection).

The engine keeps sampling with the initial weights while the trainer moves on; the per-step
logprob check must stop the run. Arguments are passed to launch/train.py unchanged.
"""
import runpy
import sys
from pathlib import Path

from rlcore.engine import rollout_engine as engine

engine.RolloutEngine.sync_weights = lambda self, model: engine.SyncStats(0.0, 0, 0)
train_py = Path(__file__).resolve().parents[2] / "launch" / "train.py"
sys.argv = [str(train_py), *sys.argv[1:]]
runpy.run_path(str(train_py), run_name="__main__")
