"""torchrun worker: launch/train.py in streaming mode (rlcore/modes/stream/engine_side.py) with its timing or its ranks disturbed.

    SLOW=trainer:0.3 DUMP=/tmp/batches torchrun --nproc-per-node 2 tests/workers/stream_worker.py recipe=demo ...

SLOW=trainer:S sleeps S seconds in every trainer step (the engine waits at its loads); SLOW=engine:S sleeps S
seconds in every engine step (the trainers wait for batches). DUMP=dir: the trainer rank writes each step's
batch (tokens, engine logprobs, per-token versions) to dir/batch_<t>.pt. KILL_RANK=r KILL_AT_STEP=t: rank r
sends itself SIGKILL in step t's training. TERM_AT_VERSION=v: the engine's first rank (alone, with tensor
parallelism) sends itself SIGTERM at its first engine step holding version v with environment calls in flight
(single-turn: requests; it says how many on stderr; TERM_STAMP=file: the time.time() it sent it). Arguments are passed
to launch/train.py unchanged. The disturbances are undone after the run: the shared launch (tests/conftest.py
torchrun_warm) runs it too.
"""
import os
import runpy
import signal
import sys
import time
from pathlib import Path

import torch

from rlcore.modes.stream import engine_side as stream, trainer_side as stream_trainer

slow_side, _, seconds = os.environ.get("SLOW", ":0").partition(":")
train_step, engine_step = stream_trainer.train_step, stream.Engine.step


def disturbed_train_step(run, batch, t, k):
    if int(os.environ["RANK"]) == int(os.environ.get("KILL_RANK", -1)) and t == int(os.environ["KILL_AT_STEP"]):
        os.kill(os.getpid(), signal.SIGKILL)
    if slow_side == "trainer":
        time.sleep(float(seconds))
    if os.environ.get("DUMP") and int(os.environ["RANK"]) == 1:
        Path(os.environ["DUMP"]).mkdir(parents=True, exist_ok=True)
        torch.save({"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                    "loss_mask": batch.loss_mask, "rollout_logprobs": batch.rollout_logprobs,
                    "token_versions": batch.token_versions}, Path(os.environ["DUMP"]) / f"batch_{t}.pt")
    return train_step(run, batch, t, k)


def slow_engine_step(self):
    time.sleep(float(seconds))
    self.began = time.perf_counter()  # outside the step time rollout.load_lag_steps=auto measures
    return engine_step(self)


def signalled_engine_step(self):
    flying = self.turns.due if self.turns.multi else self.turns.live
    if self.lead and self.run.engine.version >= int(os.environ["TERM_AT_VERSION"]) and flying and \
            not self.stop.received:
        what = "environment calls" if self.turns.multi else "requests"
        print(f"stream_worker: SIGTERM with {len(flying)} {what} in flight", file=sys.stderr, flush=True)
        Path(os.environ.get("TERM_STAMP", os.devnull)).write_text(str(time.time()))
        os.kill(os.getpid(), signal.SIGTERM)
    return engine_step(self)


stream_trainer.train_step = disturbed_train_step
if slow_side == "engine":
    stream.Engine.step = slow_engine_step
if os.environ.get("TERM_AT_VERSION"):
    stream.Engine.step = signalled_engine_step
entry = runpy.run_path(str(Path(__file__).resolve().parents[2] / "launch" / "train.py"))  # main(), not its exit
try:
    code = entry["main"](sys.argv[1:])
finally:  # the shared launch (tests/workers/run_server.py) runs the next run in this process: undisturbed
    stream_trainer.train_step, stream.Engine.step = train_step, engine_step
# A launch of its own exits as launch/train.py does; in the shared launch the run ends here, the process goes on.
sys.exit(code) if os.environ.get("RLCORE_SHARED_LAUNCH") else entry["leave"](code)
