"""torchrun worker: launch/train.py with the weight sync deliberately skipped (fault injection).

The engine keeps sampling with the initial weights while the trainer moves on; the per-step
logprob check must stop the run. Arguments are passed to launch/train.py unchanged. The sync is put back after the
run: the shared launch (tests/conftest.py torchrun_warm) runs it too.
"""
import os
import runpy
import sys
from pathlib import Path

from rlcore.engine import rollout_engine as engine

sync_weights = engine.RolloutEngine.sync_weights
engine.RolloutEngine.sync_weights = lambda self, model: engine.SyncStats(0.0, 0, 0)
entry = runpy.run_path(str(Path(__file__).resolve().parents[2] / "launch" / "train.py"))  # main(), not its exit
try:
    code = entry["main"](sys.argv[1:])
finally:  # the shared launch (tests/workers/run_server.py) runs the next run in this process: with its sync
    engine.RolloutEngine.sync_weights = sync_weights
sys.exit(code) if os.environ.get("RLCORE_SHARED_LAUNCH") else entry["leave"](code)
