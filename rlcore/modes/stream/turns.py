"""Streaming's trajectories (the contract is rlcore/modes/stream/__init__.py's docstring): every sample of an admitted prompt group is
a rlcore.rollout.turns.Trajectory that runs turn by turn on its engine, across versions, with the tokens,
masks, seeds and ending rules of turns.py (each turn its own n=1 request seeded turn_seed(seed + j, turn), as in
rlcore/rollout/continuous.py, whose finish_turn ends a turn here too). Environments run on the engine's first rank,
on an EnvRunner (rollout.env_workers threads, rollout.env_timeout_s, rollout.turn_deadline_s, max_tool_calls).

When an environment's answer (reset or step) joins the engine, by rollout.schedule:
  lockstep (default): at a step fixed by the data and the config. A call started after engine step s (its
    trajectory admitted, or its turn ended, at s) joins at the boundary after engine step s + rollout.join_steps:
    tool latency hides behind that many engine steps, and a later answer makes the engine wait at that boundary
    (an idle engine goes straight to its next join). Answers due at one boundary join in (group, sample) order.
    Two runs log the same numbers and export the same bytes whatever the tools' latency.
  continuous: at the first boundary after it arrived; the engine waits only when it has nothing to decode. A
    slow tool holds up only its own trajectory, but which engine step a turn starts at, hence each token's
    version and the engine's batches, depends on tool latency: not reproducible, like continuous.py's batches.
What stays deterministic in both: the admission order, the seeds, every load point as a function of the engine's
state, the batches' rows and order, and staleness <= k. Wall clock enters in both through three limits only: a
call slower than rollout.env_timeout_s ends its trajectory (timed out, reward 0), rollout.trajectory_timeout_s
(continuous) cuts a trajectory running longer, and tools stop at rollout.turn_deadline_s; a run where one of
them fires is no longer reproducible. An environment that raises stops the run (every rank) at the next exchange.

A group is scored, its environments read (tool metrics) and closed as soon as its last trajectory ends; the
finished group then waits for its hand-over without its environments, so a checkpoint holds plain data.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from rlcore.batch import Batch
from rlcore.distributed.collectives import ALONE, RunError, all_sum, scoped
from rlcore.rollout.collect import close_envs, env_metrics, pad_id, score
from rlcore.rollout.continuous import POLL_S, cut, finish_turn
from rlcore.rollout.env import EnvRunner
from rlcore.rollout.tools import declared_tools, tool_stats
from rlcore.rollout.turns import (Trajectory, TurnStats, apply_reset, apply_step, env_outcome, start, to_batch)
from rlcore.rollout.turns import turn_seed

if TYPE_CHECKING:
    from rlcore.run import Run

Key = tuple[int, int]  # (group, sample)


class Turns:
    """The trajectories in flight on the streaming engine and the finished groups not yet handed over (every rank of
    the engine holds them; with tensor parallelism only the first runs environments and scores)."""

    def __init__(self, run: Run, cap: int | None = None):
        r, self.envs, self.run = run.cfg.rollout, run.rollout.envs, run
        self.max_new, self.max_total, self.temperature = r.max_new_tokens, r.max_total_tokens or r.max_new_tokens, \
            r.temperature
        self.size = r.group_size  # a group is scored once all its samples are admitted and ended
        self.join_steps, self.at_once, self.budget_s = r.join_steps, r.schedule == "continuous", \
            r.trajectory_timeout_s
        # tensor parallelism: the environments run, and groups are scored, on the engine's first rank (the lead);
        # every rank applies the same answers at the same boundary (rlcore/modes/stream/engine_side.py, Engine.sync)
        self.multi, self.tp_rank = self.envs.factory is not None, run.rollout.tp_rank
        self.runner = EnvRunner(self.envs.workers, min(self.envs.timeout_s, self.envs.turn_s),
                                self.envs.max_tool_calls) if self.multi and self.tp_rank == 0 else None
        self.flying: dict[Key, Trajectory] = {}  # admitted, not ended
        self.groups: dict[int, list[Trajectory]] = {}  # group -> its trajectories admitted so far, until scored
        self.done: dict[int, dict] = {}  # group -> scored (trajectories without environments, rewards, tools)
        self.live: dict[str, Key] = {}  # request id -> its trajectory, for requests in the engine
        self.caps: dict[Key, int] = {}  # each live request's token cap (whether a cut action is complete)
        self.due: dict[Key, int] = {}  # environment call in flight -> the engine step its answer joins after
        # rollout.max_waiting: at most `cap` requests in the engine (rollout.max_running; None: no cap, admission keeps
        # the trajectories within it); a turn ready beyond them waits here, in the order it became ready, for a
        # boundary with a free one: (trajectory, an agent's call or None)
        self.cap, self.queue = cap, []
        self.arrived: dict[Key, dict] = {}  # answers back, waiting for their step
        self.started: dict[Key, float] = {}  # when each trajectory was admitted (rollout.trajectory_timeout_s)
        self.tick = 0  # engine steps so far: the clock answers join by (nothing is in flight at a checkpoint)
        self.stats = TurnStats()
        self.error: str | None = None  # an environment raised: the run stops at the next exchange
        self.since = {"wait_s": 0.0, "calls": 0, "t": time.perf_counter()}  # since the last hand-over

    # ---- admission, turns, answers ----

    def admit(self, g: int, j: int, row: dict, seed: int) -> None:
        """Sample j of group g in flight from now: its first turn, or its reset."""
        key, x = self.start(g, j, row, seed)
        if not self.multi:
            self.send(key)
        else:
            if self.runner is not None:
                self.runner.submit(key, start, x, self.envs.factory)
            self.due[key] = self.tick + self.join_steps

    def start(self, g: int, j: int, row: dict, seed: int) -> tuple[Key, Trajectory]:
        """Sample j of group g (its seed: the group's + j) as a trajectory in flight, in its group."""
        key, x = (g, j), Trajectory(row["prompt_ids"], row, seed + j, 0)
        self.groups.setdefault(g, []).append(x)
        self.flying[key], self.started[key] = x, time.perf_counter()
        return key, x

    def send(self, key: Key, call=None) -> None:
        """A turn (an agent's call) into the engine, or into the queue while the engine runs `cap` requests or others
        wait before it."""
        if self.cap is not None and (self.queue or len(self.live) >= self.cap):
            self.queue.append((key, call))
        else:
            self.launch(key, call)

    def launch(self, key: Key, call) -> None:
        self.submit_turn(key, self.flying[key])

    def refill(self) -> None:
        """The queued turns, in order, into the requests the engine freed (at a boundary, before its answers join)."""
        while self.queue and len(self.live) < self.cap:
            self.launch(*self.queue.pop(0))

    def submit_turn(self, key: Key, x: Trajectory) -> None:
        turn, self.caps[key] = len(x.turns), min(self.max_new, self.max_total - len(x.tokens))
        rid = f"s{key[0]}.{key[1]}.{turn}"
        self.live[rid] = key
        self.run.engine.submit(rid, x.prompt_ids + x.tokens, self.caps[key], self.temperature,
                               turn_seed(x.seed, turn) if self.temperature > 0 else None, self.envs.stop_ids)

    def finished(self, rid: str, sample) -> None:
        """A model turn came back from engine step `tick`: append it (with its versions); end it or step its env."""
        key = self.live.pop(rid)
        x = self.flying[key]
        finish_turn(key, x, sample, self.caps.pop(key), self.envs, self.max_new, self.stats, self.runner, self.tp_rank)
        x.versions += sample.versions
        if x.done:
            self.ended(key)
        else:
            self.due[key] = self.tick + self.join_steps

    def ready(self) -> tuple[dict[Key, dict], list[Key]]:
        """This rank's answers to join at this boundary (lockstep: those due, waiting for late ones; continuous:
        those that arrived), and the trajectories over rollout.trajectory_timeout_s (by this rank's clock)."""
        if self.runner is None:
            return {}, []
        self.collect()
        if self.at_once:
            keys = sorted(self.arrived)
        else:
            keys = sorted(k for k, d in self.due.items() if d <= self.tick)
            t = time.perf_counter()
            while any(k not in self.arrived for k in keys):
                self.runner.wait(POLL_S)
                self.collect()
            self.since["wait_s"] += time.perf_counter() - t
        now = time.perf_counter()
        late = [k for k in self.flying if now - self.started[k] > self.budget_s] if self.budget_s else []
        return {k: self.arrived.pop(k) for k in keys}, late

    def join(self, answers: dict[Key, dict], late: list[Key]) -> None:
        """Apply what `ready` gave (on every rank of the engine, the lead's): the queued turns first, then answers in
        (group, sample) order, then the cuts."""
        self.refill()
        for key in sorted(answers):
            self.answer(key, answers[key])
        if late:
            self.over_budget(late)

    def idle(self) -> None:
        """Nothing to decode, answers pending: go to the next join (lockstep), or wait for one (continuous)."""
        if self.at_once:
            t = time.perf_counter()
            if self.runner is not None:
                self.runner.wait(POLL_S)
            self.since["wait_s"] += time.perf_counter() - t
        elif self.due:
            self.tick = max(self.tick, min(self.due.values()))

    def collect(self) -> None:
        for key, o in self.runner.finished(self.envs.timeout_s).items():
            x = self.flying[key]
            self.arrived[key] = env_outcome(o, x, self.envs)
            self.since["calls"] += 1

    def answer(self, key: Key, res: dict) -> None:
        x = self.flying[key]
        del self.due[key]
        if x.turns:
            apply_step(x, res, len(x.turns) - 1, self.envs.max_turns, self.max_total)
        else:
            apply_reset(x, res, self.max_total)
        if x.error and self.error is None:
            self.error = (f"environment '{self.envs.spec}' failed on sample {key[1]} of prompt "
                          f"{x.row[self.run.cfg.data.prompt_column]!r}, {x.error}")
        if x.done:
            self.ended(key)
        else:
            self.send(key)

    def over_budget(self, late: list[Key]) -> None:
        """rollout.trajectory_timeout_s: a trajectory running longer ends truncated on its last model turn."""
        aborts = []
        for key in [k for k in late if k in self.flying]:
            aborts += [rid for rid, k in self.live.items() if k == key]
            x = self.flying[key]
            x.abandoned = (self.runner is not None and self.runner.drop(key)) or x.abandoned
            self.due.pop(key, None)
            self.arrived.pop(key, None)
            self.queue = [(k, c) for k, c in self.queue if k != key]
            cut(x)
            self.ended(key)
        for rid in aborts:
            self.caps.pop(self.live.pop(rid))
        self.run.engine.abort(sorted(aborts))

    def ended(self, key: Key) -> None:
        del self.flying[key], self.started[key]
        g = key[0]
        if len(self.groups[g]) == self.size and all(x.done for x in self.groups[g]):
            trajs = self.groups.pop(g)
            self.done[g] = self.scored(trajs) if self.tp_rank == 0 else {}  # the lead hands batches over

    def drop(self) -> list[int]:
        """A signal: every trajectory in flight is dropped, with its whole group (admitted again from scratch): the
        groups admitted and not scored."""
        self.run.engine.abort(sorted(self.live))
        for key in self.due if self.runner is not None else ():
            self.runner.drop(key)
        groups = sorted(self.groups)
        self.flying, self.groups, self.live, self.caps = {}, {}, {}, {}
        self.due, self.arrived, self.started, self.queue = {}, {}, {}, []
        return groups

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()

    # ---- a finished group, and a batch of them ----

    def scored(self, trajs: list[Trajectory]) -> dict:
        """Rewards (the environments' included), the tool counts, then the environments are closed and let go.
        A reward function's or close()'s error stops the run at the next exchange (`error`)."""
        t = time.perf_counter()
        rewards, parts, tools = torch.zeros(len(trajs)), {}, {}
        try:
            with scoped(ALONE):  # at this rank's own moment: its collectives are its own
                rewards, parts = score(self.run, trajs)
                if declared_tools(self.envs.factory) is not None:
                    tools = tool_stats([x.env for x in trajs]).metrics("tool/")
                if self.multi:
                    close_envs(self.run, trajs)
        except RunError as e:
            self.error = self.error or str(e)
        for x in trajs:
            x.env = None
        return {"trajs": trajs, "rewards": rewards, "parts": parts, "tools": tools,
                "reward_s": time.perf_counter() - t}

    def batch(self, groups: list[int], size: int, version: int, leads=ALONE) -> tuple[Batch, dict]:
        """These finished groups, in this order, as this engine's share of the trainers' Batch: rewards, and each
        token's version (`version` for a trajectory that sampled nothing: the engine's at the hand-over). Its metrics
        are summed over `leads` (several engines: their first ranks, each handing its share of the same batch over;
        rlcore/modes/stream/engine_side.py), as split sums them over its rollout ranks. The groups stay in `done`
        until the engine lets go of them."""
        with scoped(leads):
            return self._batch(groups, size, version)

    def _batch(self, groups: list[int], size: int, version: int) -> tuple[Batch, dict]:
        run, parts = self.run, [self.done[g] for g in groups]
        trajs = [x for p in parts for x in p["trajs"]]
        batch = to_batch(trajs, pad_id(run.tokenizer), size, run.rollout.model_budget)
        batch.rewards = torch.cat([p["rewards"] for p in parts])
        batch.token_versions = torch.zeros_like(batch.rollout_logprobs, dtype=torch.long)  # [B, T]
        for i, x in enumerate(trajs):
            at = [len(x.prompt_ids) - 1 + t for t, s in enumerate(x.sampled) if s]  # position t scores t + 1
            batch.token_versions[i, at] = torch.tensor(x.versions, dtype=torch.long)
        # a trajectory that sampled nothing (its reset failed or timed out) is as new as the batch
        batch.versions = torch.tensor([min(x.versions, default=version) for x in trajs],
                                      dtype=torch.long)  # [B]
        rewards, names = batch.rewards.double(), sorted(parts[0]["parts"]) if len(parts[0]["parts"]) > 1 else []
        n, r_sum, r_sq, generated, *part_sums = all_sum(
            len(rewards), rewards.sum().item(), (rewards ** 2).sum().item(), sum(len(x.versions) for x in trajs),
            *(torch.cat([p["parts"][k] for p in parts]).double().sum().item() for k in names))
        mean = r_sum / n
        metrics = {"reward/mean": mean, "reward/std": max(r_sq / n - mean ** 2, 0.0) ** 0.5,
                   "time/reward_s": sum(p["reward_s"] for p in parts), "tokens/generated": generated}
        metrics |= {f"reward/{k}": total / n for k, total in zip(names, part_sums)}  # unweighted, each
        if self.multi:
            metrics |= self.env_metrics(trajs, parts, n)
        return batch, metrics

    def env_metrics(self, trajs: list[Trajectory], parts: list[dict], n: float) -> dict[str, float]:
        """colocated's multi-turn and tool metrics (rlcore.rollout.collect.env_metrics) over the batch; the
        engine's time waiting for answers since the last hand-over is time/env_s."""
        now, s = time.perf_counter(), self.since
        totals = {"active": [sum(len(x.turns) > t for x in trajs) for t in range(max(len(x.turns) for x in trajs))],
                  "turns": sum(len(x.turns) for x in trajs), "truncated": sum(x.truncated for x in trajs),
                  "timeouts": sum(x.timed_out for x in trajs), "failed": sum(x.failed is not None for x in trajs),
                  "model_tokens": sum(x.model_tokens for x in trajs),
                  "env_tokens": sum(len(x.tokens) - x.model_tokens for x in trajs), "env_s": s["wait_s"],
                  "idle_s": s["wait_s"], "rollout_s": now - s["t"], "env_calls": s["calls"]}
        for p in parts:
            for k, v in p["tools"].items():
                totals[k] = totals.get(k, 0) + v
        self.since = {"wait_s": 0.0, "calls": 0, "t": now}
        return env_metrics(self.run, totals, n)
