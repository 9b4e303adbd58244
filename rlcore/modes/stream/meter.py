"""Streaming's engine meter: what one engine did between two loads (Engine.step and Engine.load feed it; each load
logs it and starts it again). Shares and step counts, not seconds, are what carries from this machine to another."""
from __future__ import annotations

import time


class Meter:
    """The engine's steps since the previous load: running and held sequences, turns queued, busy, stepping and
    waiting time."""

    def __init__(self, max_running: int):
        self.max_running = max_running
        self.restart()

    def restart(self, now: float | None = None) -> None:
        self.steps = self.running = self.held = self.queued = self.running_max = 0
        self.busy_s = self.step_s = self.wait_s = self.frozen_s = 0.0
        self.t = time.perf_counter() if now is None else now

    def stepped(self, took: float, running: int, held: int, queued: int) -> None:
        """One engine step of `took` s: `running` sequences in the engine, `held` trajectories in flight, `queued`
        turns waiting for a free request at its end."""
        self.steps += 1
        self.running += running
        self.held += held
        self.queued += queued
        self.running_max = max(self.running_max, running)
        self.busy_s += took * running / self.max_running
        self.step_s += took

    def waited(self, s: float, flying: bool) -> None:
        """The engine waited `s` for weights at a load; with requests in flight (`flying`) it was frozen."""
        self.wait_s += s
        self.frozen_s += s if flying else 0.0

    def metrics(self) -> dict[str, float]:
        """Since the previous load (then it starts again): mean running sequences per engine step over
        rollout.max_running (the same in every run) and the most in one step, the slots held (trajectories in flight:
        running, or waiting for their environment's answer; above 1 with rollout.max_waiting), the turns queued for a
        free request a step, the running share weighted by wall time (stalls count as empty), the engine steps, the
        time waiting for weights and the share of wall time the engine was frozen (waiting with requests in flight),
        and the time in engine steps (time/collect_s: the engine side's busy time in the summary's split line)."""
        now = time.perf_counter()
        wall, steps = now - self.t, max(self.steps, 1)
        metrics = {"stream/occupancy": self.running / steps / self.max_running,
                   "stream/slots_held": self.held / steps / self.max_running,
                   "stream/running_max": self.running_max, "stream/queued": self.queued / steps,
                   "stream/engine_steps": self.steps, "async/dropped_samples": 0,
                   "throughput/occupancy_wall": self.busy_s / max(wall, 1e-9), "time/weights_wait_s": self.wait_s,
                   "throughput/frozen_share": self.frozen_s / max(wall, 1e-9),
                   "time/collect_s": self.step_s, "time/wall_s": wall}
        self.restart(now)
        return metrics
