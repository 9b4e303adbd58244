"""Agents in streaming (rollout.agent with rollout.stream=true): each sample of an admitted prompt group is the
recipe's `async def agent(client, row)` run once (rlcore.rollout.agents), on the event loop of its engine's first
rank, with its own openai client on that rank's endpoint (rlcore.rollout.endpoint). Its calls are its turns: each
is a request of its own in the streaming engine, seeded turn_seed(seed + j, call) as in colocated and split runs,
so a trajectory's calls may span versions, and every sampled token carries the version that sampled it.

An agent's next event (its next call, or its end) joins the engine as an environment's answer does
(rlcore/modes/stream/turns.py), by rollout.schedule:
  lockstep (default): at the boundary after engine step s + rollout.join_steps, where s is the step that admitted
    the trajectory or finished its last call in the engine; if the agent has not yet called again (or ended), the
    engine waits there for it, at most rollout.env_timeout_s from the agent's start (then it ends, timed out).
    An agent that makes one call at a time (the chat loop of every example) therefore runs the same calls at the
    same engine steps in every run, whatever its own latency: two runs log the same numbers. Calls an agent makes
    concurrently (asyncio.gather) join as they arrive after the first: reproducible only in their first call.
  continuous: at the first boundary after they arrive. Not reproducible (as environments' answers).

An agent's failure is its trajectory's (reward 0, no loss; agent/failed, agent/timeouts), never the run's, as in
the other modes. What the model sampled is recorded by the endpoint and becomes the trajectory's row as in
rlcore.rollout.agents.fill, rewritten histories included; the versions follow the calls' order in that row.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rlcore.batch import Batch
from rlcore.distributed.collectives import all_sum
from rlcore.modes.stream.turns import Key, Turns
from rlcore.rollout.agents import end_of, fill
from rlcore.rollout.collect import agent_endpoint
from rlcore.rollout.continuous import POLL_S
from rlcore.rollout.env import EnvRunner
from rlcore.rollout.sessions import Request, Session
from rlcore.rollout.turns import Trajectory, turn_seed

if TYPE_CHECKING:
    from rlcore.run import Run


class AgentTurns(Turns):
    """The agents' trajectories in flight on the streaming engine (the calls of Turns, other events). With tensor
    parallelism the agents and the endpoint live on the engine's first rank (the lead); every rank submits the calls
    and applies the ends it hands round at the boundary where they join (rlcore/modes/stream/engine_side.py, Engine.sync)."""

    def __init__(self, run: Run, cap: int | None = None):
        super().__init__(run, cap)
        self.agent, self.budget_s, self.lead = run.rollout.envs.agent, 0.0, self.tp_rank == 0
        self.endpoint = self.clients = None
        if self.lead:
            from rlcore.rollout.wire import Clients

            self.endpoint = agent_endpoint(run)
            self.runner = EnvRunner(self.envs.workers)  # the agents' coroutines; env_timeout_s bounds each agent
            self.clients = Clients(self.endpoint)
        self.sessions: dict[Key, Session] = {}
        self.keys: dict[int, Key] = {}  # session index -> its trajectory
        self.requests: dict[str, Request] = {}  # request id -> the agent's call, while it is in the engine
        self.calls: dict[Key, list[int]] = {}  # the versions of each call's tokens, in the order they came back
        self.events: dict[Key, list[tuple]] = {}  # calls and ends arrived, waiting for their boundary
        self.index = 0
        self.warned = False

    def admit(self, g: int, j: int, row: dict, seed: int) -> None:
        key, x = self.start(g, j, row, seed)
        self.calls[key], self.due[key] = [], self.tick + self.join_steps
        if self.lead:
            self.endpoint.temperature = self.temperature  # an eval in between pinned it to greedy
            self.sessions[key] = s = self.endpoint.open(self.index)
            self.keys[self.index], self.index = key, self.index + 1
            self.runner.submit(key, self.run_agent, x, s)
            self.runner.calls[key][0].add_done_callback(lambda _: self.endpoint.wake.set())

    async def run_agent(self, x: Trajectory, s: Session):
        return await self.agent(self.clients.client(s.token, self.envs.timeout_s), x.row)

    def finished(self, rid: str, sample) -> None:
        """A call came back from engine step `tick`: the agent gets it; its next event is due join_steps later
        (once none of its calls is left in the engine)."""
        key, request = self.live.pop(rid), self.requests.pop(rid)
        self.calls[key].append(list(sample.versions))
        if self.lead:
            self.endpoint.deliver(self.sessions[key], request, sample)
        if key not in self.live.values() and all(k != key for k, _ in self.queue):
            self.due[key] = self.tick + self.join_steps

    def ready(self) -> tuple[dict[Key, list[tuple]], list[Key]]:
        """The agents' events due at this boundary (lockstep: waiting for each one's next; continuous: those that
        arrived): calls (plain Requests) and ends, per trajectory (the lead's; none elsewhere)."""
        if not self.lead:
            return {}, []
        self.collect()
        if self.at_once:
            keys = sorted(k for k in self.events if k in self.flying)
        else:
            keys = sorted(k for k, d in self.due.items() if d <= self.tick)
            t = time.perf_counter()
            while any(not self.events.get(k) for k in keys):
                self.endpoint.wake.wait(POLL_S)
                self.endpoint.wake.clear()
                self.collect()
            self.since["wait_s"] += time.perf_counter() - t
        return {k: self.events.pop(k) for k in keys}, []

    def join(self, answers: dict[Key, list[tuple]], late: list[Key]) -> None:
        """Every rank: the queued calls first (rollout.max_waiting), then the events `ready` gave, in (group, sample)
        order."""
        self.refill()
        for key in sorted(answers):
            self.due.pop(key, None)
            for event in answers[key]:
                if event[0] == "end":
                    self.end(key, event[1])
                    break
                self.send(key, event[1])

    def collect(self) -> None:
        for r in self.endpoint.take():
            self.events.setdefault(self.keys[r.index], []).append(("call", r))
        for key, o in self.runner.finished(self.envs.timeout_s).items():
            self.events.setdefault(key, []).append(("end", end_of(o)))

    def idle(self) -> None:
        if self.at_once:
            if self.lead:  # elsewhere the next agreement waits for the lead
                t = time.perf_counter()
                self.endpoint.wake.wait(POLL_S)
                self.endpoint.wake.clear()
                self.since["wait_s"] += time.perf_counter() - t
        elif self.due:
            self.tick = max(self.tick, min(self.due.values()))

    def launch(self, key: Key, call: Request) -> None:
        self.submit_call(key, call)

    def submit_call(self, key: Key, r: Request) -> None:
        x, rid = self.flying[key], f"s{key[0]}.{key[1]}.{r.call}"
        self.live[rid], self.requests[rid] = key, r
        self.run.engine.submit(rid, r.prompt_ids, r.max_tokens, self.temperature,
                               turn_seed(x.seed, r.call) if self.temperature > 0 else None, stop=r.stop)

    def end(self, key: Key, outcome: dict) -> None:
        """The agent returned (or failed): its calls still in the engine are aborted, its session closed, and its
        row filled from what the endpoint recorded."""
        x = self.flying[key]
        x.done, x.env_reward, x.error, x.timed_out = True, outcome.get("reward", 0.0), outcome.get("error"), \
            outcome.get("timeout", False)
        aborts = sorted(rid for rid, k in self.live.items() if k == key)
        for rid in aborts:
            del self.live[rid], self.requests[rid]
        self.run.engine.abort(aborts)
        self.queue = [(k, c) for k, c in self.queue if k != key]  # its calls not yet in the engine
        if not self.lead:  # the lead alone scores and hands the batch over
            del self.calls[key]
            self.ended(key)
            return
        s = self.sessions.pop(key)
        self.endpoint.close(s, x.error or ("timed out" if x.timed_out else None))
        fill(x, s)
        x.versions = [v for call in self.calls.pop(key) for v in call] if any(x.sampled) else []
        self.keys.pop(s.index)
        if x.error and not self.warned:  # once per run; agent/failed counts every step
            self.warned = True
            self.run.logger.print(f"rlcore: warning: agent '{self.envs.spec}' failed a trajectory (the run goes "
                                  f"on; agent/failed counts them): {x.error}")
        self.ended(key)

    def drop(self) -> list[int]:
        """A signal: every agent in flight is abandoned and its session closed (groups admitted again on resume)."""
        for key in self.flying if self.lead else ():
            self.runner.drop(key)
        for s in self.sessions.values():
            self.endpoint.close(s, "the run stopped")
        self.sessions, self.keys, self.requests, self.calls, self.events = {}, {}, {}, {}, {}
        return super().drop()

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()

    def _batch(self, groups: list[int], size: int, version: int) -> tuple[Batch, dict]:
        trajs = [x for g in groups for x in self.done[g]["trajs"]]
        batch, metrics = super()._batch(groups, size, version)
        n, calls, failed, timeouts, rewritten = all_sum(
            len(trajs), sum(len(x.turns) for x in trajs), sum(x.error is not None for x in trajs),
            sum(x.timed_out for x in trajs), sum(len(x.starts) for x in trajs))
        metrics |= {"agent/calls_mean": calls / n, "agent/failed": failed, "agent/timeouts": timeouts,
                    "agent/rewritten": rewritten, "agent/failed_frac": (failed + timeouts) / n}
        frac = self.run.cfg.rollout.max_failed_frac
        if failed + timeouts >= frac * n:  # the same sums on every lead: all stop at the next exchange
            first = next((x.error or "timed out (rollout.env_timeout_s)" for x in trajs if x.error or x.timed_out),
                         "on another engine")
            self.error = self.error or (f"{int(failed + timeouts)} of {int(n)} trajectories' agents failed in a "
                                        f"batch (rollout.max_failed_frac={frac:g}); the first: {first}")
        return batch, metrics
