"""Streaming's early hand-over, the engine's side (rollout.early_handover; the design is in
rlcore/modes/stream/__init__.py's docstring, the trainers' side in trainer_side.py). Where the next batch is complete
before the engine loads the version the trainers' last step made, the trainers would wait out the lag: the engine
gives them that batch first, with how far its load point is (`give`), tells them again once it is predicted within
two micro-batches of theirs and at each engine step after (`tell_due`), and begins each load with a call they wait
in (`call`). None of it changes what the engine decides: the load points, the tokens and every number are the
ones without it.
"""
from __future__ import annotations

import time

from rlcore.distributed.collectives import RunError
from rlcore.modes.offpolicy import trainers_state
from rlcore.modes.transfer import CALLING, Link, error_in, exchange, received, tell

# Each method takes `e`, the Engine it serves (rlcore/modes/stream/engine_side.py, which imports this file).


class EarlyHandover:
    """What an engine keeps for the early hand-over: the last batch given to the trainers (beyond the one handed over
    while the load of `handed` is due), its tokens, the trainers' longest time between two micro-batches as they last
    said it, the tells of how far the load point is sent since (and how far it was last predicted), and the engine's
    steps and their seconds (a fixed lag, in time)."""

    def __init__(self, link: Link):
        self.on = link.calls is not None  # one engine, deterministic loads (rlcore/modes/stream/__init__.py)
        self.given, self.tokens, self.gap_ns, self.told, self.left_ns = 0, 0, 0, [], None
        # the engine step of the last tell and when it was (perf_counter_ns): a tell a step, and while the engine
        # waits for environments, one per time between two of the trainers' polls (they read no more often)
        self.told_at = (None, 0)
        self.ran = [0, 0.0]

    def early(self, handed: int) -> bool:
        """The trainers hold batch handed + 1 already."""
        return self.given > handed

    def due(self, e) -> bool:
        """The trainers said they are done with step `handed`, batch handed + 1 is complete, and the load of `handed`
        needs nothing of theirs but the version (no checkpoint, eval or export at it, no stop, no error)."""
        v = e.handed
        return (self.on and self.given == v and e.arrived and v < e.steps and e.complete(v + 1)
                and not (e.stopped or e.error or e.turns.error or e.draining() or e.evals(v)
                         or e.loop.save_due(v) or e.loop.export_due(v)))

    def give(self, e, b: int) -> None:
        """Batch b to the trainers, who are done with step b - 1, before version b - 1 loads: they start step b with
        it and send version b - 1 at the engine's load point. Its groups stay the engine's until the hand-over proper
        (Engine.hand_over lets go of them), so a checkpoint before it keeps them. A batch whose agents failed is not
        given: the trainers wait for the load, whose control exchange stops the run."""
        groups, share, left_us = list(range(e.P * (b - 1), e.P * b)), None, None
        if e.lead:
            share, e.pending[b] = e.turns.batch(groups, e.G, b - 1)
            left = self.left_wall_ns(e)
            left_us = None if left is None else max(left // 1000, 0)
        if e.any_rank(e.turns.error is not None):
            e.pending.pop(b, None)
            return
        # left_us: how far the load point of version b - 1 is, as `tell` says it, for the trainers' poll before the
        # first micro-batch of step b (trainer_side.train_side)
        messages = exchange(e.link, {"next": "batch", "batch": share, "error": None, "stop": False,
                                     "loop": e.loop.state, "left_us": left_us})
        if error_in(messages):
            raise RunError(error_in(messages))
        e.loop.state = trainers_state(e.run, messages)
        if e.lead:
            self.gap_ns = 1000 * received(e.waiting)  # microseconds, in the trainers' "done" signal
        else:
            e.pending[b] = {}
        self.given, self.told, e.waiting = b, [], None
        self.tokens = sum(int(m["batch"].attention_mask.sum()) for m in messages if m.get("batch") is not None)

    def tell_due(self, e) -> bool:
        """The trainers hold the next batch and the load point of version `handed` is predicted within two of their
        longest times between two micro-batches, or they were told before: the lead tells them how far it is (`tell`),
        again at each engine step (and while it waits for environments without a step, once per such time of
        theirs: they read it no more often), so that the last word they act on has the engine's latest pace. They
        come to it at the poll where their wait there, less their slack, would be no longer than the engine's for
        them after one more micro-batch (trainer_side.come), so that the engine waits at most half a micro-batch of
        theirs and what the prediction misses by. When, and what it says, do not change what the engine does."""
        if not (e.lead and self.early(e.handed)):
            return False
        tick, at = self.told_at
        if self.told and tick == e.turns.tick and time.perf_counter_ns() - at < self.gap_ns:
            return False
        self.left_ns = self.left_wall_ns(e)
        return self.left_ns is not None and (bool(self.told) or self.left_ns <= 2 * self.gap_ns)

    def left_wall_ns(self, e) -> int | None:
        """How far the load point of version `handed` is, in wall time (LoadLag.left_wall_ns, a fixed lag's steps at
        the mean of the engine's steps so far)."""
        return e.lag.left_wall_ns(e.waits(), round(self.ran[1] / max(self.ran[0], 1) * 1e9))

    def tell(self, e) -> None:
        self.told_at = (e.turns.tick, time.perf_counter_ns())
        self.told.append(tell(e.link.calls, e.link.leader, max(self.left_ns // 1000, 0)))  # microseconds

    def call(self, e, v: int) -> None:
        """The load of version v begins with an exchange the trainers wait in: after their step v (their error, if it
        had one, stops every rank here), or, holding batch v + 1, at the poll before or between its micro-batches
        that `tell_due` says (CALLING, told now, ends the tells: the trainers come at their next poll)."""
        told, self.told = self.told, []
        if self.early(v) and e.lead:
            told.append(tell(e.link.calls, e.link.leader, CALLING))
        messages = exchange(e.link, {"next": "load", "error": None, "stop": False, "loop": e.loop.state})
        for sent in told:
            sent.wait()
        if error_in(messages):
            raise RunError(error_in(messages))
        e.loop.state = trainers_state(e.run, messages)
