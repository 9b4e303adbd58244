"""Continuous rollouts (rollout.schedule=continuous): each trajectory's next turn joins the running engine as
soon as its own environment has answered, while other trajectories still generate or wait on their tools.

The tokens, masks, seeds and ending rules are those of the lockstep loop (rlcore/rollout/turns.py, whose
docstring is the contract): turn k of a trajectory seeded s samples with turn_seed(s, k), every trajectory
ends on a model token, and observations are never trained on. Every turn is its own n=1 request, so the
siblings of a prompt group advance independently (lockstep's first turn is one n=G request, whose sample j
vLLM seeds s + j: the trajectory's own seed, so both sample alike). What changes is when a turn is sampled:

    lockstep    turn 1: [a b c d] -> wait for every tool -> turn 2: [a b c d] -> ...
    continuous  a1 a2 . . a3        a, b, c, d each go on as soon as their own tool answers; the engine
                b1 . b2 . . b3      steps whenever any request is live, so a slow tool holds up only
                c1 c2 c3            its own trajectory
So batches depend on tool timing: a sample can differ in its last bits from run to run (vLLM's numerics
vary with the batch), though its seed does not.

Environment calls never run on the main thread (rlcore.rollout.env.EnvRunner, shared with the lockstep loop):
`step` on daemon threads, `async def step` on one event loop in a background thread, each at most
rollout.env_workers at once. The main loop never waits on a call
without a deadline, so a stuck tool cannot stall the step: it ends its trajectory after
rollout.env_timeout_s (timed out, reward 0), rollout.trajectory_timeout_s or rollout.step_deadline_s
(truncated: its in-flight request is aborted, a pending observation dropped; it ends on its last model turn).
Both budgets are checked once per tick, so they act at most one tick's engine steps late. Every environment
call runs with Limits (rlcore.rollout.env) that end ANSWER_S before the earliest of these cuts, so rlcore's
tools (and any environment that reads time_left()) answer, stop their programs and free their sandbox
workers before the loop drops the trajectory.

Tensor parallelism. Every rank of an engine's group must make identical engine calls between the same engine
steps. The loop runs in ticks, the same on every rank:
  1. agree: each rank gathers what its own environments finished (results, timeouts, per-trajectory budgets
     spent) and TP rank 0 adds whether the step deadline has passed; ONE all_gather_object over the group
     merges them, so every rank admits the same results and the same deadline decision;
  2. apply, in trajectory order: each admitted result ends its trajectory or appends the observation and
     adds the next turn (add_request: same id, tokens, cap and seed on every rank); aborts likewise;
  3. decode: up to K engine steps, stopping early when no request is live; K is agreed in step 1 (the
     smallest rank's proposal: STEPS_WHILE_CALLING if it has a tool call running, else STEPS_PER_TICK;
     always 1 without tensor parallelism, where agreeing is free). Finished outputs are
     identical on every rank (same requests, same steps), so every rank applies the same ending rule; the
     owner of a trajectory (the rank that trains it, as in lockstep) then starts its environment call;
  4. idle: when no request is live, wait on this rank's own calls, at most POLL_S, then tick again.
The loop ends when every trajectory is done, a state every rank derives from the same agreed events.
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import torch.distributed as dist

from rlcore.rollout.env import EnvRunner
from rlcore.rollout.turns import (Trajectory, TurnStats, apply_reset, apply_step, env_outcome, start,
                                  turn_seed)
from rlcore.run import Envs

STEPS_PER_TICK = 8  # engine steps between two agreements of a TP group while no tool call is running
STEPS_WHILE_CALLING = 2  # ... while one is: its answer joins the engine sooner, for more agreements
POLL_S = 0.005  # longest wait on this rank's environment calls while the engine has nothing to do
_rollouts = itertools.count()  # request ids stay unique across rollouts (the same count on every rank)


@dataclass
class ContinuousStats(TurnStats):
    rollout_s: float = 0.0  # wall time of the whole rollout
    idle_s: float = 0.0  # of which the engine had no live request (every trajectory waiting on a tool)
    sync_s: float = 0.0  # of which in the group's agreements
    ticks: int = 0
    env_calls: int = 0  # environment calls this rank finished (resets and steps)
    deadline_truncated: int = 0  # trajectories (of the whole group) ended by rollout.step_deadline_s
    budget_truncated: int = 0  # ... by rollout.trajectory_timeout_s


def agree(results: dict[int, dict], deadline: bool, steps: int, tp_group) -> tuple[dict[int, dict], bool, int]:
    """Step 1 of a tick: every rank's finished results, TP rank 0's deadline flag and the fewest engine steps any
    rank asks for before the next agreement, on every rank.

        rank 0: ({3: obs}, False, 2)   rank 1: ({12: obs}, True, 8)   ->   ({3: obs, 12: obs}, False, 2)
    """
    if tp_group is None or dist.get_world_size(tp_group) == 1:
        return results, deadline, 1
    gathered = [None] * dist.get_world_size(tp_group)
    dist.all_gather_object(gathered, (results, deadline, steps), group=tp_group)
    return ({i: r for part, _, _ in gathered for i, r in part.items()}, gathered[0][1],
            min(k for _, _, k in gathered))


def cut(x: Trajectory) -> None:
    """End a trajectory early, truncated, on its last complete model turn (a pending observation is dropped)."""
    keep = len(x.sampled)
    while keep and not x.sampled[keep - 1]:
        keep -= 1
    del x.tokens[keep:], x.sampled[keep:], x.logprobs[keep:]
    x.done = x.truncated = True


def rollout(engine, trajs: list[Trajectory], envs: Envs, max_new_tokens: int, max_total: int, temperature: float,
            tp_rank: int, tp_group, trajectory_timeout_s: float = 0.0, step_deadline_s: float = 0.0
            ) -> ContinuousStats:
    """Run every trajectory to its end, each at its own pace (see the module docstring). Same arguments as
    rlcore.rollout.turns.rollout, which this matches trajectory by trajectory, plus the two budgets (0 = none).
    `engine` needs submit / step / busy / abort (rlcore.engine.rollout_engine.RolloutEngine)."""
    t0 = time.perf_counter()
    budget = min([b for b in (trajectory_timeout_s, step_deadline_s) if b] or [math.inf])
    runner = EnvRunner(envs.workers, min(envs.timeout_s, envs.turn_s), envs.max_tool_calls, t0 + budget)
    stats, tag = ContinuousStats(), next(_rollouts)
    live: dict[str, int] = {}  # request id -> trajectory, for requests in the engine (the same on every rank)
    caps: dict[int, int] = {}  # each live request's token cap (decides whether a cut action is complete)
    mine = [i for i, x in enumerate(trajs) if x.owner == tp_rank]
    for i in mine:
        runner.submit(i, start, trajs[i], envs.factory)

    def submit_turn(i: int, x: Trajectory) -> None:
        turn, caps[i] = len(x.turns), min(max_new_tokens, max_total - len(x.tokens))
        rid = f"{tag}.{i}.{turn}"
        live[rid] = i
        engine.submit(rid, x.prompt_ids + x.tokens, caps[i], temperature,
                      turn_seed(x.seed, turn) if temperature > 0 else None, envs.stop_ids)

    def end_early(i: int, x: Trajectory, aborts: list[str]) -> None:
        aborts += [rid for rid, j in live.items() if j == i]
        x.abandoned = runner.drop(i) or x.abandoned
        cut(x)

    try:
        while True:
            tick = time.perf_counter()
            stats.ticks += 1
            # 1. agree
            done = runner.finished(envs.timeout_s)
            stats.env_calls += len(done)
            results = {i: env_outcome(o, trajs[i], envs) for i, o in done.items()}
            elapsed = tick - t0
            if trajectory_timeout_s and elapsed > trajectory_timeout_s:
                results |= {i: {"budget": True} for i in mine if not trajs[i].done and i not in results}
            deadline = bool(step_deadline_s) and tp_rank == 0 and elapsed > step_deadline_s
            steps = STEPS_WHILE_CALLING if runner.calls else STEPS_PER_TICK
            results, deadline, steps = agree(results, deadline, steps, tp_group)
            stats.sync_s += time.perf_counter() - tick
            # 2. apply, in trajectory order
            aborts: list[str] = []
            for i in sorted(results):
                x, res = trajs[i], results[i]
                if x.done:
                    continue
                if "budget" in res:
                    end_early(i, x, aborts)
                    stats.budget_truncated += 1
                    continue
                if x.turns:
                    apply_step(x, res, len(x.turns) - 1, envs.max_turns, max_total)
                else:
                    apply_reset(x, res, max_total)
                if not x.done and not deadline:
                    submit_turn(i, x)
            if deadline:
                for i, x in enumerate(trajs):
                    if not x.done:
                        end_early(i, x, aborts)
                        stats.deadline_truncated += 1
            for rid in aborts:
                live.pop(rid)
            engine.abort(sorted(aborts))
            if all(x.done for x in trajs):
                break
            # 3. decode, or 4. idle
            if engine.busy():
                t = time.perf_counter()
                for _ in range(steps):
                    for rid, s in engine.step():
                        i = live.pop(rid)
                        finish_turn(i, trajs[i], s, caps.pop(i), envs, max_new_tokens, stats, runner, tp_rank)
                    if not engine.busy():
                        break
                stats.generate_s += time.perf_counter() - t
            else:
                left = [b - elapsed for b in (trajectory_timeout_s, step_deadline_s) if b]
                runner.wait(min([POLL_S, *left]))
                stats.idle_s += time.perf_counter() - tick
    finally:
        runner.close()
        engine.abort(sorted(live))  # only after an error: a finished rollout leaves no request behind
    stats.rollout_s = time.perf_counter() - t0
    stats.env_s = stats.idle_s
    stats.active = [sum(len(x.turns) > t for x in trajs) for t in range(max(len(x.turns) for x in trajs))]
    return stats


def finish_turn(i: int, x: Trajectory, s, cap: int, envs: Envs, max_new_tokens: int, stats: ContinuousStats,
                runner: EnvRunner, tp_rank: int) -> None:
    """A model turn came back (identically on every rank): append it; the ending rule of turns.py (2.) decides
    whether the environment is stepped, which only the owner does."""
    x.append(s.token_ids, True, s.logprobs)
    x.turns.append(list(s.token_ids))
    stats.generated += len(s.token_ids)
    if envs.factory is None:
        x.done = True  # single-turn (rule 1; rlcore/modes/stream/turns.py runs those through here too)
    elif s.finish_reason == "length" and (envs.stop_ids or cap < max_new_tokens):
        x.done = x.truncated = True  # an incomplete action: never shown to the environment
    elif x.owner == tp_rank:
        runner.submit(i, x.env.step, envs.decode(x.turns[-1]), list(x.turns[-1]))
