"""Streaming's engine side: each engine keeps up to rollout.max_running trajectories in flight, admits groups
across step boundaries, hands batches over and loads versions between two engine steps (the Engine class); its
timing and the decisions every rank of a tensor-parallel engine agrees on. The design, the exchanges and the
guarantees: rlcore/modes/stream/__init__.py.

Why one file of ~380 lines: the Engine's decisions (admission, joins, loads, hand-overs) share its state and are
read as one loop; what it counts for its metrics is rlcore/modes/stream/meter.py.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch.distributed as dist

from rlcore.distributed import watchdog
from rlcore.distributed.collectives import ALONE, PeerGone, RunError, all_max, first_error
from rlcore.modes.offpolicy import PROBE_ROWS, own_state, probe_gaps, trainers_state
from rlcore.modes.stream.agents import AgentTurns
from rlcore.modes.stream.early import EarlyHandover
from rlcore.modes.stream.lag import LoadLag
from rlcore.modes.stream.meter import Meter
from rlcore.modes.stream.turns import Turns
from rlcore.modes.transfer import Link, exchange, error_in, listen, receive_weights, received
from rlcore.rollout.collect import rollout_seed
from rlcore.train.logprobs import drift_error

if TYPE_CHECKING:
    from rlcore.modes.loop import Loop
    from rlcore.run import Run


class Engine:
    """Ranks [0, R): one engine's loop (this rank's) and everything it carries between steps (what a checkpoint
    saves)."""

    def __init__(self, run: Run, link: Link, loop: Loop):
        cfg, r = run.cfg, run.cfg.rollout
        self.run, self.link, self.loop, self.stop = run, link, loop, loop.stop
        self.lead = run.rollout.tp_rank == 0  # tensor parallelism: environments, scores, batches on the first rank
        # engine e of E (rollout.ranks / T): its P = prompts_per_step / E groups of each batch, as split deals them
        self.E, self.e = run.dims.rollout_groups, run.rollout.group
        self.P, self.G = r.prompts_per_step // self.E, r.group_size
        self.k, self.steps = r.max_staleness, cfg.train.steps
        self.max_running = r.max_running or self.P * self.G
        self.max_waiting = r.max_waiting  # admitted beyond max_running while trajectories wait for their environment
        self.rows: dict[int, dict] = {}  # group -> its prompt row (fetched, not yet handed over)
        # the trajectories in flight, and the finished groups (rlcore/modes/stream/turns.py; agents: stream_agents.py)
        self.turns = (AgentTurns if run.rollout.envs.agent is not None else Turns)(
            run, self.max_running if self.max_waiting else None)
        # admission goes by trajectory (sample j of group g is g x G + j), so a slot refills the step it frees:
        # the next to admit, and those to admit first (after a signal: the dropped groups' samples, admitted anew)
        self.next_sample, self.todo = 0, []
        self.handed, self.probe, self.scores = 0, None, {}
        # rollout.early_handover: the trainers may hold batch handed + 1 before version `handed` loads
        # (rlcore/modes/stream/early.py)
        self.early = EarlyHandover(link)
        self.pending: dict[int, dict] = {}  # batch -> its rollout metrics, until its step is logged
        self.meter = Meter(self.max_running)  # what the engine did since the previous load (its metrics)
        # the deterministic load point: version v loads once the engine steps since hand-over v spent the lag; while
        # rollout.load_lag_steps=auto measures, at the earliest point (rlcore/modes/stream/lag.py)
        self.lag = LoadLag(r, run.dims.rollout_ranks)
        # free loads, early hand-over: the receive of "version `handed` waits" from the trainers
        self.waiting = None
        # as the engine's ranks agreed at this boundary: a signal, an error, (free loads) the next version is there
        self.stopped, self.error, self.arrived = False, None, False
        self.began = time.perf_counter()  # when the loop began this step boundary (serve)

    # ---- the state of the schedule (the same numbers in every run of a config) ----

    def batch_of(self, g: int) -> int:
        return g // self.P + 1

    def complete(self, b: int) -> bool:
        return all(g in self.turns.done for g in range(self.P * (b - 1), self.P * b))

    def next_admit(self) -> int | None:
        """The next trajectory to admit (g x G + j), None when every batch's are."""
        s = self.todo[0] if self.todo else self.next_sample
        return s if s < self.P * self.G * self.steps else None

    def next_with_room(self) -> int | None:
        """The next trajectory to admit, if there is room in the engine for it: fewer than max_running in flight;
        with rollout.max_waiting, fewer than max_running + max_waiting in flight and a request free in the engine
        (none of its max_running taken, by a request or a queued turn)."""
        s, t = self.next_admit(), self.turns
        room = len(t.flying) < self.max_running if not self.max_waiting else \
            len(t.flying) < self.max_running + self.max_waiting and len(t.live) + len(t.queue) < self.max_running
        return s if s is not None and room else None

    def recent_enough(self, s: int) -> bool:
        """The engine holds the version trajectory s's batch needs (admission control: b - 1 - k or newer)."""
        return self.batch_of(s // self.G) - 1 - self.k <= self.run.engine.version

    def may_start(self, s: int) -> bool:
        """Whether trajectory s may start now: the engine is recent enough for it, and no drain holds admission (a
        drain lets a started group's samples start, so that every admitted group ends)."""
        return self.recent_enough(s) and (s % self.G > 0 or not self.draining())

    def blocked(self) -> bool:
        """Room for a trajectory, but the next one needs a newer version than the engine holds."""
        s = self.next_with_room()
        return s is not None and not self.recent_enough(s)

    def waits(self) -> bool:
        """Something waits for the version handed over last: admission (`blocked`), or the next hand-over (batch
        handed + 1 is complete, and the trainers take it once that version is loaded)."""
        return self.blocked() or self.complete(self.handed + 1)

    def admissible(self) -> bool:
        """Admission would start a trajectory now: one is left, there is room for it and it may start."""
        s = self.next_with_room()
        return s is not None and self.may_start(s)

    def draining(self) -> bool:
        v = self.handed
        return self.run.engine.version < v and (self.loop.save_due(v) or self.evals(v))

    def evals(self, v: int) -> bool:
        return bool(self.run.rollout.eval_rows) and (v % self.run.cfg.train.eval_every == 0 or v == self.steps)

    def load_due(self) -> bool:
        """Now, if nothing is in flight and admission has nothing to start (a drain also waits for every trajectory
        to end), or once the engine steps since the hand-over spent the lag (rlcore/modes/stream/lag.py; auto's is
        shorter once something waits for this version: `waits`); while auto measures, at the earliest point: nothing
        runs in the engine and nothing to start, or something waits for this version. (A hand-over right after a
        load finds nothing in flight when the engine was ahead: the groups the load made admissible start first, and
        the engine decodes them while the trainers train.)"""
        if self.stopped or self.error or not (self.turns.flying or self.admissible()):
            return True
        if self.draining():
            return False
        if self.run.cfg.rollout.free_loads:  # the moment the version is there, and only then
            return self.arrived
        if not self.lag.fixed:
            return not (self.turns.live or self.admissible()) or self.waits()
        return self.lag.due(self.waits())

    # ---- the loop ----

    def serve(self) -> dict:
        engine = self.run.engine
        while engine.version < self.steps:
            self.began = time.perf_counter()  # this step boundary's decisions and step (auto's lag: the step's time)
            self.sync()  # the environments' answers due at this step boundary, signals, errors
            if engine.version == self.handed:  # next exchange: hand over batch handed + 1
                if self.complete(self.handed + 1) or self.stopped or self.error:
                    self.hand_over(self.handed + 1)
                    continue
            elif self.early.due(self):  # next exchange: batch handed + 1, before the load of version handed
                self.early.give(self, self.handed + 1)
                continue
            elif self.load_due():  # next exchange: load version handed
                self.load(self.handed)
                continue
            if self.early.tell_due(self):
                self.early.tell(self)
            self.admit()
            self.step()
        self.turns.close()
        return self.loop.summary

    def sync(self) -> None:
        """What this step boundary's decisions read, the same on every rank of the engine: the environments'
        answers that join here (they run on the lead, its first rank), the trajectories over budget (the lead's
        clock), whether a signal arrived, the first error and (free loads) whether the lead heard the next version
        waits. With tensor parallelism one all_gather over the engine's ranks carries them, so every rank then
        makes the same engine calls (vLLM's TP needs that)."""
        answers, late = self.turns.ready()
        stopped, error = self.stop.received, self.turns.error
        arrived = self.waiting is not None and self.waiting.is_set()
        gone = self.waiting.error if arrived else None  # the lead's listener lost the trainers' first rank
        if self.run.dims.tp > 1:
            parts = gather((answers, late, stopped, error, arrived, gone), self.run.rollout.tp_group, self.run.dims.tp)
            answers = {key: a for part in parts for key, a in part[0].items()}
            late, stopped, arrived, gone = parts[0][1], any(p[2] for p in parts), parts[0][4], parts[0][5]
            error = next((p[3] for p in parts if p[3]), None)
        if gone is not None:
            raise PeerGone(gone)
        self.stopped, self.error, self.arrived = stopped, error, arrived
        self.turns.error = self.turns.error or error
        self.turns.join(answers, late)

    def any_rank(self, flag: bool) -> bool:
        """Whether `flag` holds on any rank of this engine (a collective over them with tensor parallelism)."""
        return any(gather(flag, self.run.rollout.tp_group, self.run.dims.tp)) if self.run.dims.tp > 1 else flag

    def admit(self) -> None:
        """Trajectories in order while there is room and each may start (`may_start`)."""
        while (s := self.next_with_room()) is not None and self.may_start(s):
            g, j = divmod(s, self.G)
            b = self.batch_of(g)
            if g not in self.rows:  # the whole batch's rows, drawn from the prompt stream in order
                self.rows |= {self.P * (b - 1) + i: row for i, row in enumerate(self.run.rollout.prompts.next_batch())}
            if self.todo:
                self.todo.remove(s)
            self.next_sample = max(self.next_sample, s + 1)
            self.turns.admit(g, j, self.rows[g], self.seed(g))

    def seed(self, g: int) -> int:
        return rollout_seed(self.run.cfg.seed, self.batch_of(g), self.e * self.P + g % self.P, self.G)

    def step(self) -> None:
        """One engine step (or, with nothing to decode while environments answer, on to their next join)."""
        if self.turns.due and not self.run.engine.busy():
            tick = self.turns.tick
            self.turns.idle()
            self.lag.stepped(self.turns.tick - tick, 0)
            return
        t0, running, held = time.perf_counter(), len(self.turns.live), len(self.turns.flying)
        finished = self.run.engine.step()
        self.turns.tick += 1
        for rid, sample in finished:
            if rid.startswith("probe."):
                self.scores[rid] = sample.prompt_logprobs
            else:
                self.turns.finished(rid, sample)
        took = time.perf_counter() - t0
        self.early.ran[0] += 1
        self.early.ran[1] += took
        self.meter.stepped(took, running, held, len(self.turns.queue))
        self.lag.stepped(1, running, self.run.engine.computed, time.perf_counter() - self.began)

    # ---- the exchanges ----

    def hand_over(self, b: int) -> None:
        """Batch b (scored) to the trainers; a signal seen by any rank ends the run here with a checkpoint. Given
        early (`give`), the trainers hold it already: the engine lets go of it here, with no exchange."""
        groups = list(range(self.P * (b - 1), self.P * b))
        if self.early.given >= b:
            messages, tokens = [], self.early.tokens
        else:
            messages = self.send(b, groups)
            if messages[0]["batch"] is None:  # not handed over: a signal ended the engine's batch early
                if any(m["stop"] for m in messages):
                    self.stopping(b - 1)
                return
            # the batch's tokens, every engine's share (auto's budget grows with them: rlcore/modes/stream/lag.py)
            tokens = sum(int(m["batch"].attention_mask.sum()) for m in messages if m.get("batch") is not None)
            self.early.given = b
        for g in groups:  # handed over: let go of it
            del self.turns.done[g]
            del self.rows[g]
        self.handed = b
        self.lag.handed(self.turns.tick, tokens)
        if (self.run.cfg.rollout.free_loads or self.early.on) and self.lead:
            self.waiting = listen(self.link.ready, self.link.leader)
        if any(m["stop"] for m in messages):
            self.stopping(b - 1)

    def send(self, b: int, groups: list[int]) -> list[dict]:
        """The hand-over's exchange: batch b (every engine's share, or none), errors, signals, the probe."""
        share = None
        error = self.error or self.turns.error  # the lead's own: a group scored since the agreement may have failed
        if self.lead:
            ready = self.complete(b) and error is None
            if self.E > 1:  # every engine's share of batch b, or none: their first ranks agree
                ready = all(gather(ready, self.link.leads, self.E))
            if ready:
                share, self.pending[b] = self.turns.batch(groups, self.G, b - 1, self.link.leads or ALONE)
                error = self.turns.error  # the batch itself may stop the run (all its agents failed): not handed over
                share = share if error is None else None
            if b == 1 and share is not None and dist.get_rank() == 0:
                self.probe = [row[keep].tolist() for row, keep in
                              zip(share.input_ids[:PROBE_ROWS], share.attention_mask[:PROBE_ROWS].bool())]
        messages = exchange(self.link, {"batch": share, "error": error, "stop": self.stop.received,
                                        "probe": self.probe, "loop": self.loop.state})
        if error_in(messages):
            raise RunError(error_in(messages))
        self.probe = messages[0]["probe"]
        self.loop.state = trainers_state(self.run, messages)
        if not self.lead and messages[0]["batch"] is not None:
            self.pending[b] = {}
        return messages

    def load(self, v: int) -> None:
        """Version v into the engine between two steps; the probe; the log line of step v; the control exchange."""
        run, t0 = self.run, time.perf_counter()
        # what the load costs the requests in flight: each is prefilled again, its prompt and tokens so far
        lag, flying = self.lag.at_load(self.turns.tick, self.waits()), bool(self.turns.flying)
        recomputed, early = run.engine.in_flight_tokens(), self.early.early(v)
        if self.waiting is not None:
            received(self.waiting)
            self.waiting = None
        if self.early.on:
            self.early.call(self, v)
        header = receive_weights(run, self.link)
        if header.get("error"):
            raise RunError(header["error"])
        waited = time.perf_counter() - t0 - header["receive_s"]
        self.meter.waited(waited, flying)  # requests in flight, no step: the engine is frozen
        self.lag.loaded(v, header.get("ready_s", 0.0))
        for i, seq in enumerate(self.probe):
            run.engine.submit_probe(f"probe.{v}.{i}", seq)
        while len(self.scores) < len(self.probe):
            self.began = time.perf_counter()
            self.step()
        got = [self.scores.pop(f"probe.{v}.{i}") for i in range(len(self.probe))]
        mean, gap = probe_gaps(got, header["probe"])
        if self.run.dims.rollout_ranks > 1:  # the worst engine's (a collective over the rollout ranks, at load v)
            mean, gap = all_max(mean), all_max(gap)
        metrics = self.pending.pop(v) | header["metrics"] | self.meter.metrics() | {
            "async/probe_logprob_diff_max": gap, "async/probe_logprob_diff_mean": mean, "async/engine_version": v,
            "time/sync_s": header["receive_s"], "sync/gb": header["receive_bytes"] / 1e9,
            "stream/recomputed_tokens": recomputed, "stream/early_handover": int(early)} | self.lag.metrics(*lag) \
            | self.loop.plan_metrics()
        error = self.error or self.turns.error  # the lead's own since the agreement too (the ranks agree below)
        if self.stopped:  # the run ends after this step: the eval below must find the engine empty
            self.drop()
        drift = drift_error(run.cfg, mean, gap)
        if drift:
            error = (f"async/probe_{drift} after the in-flight load of version {v}: the engine holds other weights "
                     f"than the trainers sent (transfer failed)")
        if self.run.dims.rollout_ranks > 1:  # every engine and rank evaluates (a collective over them), or none
            error = first_error(error, self.link.rollout)
        if error is None:  # an eval step drained the engine (above): the eval's own generate calls find it empty
            self.loop.evaluate(v, metrics)
        self.loop.record(v, metrics)
        messages = exchange(self.link, {"error": error, "stop": self.stop.received, "loop": self.loop.state})
        if error_in(messages):
            raise RunError(error_in(messages))
        self.loop.state = trainers_state(run, messages)
        if any(m["stop"] for m in messages):
            self.stopping(v)
        if self.loop.save_due(v):
            self.save(v)

    def stopping(self, step: int) -> None:
        """A signal: requests in flight are dropped (their groups are admitted again after the resume), then the
        checkpoint of `step`, then every rank exits 75."""
        self.drop()
        raise self.loop.preempted(step, self.save(step) if step > 0 else None)

    def drop(self) -> None:
        """Every trajectory in flight, with its whole group: the groups' admitted samples are admitted again."""
        dropped = {g * self.G + j for g in self.turns.drop() for j in range(self.G)}
        self.todo = sorted(set(self.todo) | {s for s in dropped if s < self.next_sample})

    def save(self, step: int):
        """Collective over every rank: the checkpoint of `step`, with the stream's state (nothing is running)."""
        state = {"rows": self.rows, "done": self.turns.done, "next_sample": self.next_sample, "todo": self.todo,
                 "handed": self.handed, "probe": self.probe, "pending": self.pending, "lag": self.lag.state()}
        return self.loop.save(step, {}, {"split": state}, writer=self.run.dims.rollout_ranks)

    def restore(self, state: dict) -> None:
        self.rows, self.turns.done, self.todo = state["rows"], state["done"], state["todo"]
        if "next_sample" in state:
            self.next_sample = state["next_sample"]
        else:  # a checkpoint saved while admission went by group: its group counts
            self.next_sample = state["next_group"] * self.G
            self.todo = [g * self.G + j for g in self.todo for j in range(self.G)]
        self.handed, self.probe, self.pending = state["handed"], state["probe"], state["pending"]
        self.lag.restore(state.get("lag"))


@watchdog.stage("streaming agreement", waits=True)
def gather(mine, group, size: int) -> list:
    """Every rank's `mine` in `group` (an engine's ranks at a step boundary, or the engines' first ranks at a
    hand-over), in rank order."""
    parts = [None] * size
    dist.all_gather_object(parts, mine, group=group)
    return parts


def generate_side(run: Run, link: Link, loop: Loop) -> dict:
    """Ranks [0, R): this rank's streaming engine (after the resume, or the start-of-run eval), then the loop."""
    engine = Engine(run, link, loop)
    loop.begin({})
    if run.resume_from is not None:
        engine.restore(own_state(run))
        receive_weights(run, link)  # the checkpointed weights (logged already)
        if (run.cfg.rollout.free_loads or engine.early.on) and engine.lead and engine.handed > run.engine.version:
            engine.waiting = listen(link.ready, link.leader)  # stopped after handing batch `handed` over: told next
        engine.early.given = engine.handed
    engine.meter.restart()
    return engine.serve()
