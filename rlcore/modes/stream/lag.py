"""Streaming's deterministic load point: when version v loads after batch v is handed over. The Engine
(rlcore/modes/stream/engine_side.py) asks `due()` at each step boundary; this file holds what the lag is, how
rollout.load_lag_steps=auto measures and fixes it, and what a checkpoint keeps of it.

The lag is a budget that each engine step spends: a fixed rollout.load_lag_steps=N is N engine steps. auto's is
in nanoseconds of predicted engine time (whole numbers, so every rank of an engine and every run of a config adds
the same): a step of n running sequences that computes c tokens (vLLM's scheduler's count) spends
    decode(n) + per_token x max(c - n, 0)
where decode(n) = base + per_seq x n inside the counts it measured (lo..hi), decode(hi) above them, and
below lo a share n / lo of decode(lo). On a GPU a decode step costs about the same at 8 or 256 sequences
(per_seq ~0); on a CPU it grows with them, and a count of steps measured at one occupancy is too long or too short
at another.

The budget is the margin (rollout.load_lag_margin, 1.25) x the trainers' step: the version loads when the steps
since the hand-over are predicted to have taken that long. A margin too small freezes the engine whenever a
trainers' step runs long; a larger one costs where a batch's engine work outlasts the trainers' step but not the
lag: the next hand-over follows this load, and the engine, out of admissible work before it, drains, while the
trainers wait for the batch it holds. So once something waits for the version (Engine.waits: admission, a free slot
whose next trajectory needs it; or the next hand-over, its batch complete), a second, smaller margin holds
(rollout.load_lag_margin_blocked, 1.1): the version loads as soon as the trainers should be done. Both are data (the
schedule and the predicted time), so the load point stays the same in every run of a config.

A trainers' step grows with its batch's tokens, and they rise as a policy learns to answer at length
(benchmarks/async_rl.py's single-turn workload: 2512 -> 5384 tokens and 0.88 -> 1.93 s between steps 3 and
8, 0.35-0.37 ms a token), so version v's budget is the measured one x the tokens of batch v over those of the
batch it was measured on, and never less (a smaller batch's step keeps its fixed costs). The tokens are the
batch's own, prompts and responses of every engine's share: data, not timing.

Why these parts (benchmarks/RESULTS.md, "auto's lag with the step's prefill"): what a step costs beyond its count
is the prefill it also does, the turns' contexts and the start's fresh prompts, a third of the steps' time at 16
sequences of the long-tail benchmark. A step time at each count taken over all steps leaves the prefills out (it
predicted 0.62-0.76x the windows' time there: a lag that lasts longer than its budget, which costs occupancy); the
decode line through the steps with no prefill plus a prefill token's cost predicts 0.99x. Outside the counts
it measured a straight line is not safe: at max_running=64 the first versions run 16-64 sequences and the rest
mostly 8, and the line carried down to 8 predicted 1.19x the decode steps' time (a budget spent before the
trainers are done: a freeze). Charging those counts low leaves 0.96x.

Means, not medians (RESULTS.md, "auto's step model fitted to sums"): the budget is a sum of steps, so the model is
fitted to reproduce sums. A step's time is skewed: with an agent's tools answering in threads beside the engine,
the median decode step of 8 sequences took 4.2 ms and the mean 11.3 ms, and a line through medians predicted the
calibration's own steps x1.29 too fast (every later lag x1.20-1.26 longer than its budget: loads late, the next
batch's groups held back, deterministic loads x0.88 of free ones). Through means, with a prefill token charged at
its total over the tokens, the same steps predict 1.00x and the later ones 0.97x.
"""
from __future__ import annotations

import math
import statistics
from collections import deque

import torch.distributed as dist

from rlcore.distributed.collectives import all_max, all_min

CALIBRATE = 2  # rollout.load_lag_steps=auto: versions 1..CALIBRATE load at the earliest point while it measures
NS = 1e9  # auto's budget is in nanoseconds of predicted engine time
MEASURED = 10  # the counts of running sequences auto's decode line holds for: those it measured this many steps of
RECENT = 8  # auto's wall pace (what the early hand-over tells the trainers): over this many of the last steps


class LoadLag:
    """The lag from hand-over v to the load of version v. `cost`: None while auto measures; a fixed lag
    (1, 0, 0, 0, 0, N) in steps; auto's (base, per_seq, per_token, lo, hi, budget) in whole nanoseconds (the module
    docstring). free_loads: unused (each version loads on arrival)."""

    def __init__(self, rollout, ranks: int):
        self.ranks = ranks  # the rollout ranks (tensor parallelism: an engine's ranks must agree on the lag)
        self.margin = rollout.load_lag_margin  # auto: the budget over the trainers' slowest measured step
        self.blocked_margin = rollout.load_lag_margin_blocked  # auto: the same, once something waits for the version
        self.early = None  # auto: that budget in whole nanoseconds (None: a fixed lag, or a checkpoint saved before)
        self.auto = rollout.load_lag_steps == "auto"
        self.measuring = self.auto and not rollout.free_loads
        self.cost = None if self.auto else (1, 0, 0, 0, 0, rollout.load_lag_steps)
        self.in_steps = not self.auto  # the budget's unit: engine steps, or auto's nanoseconds
        self.handed_at, self.spent = 0, 0  # turns.tick at the last hand-over; the budget spent since
        self.taken = 0.0  # the measured seconds of the engine steps since the last hand-over (what spent predicts)
        self.recent: deque[tuple[float, int]] = deque(maxlen=RECENT)  # (seconds, spent) of the last engine steps
        # auto, while it measures: (running sequences, tokens computed, seconds) of each step
        self.samples: list[tuple[int, int, float]] = []
        self.ready_s = 0.0  # auto: the trainers' slowest step since the first (which warms up: compiles, allocates)
        # the tokens of the batch handed over last, of the batch that slowest step trained, and (auto, fixed) of
        # the batch the budget was measured on: the budget scales by tokens / ref when it is larger (0: it does not)
        self.tokens, self.ready_tokens, self.ref = 0, 0, 0

    @property
    def fixed(self) -> bool:
        return self.cost is not None

    def handed(self, tick: int, tokens: int = 0) -> None:
        """Batch v handed over at engine step `tick`; `tokens`: its prompts' and responses' (every engine's)."""
        self.handed_at, self.spent, self.tokens, self.taken = tick, 0, tokens, 0.0
        self.recent.clear()

    def stepped(self, ticks: int, running: int, computed: int = 0, took: float | None = None) -> None:
        """The engine's clock moved `ticks` steps: one engine step of `running` sequences that computed `computed`
        tokens and took `took` s (with the decisions at its boundary: what passes while the trainers train), or a
        jump to the next join with nothing to decode (took None). A lag in steps counts the jump's steps; auto's
        lag in time charges it nothing (how long the environments take is not the engine's to predict: the lag
        only lasts longer)."""
        self.taken += took or 0.0
        if self.cost is not None:
            if self.in_steps:
                self.spent += ticks
                if took is not None:
                    self.recent.append((took, 1))
            elif took is not None:
                cost = step_cost(self.cost, running, computed)
                self.spent += cost
                self.recent.append((took, cost))
        elif self.measuring and took is not None:
            self.samples.append((running, computed, took))

    def due(self, blocked: bool = False) -> bool:
        """The lag is spent; or, `blocked` (something waits for this version: Engine.waits), auto's budget at the
        blocked margin."""
        return self.spent >= self.budget() or (blocked and self.early is not None and self.spent >= self.budget(True))

    def left_ns(self, blocked: bool, step_ns: int) -> int | None:
        """What is left of this version's lag before `due`, in nanoseconds of predicted engine time (a lag in steps:
        its steps left x step_ns); None while auto measures (the load comes at the earliest point)."""
        if self.cost is None:
            return None
        left = self.budget() - self.spent
        if blocked and self.early is not None:
            left = min(left, self.budget(True) - self.spent)
        return left * step_ns if self.in_steps else left

    def left_wall_ns(self, blocked: bool, step_ns: int) -> int | None:
        """`left_ns` in wall time, at the pace the last RECENT engine steps since the hand-over kept: auto's predicted
        time (its step model was fitted on the first versions' steps; a machine's speed and a batch's shape move it:
        x0.86-1.40 over whole lags in one series on this CPU, and x3.97 over the last 0.2 s before one load against
        x1.29 since its hand-over), a fixed lag's steps left at their mean time (`step_ns`, the run's mean, before
        any). What the early hand-over tells the trainers; the load point itself stays data."""
        left = self.left_ns(blocked, step_ns)
        took, spent = sum(t for t, _ in self.recent), sum(c for _, c in self.recent)
        if left is None or spent <= 0 or took <= 0:
            return left
        if self.in_steps:
            return self.left_ns(blocked, round(took * NS / spent))
        return round(left * took * NS / spent)

    def budget(self, blocked: bool = False) -> int:
        """This version's lag: a fixed one's steps; auto's budget (at load_lag_margin_blocked once something waits for
        the version: `blocked`), scaled up by the batch's tokens over ref's."""
        budget = self.early if blocked and self.early is not None else self.cost[-1]
        return budget * self.tokens // self.ref if self.ref and self.tokens > self.ref else budget

    def loaded(self, v: int, ready_s: float) -> None:
        """At the load of version v: the trainers' time for it (from the second on: the first step's one-time costs
        are not a step's); auto fixes the lag at load CALIBRATE."""
        if v > 1 and ready_s > self.ready_s:
            self.ready_s, self.ready_tokens = ready_s, self.tokens
        if self.measuring and self.cost is None and v >= CALIBRATE:
            # measured steps and a trainers' step on every rollout rank (a run resumed from a checkpoint of step 1
            # may load version 2 before any step: it measures on)
            ready = int(bool(self.samples) and self.ready_s > 0)
            if (ready if self.ranks == 1 else all_min(ready)) > 0:
                self.fix(v)

    def fix(self, v: int) -> None:
        """rollout.load_lag_steps=auto, at load CALIBRATE: the step model fitted to the steps measured so far
        (`step_model`), the budget the margin x the trainers' slowest step so far but the first (from taking a batch to
        having its version ready), the same at the blocked margin, and ref, the tokens of the batch that step
        trained. Over the rollout ranks (an engine's ranks must agree) the smallest costs, the narrowest range of
        counts, the largest budgets and the smallest ref: the longest lag any of them measured. Fixed for the rest of
        the run and saved in its checkpoints (a resume loads at the same steps)."""
        base, per_seq, per_token, lo, hi = step_model(self.samples)
        cost = [max(round(base * NS), 1), round(per_seq * NS), round(per_token * NS), lo, hi,
                math.ceil(self.margin * self.ready_s * NS)]
        early, ref = math.ceil(self.blocked_margin * self.ready_s * NS), self.ready_tokens
        if self.ranks > 1:
            cost = [int(all_min(c)) for c in cost[:3]] + [int(all_max(lo)), int(all_min(hi)), int(all_max(cost[5]))]
            cost[4], early, ref = max(cost[4], cost[3]), int(all_max(early)), int(all_min(ref))
        self.cost, self.early, self.ref = tuple(cost), early, ref  # early <= cost[5]: config checks blocked <= margin
        if dist.get_rank() == 0:
            print(f"rlcore: rollout.load_lag_steps=auto: each version loads once the engine steps since its batch was "
                  f"handed over are predicted to have taken {cost[5] / NS:.3f} s (the trainers' step "
                  f"{self.ready_s:.3f} s x {self.margin}; {self.describe_step()}, fitted to versions 1-{v}'s "
                  f"steps), or {self.early / NS:.3f} s (x {self.blocked_margin}) once admission or the next "
                  f"hand-over waits for that version, x a batch's tokens / {ref} where it has more, or earlier with "
                  f"nothing in flight or to start; stream/load_lag logs the engine steps each load came after",
                  flush=True)

    def at_load(self, tick: int, blocked: bool = False) -> tuple[int, int | None, bool, float]:
        """What the metrics of a load report: the engine steps since its hand-over, the budget they spent (None
        while auto measures: that load came at the earliest point, nothing was spent), whether something waited
        for the version (Engine.waits) and the seconds those steps took."""
        return tick - self.handed_at, self.spent if self.cost is not None else None, blocked, self.taken

    def metrics(self, ticks: int, spent: int | None, blocked: bool = False, taken: float = 0.0) -> dict[str, float]:
        """Of a load (`at_load`), logged after it: its engine steps after the hand-over; a lag in steps (-1 with
        auto's lag in time); auto's budgets for this version (from the load that fixes it: at the margin, and at
        the blocked margin) and what the steps before the load had spent of them, in seconds of predicted engine
        time (-1 otherwise); whether something waited for the version at the load; the batch's tokens; and the
        seconds those steps took, measured (time/lag_taken_s over stream/lag_spent_s: how well auto's step model
        predicts this machine's steps)."""
        timed = self.cost is not None and not self.in_steps
        return {"time/lag_taken_s": taken, "stream/load_lag": ticks,
                "stream/lag_steps": self.cost[-1] if self.in_steps else -1,
                "stream/lag_s": self.budget() / NS if timed else -1,
                "stream/lag_blocked_s": self.budget(True) / NS if timed and self.early is not None else -1,
                "stream/lag_spent_s": spent / NS if timed and spent is not None else -1,
                "stream/load_blocked": int(blocked), "stream/batch_tokens": self.tokens}

    def state(self) -> dict | None:
        return None if self.cost is None else {"cost": self.cost, "in_steps": self.in_steps, "ref": self.ref,
                                               "tokens": self.tokens, "margin": self.margin, "early": self.early,
                                               "blocked": self.blocked_margin}

    def restore(self, state) -> None:
        if self.cost is None and state is not None:  # auto: the lag this run fixed before the checkpoint
            if isinstance(state, int):  # a checkpoint saved before the step model: a lag in engine steps
                state = {"cost": (1, 0, 0, 0, 0, state), "in_steps": True}
            cost = tuple(state["cost"])
            if len(cost) == 3:  # saved before the prefill term: (base, per_seq, budget) in microseconds
                cost = (1, 0, 0, 0, 0, cost[2]) if state["in_steps"] else \
                    (cost[0] * 1000, cost[1] * 1000, 0, 0, 2**62, cost[2] * 1000)
            self.cost, self.in_steps = cost, state["in_steps"]
            self.ref, self.tokens = state.get("ref", 0), state.get("tokens", 0)  # saved before the scaling: 0
            # saved before the blocked margin: no early budget (loads at the margin's, as that run's did)
            self.early = state.get("early")
            margin = state.get("margin", 1.25)  # saved before the margin was a setting: 1.25
            blocked = state.get("blocked", margin)
            other = "".join(f"; with {name}={was}, not this run's {now}" for name, was, now in (
                ("load_lag_margin", margin, self.margin), ("load_lag_margin_blocked", blocked, self.blocked_margin))
                if was != now)
            if dist.get_rank() == 0:
                print(f"rlcore: rollout.load_lag_steps=auto: {self.describe()}, as the run fixed it before its "
                      f"checkpoint{other} (a resume loads at the straight run's steps)", flush=True)

    def describe(self) -> str:
        if self.in_steps:
            return f"{self.cost[-1]} engine steps"
        scaled = f", x a batch's tokens / {self.ref} where it has more" if self.ref else ""
        early = f", {self.early / NS:.3f} s once something waits for the version" if self.early is not None else ""
        return f"{self.cost[-1] / NS:.3f} s of predicted engine time ({self.describe_step()}){early}{scaled}"

    def describe_step(self) -> str:
        base, per_seq, per_token, lo, hi, _ = self.cost
        return (f"an engine step {base / 1e6:.2f} ms + {per_seq / 1e6:.3f} ms a running sequence ({lo}-{hi} measured) "
                f"+ {per_token / 1e3:.1f} us a computed token beyond one a sequence")


def step_cost(cost: tuple[int, ...], running: int, computed: int) -> int:
    """What one engine step spends of auto's lag, in nanoseconds (the module docstring; whole numbers in, whole out)."""
    base, per_seq, per_token, lo, hi, _ = cost
    decode = base + per_seq * min(max(running, lo), hi)
    if running < lo:
        decode = decode * running // lo
    return decode + per_token * max(computed - running, 0)


def step_model(samples: list[tuple[int, int, float]]) -> tuple[float, float, float, int, int]:
    """(base, per_seq, per_token seconds, lo, hi) from (running, computed, seconds) steps. The decode line: least
    squares through the mean step time at each running count of the steps that computed one token a sequence
    (none prefilled), weighted by the count's steps; a slope below 0 is taken as 0, an intercept below 0 as 0.
    lo..hi: the counts it holds for, the smallest and largest with MEASURED such steps (else all measured). The
    prefill: the other steps' time beyond the line over their tokens beyond one a sequence, both summed (the
    module docstring: the model predicts sums)."""
    decoding = [(n, t) for n, c, t in samples if c <= n] or [(n, t) for n, _, t in samples]
    by: dict[int, list[float]] = {}
    for running, took in decoding:
        by.setdefault(running, []).append(took)
    if not by:
        return 1.0, 0.0, 0.0, 0, 0
    points = [(n, statistics.fmean(ts), len(ts)) for n, ts in by.items()]
    total = sum(w for _, _, w in points)
    n_mean = sum(n * w for n, _, w in points) / total
    t_mean = sum(t * w for _, t, w in points) / total
    spread = sum(w * (n - n_mean) ** 2 for n, _, w in points)
    per_seq = max(sum(w * (n - n_mean) * (t - t_mean) for n, t, w in points) / spread, 0.0) if spread else 0.0
    base = max(t_mean - per_seq * n_mean, 0.0)
    counts = [n for n, _, w in points if w >= MEASURED] or [n for n, _, _ in points]
    lo, hi = min(counts), max(counts)
    line = (base * NS, per_seq * NS, 0, lo, hi, 0)
    prefills = [(t - step_cost(line, n, n) / NS, c - n) for n, c, t in samples if c > n]
    per_token = max(sum(t for t, _ in prefills) / sum(c for _, c in prefills), 0.0) if prefills else 0.0
    return base, per_seq, per_token, lo, hi
