"""An agent is a rollout (rollout.agent): the recipe's `async def agent(client, row) -> reward` runs once per
trajectory with its own `openai.AsyncOpenAI` client, pointed at this rank's endpoint (rlcore.rollout.endpoint)
under the trajectory's own token. What the agent does between calls (tools, parsing, retries) is its own
business; what the model sampled is recorded by the endpoint, token for token.

    async def agent(client, row):
        r = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
        return float(r.choices[0].message.content == row["answer"])

The loop is the continuous schedule's (rlcore.rollout.continuous), with agents in place of environments: each
tick, every rank of an engine's group gathers what its own agents asked for (Requests) and which agents
finished, ONE all_gather_object merges them, and every rank submits the same requests (same ids, token ids,
caps and seeds: call k of a trajectory seeded s uses turn_seed(s, k)) in the same order, then runs the same
engine steps. Agents run on the rank that trains their trajectory (its owner), on one event loop in a
background thread, at most rollout.env_workers at once.

An agent's failure is its trajectory's, never the run's: an exception, a refused call (the endpoint's 400),
the call budget (rollout.max_turns calls) or rollout.env_timeout_s on the whole agent end it with reward 0 and
no loss on its tokens, counted in agent/failed, agent/timeouts.

Training sequences (rlcore.rollout.sessions.sequences): calls that extend each other form one sequence with
the non-model tokens masked. When the agent rewrote its history, the calls form several sequences, and every
one is trained: they lie one after another in the trajectory's one row of the Batch, each restarting its
positions (Trajectory.starts -> Batch.position_ids), so each attends only to itself, as if it were a row of its
own. One row per trajectory keeps the prompt groups' shape, so the group baselines stay per trajectory: the
trajectory's advantage reaches every model token of every sequence, and the loss sees one sequence per
trajectory (token-mean counts all its model tokens; seq-mean-token-mean averages them into one sequence).

    calls      [p p] -> [a];  [q q] -> [b]                    (the second call rewrote the history)
    row        p p a q q b      sampled 0 0 1 0 0 1     position_ids 0 1 2 0 1 2
agent/rewritten counts the sequences beyond a trajectory's first.
"""
from __future__ import annotations

import asyncio
import inspect
import math
import time
from dataclasses import dataclass
from typing import Callable

from rlcore.rollout.continuous import POLL_S, STEPS_PER_TICK, EnvRunner, agree
from rlcore.rollout.endpoint import Endpoint
from rlcore.rollout.sessions import Request, Session, sequences
from rlcore.rollout.turns import Trajectory, TurnStats, turn_seed
from rlcore.rollout.wire import Clients

GATHER_S = 0.2  # longest a rollout's first engine step waits for the rank's agents to make their first calls
_rollouts = iter(range(10**12))  # request ids stay unique across rollouts (the same count on every rank)


@dataclass
class AgentStats(TurnStats):
    rollout_s: float = 0.0
    calls: int = 0  # engine calls of this group's agents
    failed: int = 0  # trajectories whose agent raised or was refused (this rank's)
    timeouts: int = 0  # ... that ran past rollout.env_timeout_s
    rewritten: int = 0  # sequences beyond a trajectory's first (rewritten histories; each trained)
    first_error: str = ""  # why the first failed trajectory (of this rank) failed


def check_agent(fn, spec: str) -> None:
    """Startup: the recipe's agent must be `async def agent(client, row)`."""
    if not inspect.iscoroutinefunction(fn):
        kind = "a class" if inspect.isclass(fn) else "a plain function" if callable(fn) else type(fn).__name__
        raise ValueError(f"rollout.agent '{spec}' is {kind}, not an async function; an agent is "
                         f"`async def agent(client, row) -> reward` using the openai client it is handed")


def reward_of(value) -> float:
    """An agent's return: a number, or an object / dict with a `reward`."""
    value = value.get("reward") if isinstance(value, dict) else getattr(value, "reward", value)
    reward = float(value)
    if not math.isfinite(reward):
        raise ValueError(f"the agent returned reward {reward}")
    return reward


def rollout(engine, endpoint: Endpoint, agent: Callable, trajs: list[Trajectory], temperature: float,
            timeout_s: float, workers: int, tp_rank: int, tp_group) -> AgentStats:
    """Run every trajectory's agent to its end; fills each of this rank's trajectories from its recorded calls."""
    t0 = time.perf_counter()
    stats, runner, tag = AgentStats(), EnvRunner(workers), next(_rollouts)
    live: dict[str, Request] = {}  # request id -> the request, for requests in the engine (the same on every rank)
    sessions: dict[int, Session] = {}

    clients = Clients(endpoint)  # one client per trajectory: its token is its session

    async def run_agent(x: Trajectory, s: Session):
        return await agent(clients.client(s.token, timeout_s), x.row)

    for i, x in enumerate(trajs):
        if x.owner == tp_rank:
            sessions[i] = endpoint.open(i)
            runner.submit(i, run_agent, x, sessions[i])
            runner.calls[i][0].add_done_callback(lambda _: endpoint.wake.set())  # an idle loop sees the end at once
    try:
        gathering = bool(sessions)
        while not all(x.done for x in trajs):
            # 0. the first calls of a rollout are held until every agent of this rank has made its own (or ended),
            # at most GATHER_S: they arrive one by one as the agents start, and each engine step taken meanwhile
            # would run a sliver of the batch (a step costs about as much for 1 sequence as for 128)
            if gathering:
                gathering = time.perf_counter() - t0 < GATHER_S and any(
                    s.started == 0 and not s.closed and i in runner.calls for i, s in sessions.items())
            # 1. agree: this rank's new requests and finished agents, merged over the group
            local = {} if gathering else {("call", r.index, r.call): r for r in endpoint.take()}
            for i, o in runner.finished(timeout_s).items():
                local[("end", i)] = end_of(o)
            t = time.perf_counter()
            merged, _, steps = agree(local, False, STEPS_PER_TICK, tp_group)
            stats.env_s += time.perf_counter() - t
            # 2. apply, in a fixed order: agents that ended (their requests aborted), then new requests
            aborts = []
            for key in sorted(k for k in merged if k[0] == "end"):
                i, x = key[1], trajs[key[1]]
                x.done = True
                x.env_reward, x.error, x.timed_out = merged[key].get("reward", 0.0), merged[key].get("error"), \
                    merged[key].get("timeout", False)
                aborts += [rid for rid, r in live.items() if r.index == i]
                if i in sessions:
                    endpoint.close(sessions[i], x.error or ("timed out" if x.timed_out else None))
            for rid in aborts:
                live.pop(rid)
            engine.abort(sorted(aborts))
            for key in sorted(k for k in merged if k[0] == "call"):
                r = merged[key]
                if trajs[r.index].done:
                    continue
                rid = f"a{tag}.{r.index}.{r.call}"
                live[rid] = r
                engine.submit(rid, r.prompt_ids, r.max_tokens, temperature,
                              turn_seed(trajs[r.index].seed, r.call) if temperature > 0 else None, stop=r.stop)
                stats.calls += 1
            # 3. decode, or 4. idle (until a request arrives or an agent ends)
            if engine.busy():
                t = time.perf_counter()
                for _ in range(steps):
                    for rid, sample in engine.step():
                        r = live.pop(rid)
                        stats.generated += len(sample.token_ids)
                        if r.index in sessions:
                            endpoint.deliver(sessions[r.index], r, sample)
                    if not engine.busy():
                        break
                stats.generate_s += time.perf_counter() - t
            elif not all(x.done for x in trajs):
                endpoint.wake.wait(POLL_S)
                endpoint.wake.clear()
    finally:
        if runner.loop is not None:
            try:
                asyncio.run_coroutine_threadsafe(clients.http.aclose(), runner.loop).result(timeout=5)
            except TimeoutError:  # an agent blocks the event loop: the pool goes with the process
                pass
        runner.close()
        engine.abort(sorted(live))  # only after an error: a finished rollout leaves no request behind
        for s in sessions.values():
            if not s.closed:  # only after an error
                endpoint.close(s, "the rollout ended")
    for i, s in sessions.items():
        stats.rewritten += fill(trajs[i], s)
        stats.failed += trajs[i].error is not None
        stats.timeouts += trajs[i].timed_out
        stats.first_error = stats.first_error or trajs[i].error or ""
    stats.rollout_s = time.perf_counter() - t0
    return stats


def end_of(o) -> dict:
    """An agent's Outcome -> what the group shares: its reward, or why it failed (one line)."""
    if o.timed_out:
        return {"timeout": True}
    if o.error:
        return {"error": f"the agent raised {o.error}"}
    try:
        return {"reward": reward_of(o.value)}
    except (TypeError, ValueError) as e:
        return {"error": f"the agent returned {o.value!r}, not a reward ({e})"}


def fill(x: Trajectory, s: Session) -> int:
    """The trajectory's tokens from its session: every sequence, one after another in its row (see the module
    docstring); a failed or timed out trajectory keeps its prompt only (nothing to train on). Returns the
    sequences beyond the first."""
    if s.failed and x.error is None and not x.timed_out:
        x.error = s.failed  # a refused call fails its trajectory even when the agent caught the error
    seqs = sequences(s.calls)
    x.turns = [c.completion_ids for c in s.calls]
    if x.error or x.timed_out or not seqs:
        x.env_reward = 0.0
        return 0
    first = seqs[0]
    x.prompt_ids, x.tokens, x.sampled, x.logprobs = first.prompt_ids, first.tokens, first.sampled, first.logprobs
    for seq in seqs[1:]:
        x.starts.append(len(x.prompt_ids) + len(x.tokens))
        x.append(seq.prompt_ids, False)
        x.tokens += seq.tokens
        x.sampled += seq.sampled
        x.logprobs += seq.logprobs
    return len(seqs) - 1
