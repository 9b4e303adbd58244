"""Streaming's deterministic load point: version v loads `lag` engine steps after batch v is handed over
(rollout.load_lag_steps), or with auto at the earliest point while it measures, then at the lag it fixes. The
Engine (rlcore/modes/stream/engine_side.py) asks `due()` at each step boundary; this file holds what the lag is,
how auto measures and fixes it, and what a checkpoint keeps of it.
"""
from __future__ import annotations

import math

import torch.distributed as dist

from rlcore.distributed.collectives import all_max

CALIBRATE = 2  # rollout.load_lag_steps=auto: versions 1..CALIBRATE load at the earliest point while it measures
MARGIN = 1.25  # ... and the lag it fixes covers the trainers' step x MARGIN (a longer batch, a slower step)


class LoadLag:
    """The lag from hand-over v to the load of version v, in engine steps (turns.tick); None while auto measures.
    free_loads: unused (each version loads on arrival)."""

    def __init__(self, rollout, ranks: int):
        self.ranks = ranks  # the rollout ranks (tensor parallelism: an engine's ranks must agree on the lag)
        self.measuring = rollout.load_lag_steps == "auto" and not rollout.free_loads
        self.lag = None if rollout.load_lag_steps == "auto" else rollout.load_lag_steps
        self.handed_at = 0  # turns.tick at the last hand-over
        self.steps: list[float] = []  # auto: each engine step's time while it measures
        self.ready_s = 0.0  # auto: the trainers' slowest step so far

    @property
    def fixed(self) -> bool:
        return self.lag is not None

    def handed(self, tick: int) -> None:
        self.handed_at = tick

    def stepped(self, took: float) -> None:
        if self.measuring and self.lag is None:
            self.steps.append(took)

    def due(self, tick: int) -> bool:
        return tick - self.handed_at >= self.lag

    def loaded(self, v: int, ready_s: float) -> None:
        """At the load of version v: the trainers' time for it; auto fixes the lag at load CALIBRATE."""
        self.ready_s = max(self.ready_s, ready_s)
        if self.measuring and self.lag is None and v >= CALIBRATE:
            self.fix(v)

    def fix(self, v: int) -> None:
        """rollout.load_lag_steps=auto, at load CALIBRATE: the lag is the trainers' slowest step so far (their time
        from taking a batch to having its version ready) in this engine's fast steps (the first quartile: a step
        with fewer sequences costs less, on a CPU much less, and the lag must cover the trainers then too), times
        MARGIN; the largest over the rollout ranks (an engine's ranks must agree). Fixed for the rest of the run
        and saved in its checkpoints (a resume loads at the same steps)."""
        steps = sorted(self.steps) or [1.0]
        step_s = steps[len(steps) // 4]
        lag = math.ceil(MARGIN * self.ready_s / max(step_s, 1e-6))
        self.lag = int(all_max(lag)) if self.ranks > 1 else lag
        if dist.get_rank() == 0:
            print(f"rlcore: rollout.load_lag_steps=auto: each version loads {self.lag} engine steps after its batch is "
                  f"handed over (trainer step {self.ready_s:.3f} s / engine step {step_s:.4f} s, first quartile, x "
                  f"{MARGIN}, measured over versions 1-{v}; rollout.load_lag_steps={self.lag} uses it from version 1)",
                  flush=True)

    def metrics(self, ticks: int) -> dict[str, float]:
        """At a load `ticks` engine steps after its hand-over."""
        return {"stream/load_lag": ticks, "stream/lag_steps": -1 if self.lag is None else self.lag}

    def state(self):
        return self.lag

    def restore(self, lag) -> None:
        if self.lag is None and lag is not None:  # auto: the lag this run fixed before the checkpoint
            self.lag = lag
            if dist.get_rank() == 0:
                print(f"rlcore: rollout.load_lag_steps=auto: {self.lag} engine steps, as the run fixed it before its "
                      f"checkpoint", flush=True)
