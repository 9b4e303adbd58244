"""Streaming's deterministic load point: when version v loads after batch v is handed over. The Engine
(rlcore/modes/stream/engine_side.py) asks `due()` at each step boundary; this file holds what the lag is, how
rollout.load_lag_steps=auto measures and fixes it, and what a checkpoint keeps of it.

The lag is a budget that each engine step spends: `base` + `per_seq` x the sequences it runs (whole numbers, so
every rank of an engine and every run of a config adds the same). A fixed rollout.load_lag_steps=N is base 1,
per_seq 0, budget N: N engine steps. auto fixes base and per_seq in microseconds of a step's predicted time and
the budget at MARGIN x the trainers' step: the version loads when the engine's steps since the hand-over are
predicted to have taken that long. On a GPU a decode step costs about the same at 8 or 256 sequences (per_seq
~0: a count of steps); on a CPU it grows with them, and a count of steps measured at one occupancy is too long
or too short at another.

Why the median step at each count, not the mean: what a step costs beyond its count is the prefill it also does,
which the count does not see. Over the first versions that is the start's burst of fresh prompts, later the turns'
contexts; the mean carries the first into the rest (at 64 sequences of the long-tail benchmark it predicted 1.55x
the steps' time and the engine froze 6-8% of its wall time), the median leaves both out and predicts 1.04-1.18x there
and 0.71x at 16 sequences, where the turns' prefills are a third of the time: within the margin at 64 (frozen
0.9-1.4%), and a lag that lasts longer than its budget at 16, which costs occupancy (85-89%), not a freeze.
(benchmarks/RESULTS.md, "auto's lag in predicted engine time", also has the predictors tried and not kept.)
"""
from __future__ import annotations

import math
import statistics

import torch.distributed as dist

from rlcore.distributed.collectives import all_max, all_min

CALIBRATE = 2  # rollout.load_lag_steps=auto: versions 1..CALIBRATE load at the earliest point while it measures
MARGIN = 1.25  # ... and the lag it fixes covers the trainers' step x MARGIN (a longer batch, a slower step)
US = 1e6  # auto's budget is in microseconds of predicted engine time


class LoadLag:
    """The lag from hand-over v to the load of version v: `cost` = (base, per_seq, budget), None while auto
    measures. free_loads: unused (each version loads on arrival)."""

    def __init__(self, rollout, ranks: int):
        self.ranks = ranks  # the rollout ranks (tensor parallelism: an engine's ranks must agree on the lag)
        self.auto = rollout.load_lag_steps == "auto"
        self.measuring = self.auto and not rollout.free_loads
        self.cost = None if self.auto else (1, 0, rollout.load_lag_steps)
        self.in_steps = not self.auto  # the budget's unit: engine steps, or auto's microseconds
        self.handed_at, self.spent = 0, 0  # turns.tick at the last hand-over; the budget spent since
        self.samples: list[tuple[int, float]] = []  # auto: (running sequences, seconds) of each step while it measures
        self.ready_s = 0.0  # auto: the trainers' slowest step since the first (which warms up: compiles, allocates)

    @property
    def fixed(self) -> bool:
        return self.cost is not None

    def handed(self, tick: int) -> None:
        self.handed_at, self.spent = tick, 0

    def stepped(self, ticks: int, running: int, took: float | None = None) -> None:
        """The engine's clock moved `ticks` steps: one engine step of `running` sequences that took `took` s (with
        the decisions at its boundary: what passes while the trainers train), or a jump to the next join with
        nothing to decode (took None). A lag in steps counts the jump's steps; auto's lag in time charges it
        nothing (how long the environments take is not the engine's to predict: the lag only lasts longer)."""
        if self.cost is not None:
            base, per_seq, _ = self.cost
            if self.in_steps:
                self.spent += ticks
            elif took is not None:
                self.spent += base + per_seq * running
        elif self.measuring and took is not None:
            self.samples.append((running, took))

    def due(self) -> bool:
        return self.spent >= self.cost[2]

    def loaded(self, v: int, ready_s: float) -> None:
        """At the load of version v: the trainers' time for it (from the second on: the first step's one-time costs
        are not a step's); auto fixes the lag at load CALIBRATE."""
        if v > 1:
            self.ready_s = max(self.ready_s, ready_s)
        if self.measuring and self.cost is None and v >= CALIBRATE:
            # measured steps and a trainers' step on every rollout rank (a run resumed from a checkpoint of step 1
            # may load version 2 before any step: it measures on)
            ready = int(bool(self.samples) and self.ready_s > 0)
            if (ready if self.ranks == 1 else all_min(ready)) > 0:
                self.fix(v)

    def fix(self, v: int) -> None:
        """rollout.load_lag_steps=auto, at load CALIBRATE: a step's time as base + per_seq x its sequences, fitted
        to the median step time at each count measured so far (weighted by how often the count ran), and the
        budget MARGIN x
        the trainers' slowest step so far but the first (from taking a batch to having its version ready). Over
        the rollout ranks (an engine's ranks must agree) the smallest base and per_seq and the largest budget: the
        longest lag any of them measured. Fixed for the rest of the run and saved in its checkpoints (a resume
        loads at the same steps)."""
        base, per_seq = step_model(self.samples)
        cost = (max(round(base * US), 1), round(per_seq * US), math.ceil(MARGIN * self.ready_s * US))
        if self.ranks > 1:
            cost = (int(all_min(cost[0])), int(all_min(cost[1])), int(all_max(cost[2])))
        self.cost = cost
        if dist.get_rank() == 0:
            print(f"rlcore: rollout.load_lag_steps=auto: each version loads once the engine steps since its batch was "
                  f"handed over are predicted to have taken {cost[2] / US:.3f} s (the trainers' step "
                  f"{self.ready_s:.3f} s x {MARGIN}; an engine step {cost[0] / 1e3:.2f} ms + {cost[1] / 1e3:.3f} ms a "
                  f"running sequence, fitted to versions 1-{v}'s steps), or earlier with nothing in flight; "
                  f"stream/load_lag logs the engine steps each load came after", flush=True)

    def at_load(self, tick: int) -> tuple[int, int | None]:
        """What the metrics of a load report: the engine steps since its hand-over and the budget they spent (None
        while auto measures: that load came at the earliest point, nothing was spent)."""
        return tick - self.handed_at, self.spent if self.cost is not None else None

    def metrics(self, ticks: int, spent: int | None) -> dict[str, float]:
        """Of a load (`at_load`), logged after it: its engine steps after the hand-over; a lag in steps (-1 with
        auto's lag in time); auto's budget (from the load that fixes it) and what the steps before the load had
        spent of it, in seconds of predicted engine time (-1 otherwise)."""
        timed = self.cost is not None and not self.in_steps
        return {"stream/load_lag": ticks, "stream/lag_steps": self.cost[2] if self.in_steps else -1,
                "stream/lag_s": self.cost[2] / US if timed else -1,
                "stream/lag_spent_s": spent / US if timed and spent is not None else -1}

    def state(self) -> dict | None:
        return None if self.cost is None else {"cost": self.cost, "in_steps": self.in_steps}

    def restore(self, state) -> None:
        if self.cost is None and state is not None:  # auto: the lag this run fixed before the checkpoint
            if isinstance(state, int):  # a checkpoint saved before the step model: a lag in engine steps
                state = {"cost": (1, 0, state), "in_steps": True}
            self.cost, self.in_steps = tuple(state["cost"]), state["in_steps"]
            if dist.get_rank() == 0:
                print(f"rlcore: rollout.load_lag_steps=auto: {self.describe()}, as the run fixed it before its "
                      f"checkpoint", flush=True)

    def describe(self) -> str:
        base, per_seq, budget = self.cost
        if self.in_steps:
            return f"{budget} engine steps"
        return f"{budget / US:.3f} s of predicted engine time ({base / 1e3:.2f} ms + {per_seq / 1e3:.3f} ms a sequence)"


def step_model(samples: list[tuple[int, float]]) -> tuple[float, float]:
    """(base, per_seq) seconds of a least-squares line through the median step time at each running count,
    weighted by the count's steps; a slope below 0 is taken as 0, an intercept below 0 as 0."""
    by: dict[int, list[float]] = {}
    for running, took in samples:
        by.setdefault(running, []).append(took)
    if not by:
        return 1.0, 0.0
    points = [(n, statistics.median(ts), len(ts)) for n, ts in by.items()]
    total = sum(w for _, _, w in points)
    n_mean = sum(n * w for n, _, w in points) / total
    t_mean = sum(t * w for _, t, w in points) / total
    spread = sum(w * (n - n_mean) ** 2 for n, _, w in points)
    per_seq = max(sum(w * (n - n_mean) * (t - t_mean) for n, t, w in points) / spread, 0.0) if spread else 0.0
    return max(t_mean - per_seq * n_mean, 0.0), per_seq
