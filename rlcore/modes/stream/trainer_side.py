"""Streaming's trainer side (the contract is rlcore/modes/stream/__init__.py's docstring): ranks [R, W) take batch t at hand-over t,
train step t from version t - 1, send version t into the engine's in-flight load, then meet the engine at the
control exchange (the checkpoint when due or asked for). Per-token staleness is measured here.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch.distributed as dist

from rlcore.batch import Batch
from rlcore.distributed import watchdog
from rlcore.distributed.collectives import RunError, all_max, all_sum
from rlcore.modes.offpolicy import my_slice, own_state, probe_logprobs, train_step, trainers_state
from rlcore.modes.transfer import CALLING, Link, error_in, exchange, listen, received, send_weights, tell

if TYPE_CHECKING:
    from rlcore.modes.loop import Loop
    from rlcore.run import Run


def train_side(run: Run, link: Link, loop: Loop) -> None:
    """Ranks [R, W): take batch t, train step t, send version t, then the control exchange (and checkpoint)."""
    steps, k, leader = run.cfg.train.steps, run.cfg.rollout.max_staleness, dist.get_rank() == run.dims.rollout_ranks
    leads = range(0, run.dims.rollout_ranks, run.dims.tp)  # each engine's first rank: it hands the engine's share over
    probe = None
    # the trainers' waits (hand-over, the engine's load point, the control exchange) since their last step's work
    idle = {"wait_s": 0.0, "since": time.perf_counter()}

    def waiting(fn, *args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            idle["wait_s"] += time.perf_counter() - t0

    def agree(mine: dict, error: str | None = None) -> list[dict]:
        messages = exchange(link, mine | {"error": error, "stop": loop.stop.received,
                                          "loop": loop.state if leader else None})
        if error_in(messages):
            raise RunError(error_in(messages))
        loop.state = trainers_state(run, messages)
        return messages

    def save(step: int, batch: Batch | None):
        return loop.save(step, run.trained_models(), {"split": {"batch": batch, "probe": probe}},
                         writer=run.dims.rollout_ranks)

    def take(b: int) -> Batch | None:
        """Hand-over b: this rank's slice of batch b (None when a signal ended the engine's batch early)."""
        nonlocal probe
        messages = agree({"batch": None, "probe": None})
        probe = messages[0]["probe"]
        shares = [messages[lead]["batch"] for lead in leads]
        batch = my_slice(run, messages, shares) if all(s is not None for s in shares) else None
        if any(m["stop"] for m in messages):
            raise loop.preempted(b - 1, save(b - 1, batch) if b > 1 else None)
        return batch

    def control(t: int) -> None:
        """After the engine loaded version t: the checkpoint when due or asked for."""
        stopping = any(m["stop"] for m in waiting(agree, {}))
        path = save(t, None) if stopping or loop.save_due(t) else None
        if stopping:
            raise loop.preempted(t, path)

    # rollout.early_handover: the version the engine has not loaded yet while the trainers hold the next batch, and
    # (first trainer rank) the event set once the engine says how far its load point is
    early, pending = link.calls is not None, {}
    # early: this step's times between two polls (their longest is told to the engine), the last step's, the wait
    # at the load point joined in this step, and (slack) the trainers' waits in the step before
    gaps = {"last": 0.0, "max": 0.0, "step": [], "before": [], "joined_s": None, "slack": 0.0}

    def poll(final: bool, first: bool = False) -> None:
        """Between two micro-batches of the step after a version the engine has not loaded (rlcore.run.Trainer.poll),
        and before the first (`first`, on the word the early batch came with): join its load once the engine has
        said how far it is and the trainers' wait there, less their slack, would be no longer than the engine's for
        them after one more micro-batch (`come`; every trainer rank agrees on the first rank's word), and before the
        step changes a weight in any case. The engine gives a batch early only when that load needs no checkpoint,
        eval or export. What stops the run there is not this step's error: it leaves the loop."""
        now = time.perf_counter()
        if not first:
            gaps["step"].append(now - gaps["last"])
            gaps.update(max=max(gaps["max"], gaps["step"][-1]), last=now)
        heard = pending.get("heard")
        if not pending or not (final or all_max(int(heard is not None and
                                                     come(heard, now, next_gap(gaps), gaps["slack"])))):
            return
        t, header = pending["t"], pending["header"]
        pending.clear()
        try:
            if heard is not None and heard.is_set():
                received(heard)  # the engine's lead is gone: stop here, not in the load's exchange
            t0 = time.perf_counter()
            waiting(agree, {})  # the engine's call for the load of version t
            if heard is not None:  # its lead told CALLING before this exchange: the listener ends with it, before the
                with watchdog.stage("the engine's call", waits=True):  # next step's listener receives from that rank
                    heard.thread.join()
            gaps["joined_s"] = time.perf_counter() - t0  # waiting for the engine's load point
            waiting(send_weights, run, link, header)
            control(t)
        except RunError as e:
            raise LoadFailed(e) from e
        gaps["last"] = time.perf_counter()  # the load is not a micro-batch

    start = loop.begin(run.trained_models())
    if run.resume_from is not None:
        state = own_state(run)
        batch, probe = state["batch"], state["probe"]
        waiting(send_weights, run, link, {"version": start, "metrics": {}, "probe": None, "error": None})
        batch = waiting(take, start + 1) if batch is None else batch
    else:
        batch = waiting(take, 1)
    for t in range(start + 1, steps + 1):
        error, metrics, t0, waited = None, {}, time.perf_counter(), idle["wait_s"]
        run.trainer.poll = poll if early else None
        gaps.update(last=t0, max=0.0, before=gaps["step"], step=[], joined_s=None)
        try:
            if pending:  # a load point nearer than half the step's first micro-batch: wait for it there
                poll(final=False, first=True)
            metrics = train_step(run, batch, t, k) | token_staleness(batch, t)
            loop.count(t, metrics)
            loop.check_skipped(t)
        except LoadFailed as e:  # at the load of the version before: every rank stops there
            raise e.error
        except RunError as e:  # the engine must hear of it before every rank stops
            error = str(e)
        finally:
            run.trainer.poll = None
        try:
            poll(final=True)  # a version still not loaded (a step with no optimizer step, or an error in it)
        except LoadFailed as e:
            raise e.error
        served = idle["wait_s"] - waited  # the version before's load, joined inside this step: not its work
        if "time/step_s" in metrics:
            metrics["time/step_s"] -= served
        if gaps["joined_s"] is not None:  # this step joined the load before it: its wait there for the engine
            metrics["time/load_join_wait_s"] = gaps["joined_s"]
        probed = probe_logprobs(run, probe) if error is None else None
        now = time.perf_counter()
        # the wait before this step (the previous version's load point and transfer, the hand-over of this batch)
        metrics |= {"time/trainer_wait_s": idle["wait_s"],
                    "throughput/trainer_idle_share": idle["wait_s"] / max(now - idle["since"], 1e-9)}
        gaps["slack"] = idle["wait_s"]
        idle.update(wait_s=0.0, since=now)
        # ready_s: from taking the batch to the version ready to send (rollout.load_lag_steps=auto measures it)
        header = {"version": t, "metrics": metrics, "error": error, "probe": probed, "ready_s": now - t0 - served}
        # free loads: the engine hears that version t waits and loads it at its next step boundary; early hand-over:
        # that the trainers are done with step t, and it may give them batch t + 1 before it loads version t
        # (early: with this step's longest time between two micro-batches, in microseconds, over every trainer rank)
        said = round(all_max(gaps["max"]) * 1e6) if early else t
        told = [tell(link.ready, lead, said) for lead in leads] if link.ready is not None and leader else []
        if early:
            call = waiting(agree, {}, error)  # the engine's next exchange: batch t + 1, or the load of version t
            if call[0]["next"] == "batch":
                # the engine's word with the batch, timed at the exchange's end (it said it before: by the exchange)
                word = None if call[0]["left_us"] is None else (call[0]["left_us"], time.perf_counter())
                for sent in told:
                    sent.wait()
                batch = my_slice(run, call, [call[0]["batch"]])
                pending.update(t=t, header=header,
                               heard=listen(link.calls, leads[0], until=CALLING, first=word) if leader else None)
                continue
        waiting(send_weights, run, link, header)
        for sent in told:
            sent.wait()
        if error:
            raise RunError(error)
        control(t)
        if t < steps:
            batch = waiting(take, t + 1)
        if loop.export_due(t):
            loop.export(t, group=run.trainer.group, writer=run.dims.rollout_ranks)


def next_gap(gaps: dict) -> float:
    """The time to the next poll, predicted: the last one's, or the last step's at this point where that was longer
    (the micro-batches of a step come in phases, the update's longer than the logprobs' forward)."""
    i = len(gaps["step"])
    before = gaps["before"][i] if i < len(gaps["before"]) else max(gaps["before"], default=0.0)
    return max(gaps["step"][-1], before) if gaps["step"] else before


def come(heard, now: float, gap: float, slack: float = 0.0) -> bool:
    """Whether to go to the engine's load point now: it last said how far it was (microseconds of predicted wall
    time, `listen`'s number, at `heard.at`: `heard.said`), and the trainers' wait there now, less their `slack`,
    would be no longer than the engine's for them if they ran their next micro-batch first (which takes `gap`); or
    it calls (the load begins); or its lead is gone. Either wait costs a step the same where the best split of the
    GPUs balances the engines' time with the trainers' (benchmarks/async_paper.py). `slack`: what the trainers
    waited in their step before (for its batch, at its load point). Where they wait that long a step anyway the
    engine is the slower side: a wait of theirs up to it costs nothing (they then train their step after the load,
    as without the early hand-over, in the time the lag gives them), and one of the engine's costs its wall time."""
    if not heard.is_set():
        return False
    if heard.error is not None:
        return True
    number, at = heard.said
    point = at + number / 1e6
    return number == CALLING or point - now - slack <= now + gap - point


class LoadFailed(Exception):
    """A RunError at a load the trainers joined between two micro-batches: not their step's own error."""

    def __init__(self, error: RunError):
        super().__init__(str(error))
        self.error = error


def token_staleness(batch: Batch, t: int) -> dict[str, float]:
    """Per token, over every trainer rank: versions behind the weights step t trains from (t - 1), mean and max,
    and the distinct versions per sequence."""
    mask = batch.loss_mask.bool()  # [B, T]
    behind = ((t - 1) - batch.token_versions)[mask]
    per_seq = sum(len(set(v[m].tolist())) for v, m in zip(batch.token_versions, mask))
    tokens, behind_sum, spans, n = all_sum(mask.sum().item(), behind.sum().item(), per_seq, len(batch))
    return {"async/token_staleness_mean": behind_sum / max(tokens, 1),  # a batch may hold no model token
            "async/token_staleness_max": all_max(behind.max().item() if behind.numel() else 0),
            "async/versions_per_sample": spans / n}
