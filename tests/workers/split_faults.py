"""torchrun worker: launch/train.py in a split mesh with the weight transfer broken on purpose (fault injection).

RLCORE_FAULT=skip: from the second transfer on, the engines drain the received weights without loading them
(a skipped transfer: they keep sampling with older weights). RLCORE_FAULT=corrupt: from the second transfer on,
one received tensor (the first of each transfer) arrives scaled by 1.01 (a corrupted unit). Either way the
probe check after the transfer must stop the run. RLCORE_FAULT_RANK=r: only rank r's engine is broken (the others
load what was sent). Arguments are passed to launch/train.py unchanged. The load is put back after the run: the
shared launch (tests/conftest.py torchrun_warm) runs it too.
"""
import os
import runpy
import sys
from pathlib import Path

from rlcore.engine import rollout_engine as engine

FAULT = os.environ["RLCORE_FAULT"]
load = engine.RolloutEngine.load
transfers = [0]


def broken_load(self, weights):
    transfers[0] += 1
    if transfers[0] < 2 or os.environ.get("RLCORE_FAULT_RANK", os.environ["RANK"]) != os.environ["RANK"]:
        return load(self, weights)
    if FAULT == "skip":
        for _ in weights:
            pass
        return None

    def corrupted():
        for i, (name, tensor) in enumerate(weights):
            yield name, tensor * 1.01 if i == 0 else tensor
    return load(self, corrupted())


engine.RolloutEngine.load = broken_load
entry = runpy.run_path(str(Path(__file__).resolve().parents[2] / "launch" / "train.py"))  # main(), not its exit
try:
    code = entry["main"](sys.argv[1:])
finally:  # the shared launch (tests/workers/run_server.py) runs the next run in this process: with its own load
    engine.RolloutEngine.load = load
sys.exit(code) if os.environ.get("RLCORE_SHARED_LAUNCH") else entry["leave"](code)
