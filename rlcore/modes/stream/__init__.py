"""Streaming: the split mesh's engines never drain; new weights load between two engine steps under requests in flight.

    torchrun --nproc-per-node 3 launch/train.py recipe=demo rollout.ranks=1 rollout.stream=true \
        rollout.max_staleness=1 algorithm.tis_cap=2

The batch-level split (rlcore/modes/split.py) samples each batch whole with one version and waits for its longest
sample. Here each engine (E = rollout.ranks / T engines of T = rollout.tensor_parallel ranks) keeps up to
rollout.max_running trajectories in flight and admits the next one the step a slot frees, across step boundaries:
trajectory j of prompt group g (group_size trajectories, seeds as split's) is the stream's g x group_size + j, so
a group's samples may start steps apart, and the group is scored once all of them have ended. Engine e streams
its own P = prompts_per_step / E groups of every batch (the rows split deals it: its prompt stream), batch b
being its groups [(b-1)P, bP), in order; the trainers take batch b whole, the engines' shares in engine order,
so every batch is the same rows in the same order as colocated and split. The text below speaks of one engine;
each engine runs it on its own.

Multi-turn (rollout.env, rlcore/modes/stream/turns.py): a trajectory's turns are requests of their own and may span
versions; its environment runs on the engine's first rank, and its answers join the engine at an engine step fixed by
the data and the config (rollout.schedule=lockstep, rollout.join_steps after the step that ended the turn; the
engine waits there for a late tool) or as they arrive (continuous: not reproducible). A trajectory waiting on
its tool counts as in flight (rollout.max_running) but runs nothing in the engine; rollout.max_waiting admits that
many more, so the engine keeps running max_running while some wait, and never more: a turn ready beyond them queues,
in the order it became ready, for the next boundary with a free request. Agents (rollout.agent,
rlcore/modes/stream/agents.py): each call is a turn, and the agent's next call (or its end) joins as an answer does.

Versions and staleness (k = rollout.max_staleness). A trajectory of batch b is admitted only while the engine holds
a version >= b - 1 - k (admission control). Its tokens are then sampled by that version or newer ones, and the
trainers train batch b from version b - 1: no token is ever more than k versions old, and nothing is dropped
(`async/dropped_samples` is 0 by construction; long groups wait in the engine, they are never thrown away).
vLLM labels every token with the version the engine held at the step that sampled it (Sample.versions); the
batch carries them per token (Batch.token_versions) and per sequence its oldest (Batch.versions).

When versions load (deterministic: a function of the data and the config, never of arrival time). The engine
alternates two events, as the trainers do: hand over batch b (when all its groups are done), then load version b,
then hand over b + 1, ... Version v (v <= the batches handed) loads once the engine steps since hand-over v have
spent the lag (rlcore/modes/stream/lag.py): L = rollout.load_lag_steps engine steps, or earlier at a step boundary
with nothing in flight and no group admission may start (a load there freezes and idles nothing). Until then the
engine keeps decoding what it runs, admission blocked by the version or not: the trainers train step v meanwhile,
and the lag is chosen to cover their step. If they are later, the engine waits there with its requests frozen
(throughput/frozen_share). L=auto loads versions 1 and 2 at the earliest point (nothing running in the engine and
nothing to start, batch v + 1 complete, or admission blocked by the version; the engine waits for the trainers
there) while it measures the trainers' step and its own, then fixes the lag in predicted engine time: each step
spends its decode, base + per_seq x its running sequences, plus per_token x the prefill tokens it also computes
(vLLM's scheduler's count; whole nanoseconds, fitted to the measured steps), and the budget is
rollout.load_lag_margin (1.25) x the trainers' slowest step (the longest lag over the rollout ranks), x batch v's
tokens over the measured batch's where it has more (a trainers' step grows with its batch); and
rollout.load_lag_margin_blocked (1.1) instead of the margin once something waits for the version (admission, or the
next hand-over with its batch complete: Engine.waits), where a longer lag would only empty the engine or idle the
trainers. It prints it and keeps it in the checkpoints: a resume loads at the same steps, but two auto runs measure
apart, so a fixed L is what makes two runs identical. Save and eval steps drain first: no group starts after batch v
is handed (a started group's samples do, so that every group in flight ends), until no trajectory is in flight
(environment calls included).

Early hand-over (rollout.early_handover, one engine, deterministic loads). The next hand-over follows a load, and a
load comes the lag after its hand-over, so where batch v + 1 is complete before version v loads the trainers would
wait out the lag's excess over their step. Instead they say when they are done with step v (Link.ready), and the
engine, with batch v + 1 complete and nothing at load v that needs their state as it is (a checkpoint, an eval, an
export, a stop, an error), gives it to them at its next step boundary (Engine.give), with how far its load point is.
They start step v + 1 with it; once the point is predicted within two of their micro-batches the engine tells them
again (Link.calls), and at each engine step after, and they join the load at the poll, before the step's first
micro-batch or between two, where their wait for the engine, less what they waited in their step before (where they
wait anyway, the engine is the slower side), would be no longer than its wait for them after one more micro-batch
(rlcore.run.Trainer.poll; before its first optimizer step in any case), sending version v, which the step has not
changed yet. The engine's decisions never read whether a batch went early (it lets go of the batch's groups at the
hand-over proper), so the load points, the tokens and every number are the ones without it. A checkpoint at a load that followed an early give keeps the
batch on the engine's side, and the resume hands it over again. At a load the engine waits for at most half a
micro-batch of the trainers' less their slack, and what a prediction misses by (the engine's pace, the trainers' next
micro-batch), where without it the trainers waited for the lag.

Tensor parallelism (T > 1). vLLM needs every rank of the engine to make the same engine calls between the same
steps. The engine's first rank (the lead) runs the environments or agents, scores finished groups (its collectives
its own: rlcore.distributed.collectives.scoped(ALONE)) and hands its share over; the other ranks hold the same trajectories
without environments. At every step boundary one all_gather over the engine's ranks (Engine.sync) carries what the
decisions read: the answers or agent events that join there, the trajectories over budget, signals, the first
error and (free loads) whether the lead heard of the next version. Every rank then admits, joins, aborts, loads and
exchanges alike, and each token's version is the same on every rank.

Several engines (E > 1). Each engine's load points are functions of its own data, and every engine makes the same
exchanges in the same order (below), so their collectives pair up; an engine that reaches a hand-over first waits
there for the others (its requests frozen), as it waits for late trainers. At hand-over b the engines' leads agree
that every share of batch b is complete (or none is handed) and sum its metrics among themselves (Link.leads,
as split sums over its rollout ranks); after each load the probe's gap is the worst engine's and every engine
evaluates, or none. stream/* and the engine side's time/* are the first engine's.

Free loads (rollout.free_loads=true, not reproducible): version v loads at the first step boundary after the
trainers said it waits (a one-number message over its own gloo group, rank R -> each engine's first rank, before the
weights), or when the engine has nothing in flight and nothing to start; the engine never waits for a version it
does not need. Which tokens a version samples then follows wall-clock arrival. Staleness <= k, drains, the probe and
checkpoints hold as above.

KV and prefix cache at a load: every running request is preempted (vLLM's reset_prefix_cache with
reset_running_requests) and its prompt + tokens so far are prefilled again under the new weights before its
next token, so each token is sampled by exactly one version over KV of that version (a prefill per running
request per load). The same reset empties the prefix cache, so between two loads it holds only prefixes the
engine's current version computed: a group's prompt and a trajectory's earlier turns are read from it, and no
prefix ever reaches a request of another version.

After each load the engine scores the fixed probe batch beside the requests in flight (prompt logprobs, no
cached prefix) against the trainers' logprobs: above rollout.logprob_diff_threshold every rank stops (exit 3).

The two sides meet at these exchanges, always in this order (rlcore/modes/transfer.py): hand-over b (all_gather over
every rank: batch b, errors, stop signals, the probe), weights b (the trainers' header + units into the engine's
in-place reload), control b (all_gather: the probe's verdict, stop signals; the checkpoint when due). With the early
hand-over each load begins with a call (all_gather: the trainers' error, if their step had one), and the call that
gives batch b + 1 may come before weights b: the trainers learn from each call which it is.
Checkpoints drain (above) and save after a load: exact resume. A signal (SIGTERM/SIGUSR1) sends the engine to
its next exchange at once; in-flight trajectories are dropped (requests aborted, environment calls abandoned) and
their groups re-admitted from scratch on resume (complete and nothing lost, but not the numbers of a straight
run). Worst case from the signal to exit 75: the engine step (or, lockstep, the wait for a due tool answer, at
most rollout.env_timeout_s) in progress, one trainer step, one transfer, the probe and the save. With several
engines, a signal that reaches one engine only (Slurm's reaches them all) waits until the others come to the
same exchange: at worst until each finishes its share of the batch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch.distributed as dist

from rlcore.distributed.collectives import set_scope
from rlcore.modes.stream.engine_side import generate_side
from rlcore.modes.stream.trainer_side import train_side

if TYPE_CHECKING:
    from rlcore.modes.loop import Loop
    from rlcore.run import Run


def early_handover(cfg, dims) -> bool:
    """rollout.early_handover holds: deterministic streaming with one engine (several engines agree on each hand-over
    at its step; free loads load when the trainers are done anyway)."""
    r = cfg.rollout
    return r.stream and r.early_handover and not r.free_loads and dims.split and dims.rollout_groups == 1


def train(run: Run, loop: Loop) -> dict[str, float]:
    """Both sides of the streaming loop; returns the summary on the engine ranks ({} on the trainer ranks)."""
    if run.dims.generates(dist.get_rank()):
        set_scope(run.link.rollout)
        return generate_side(run, run.link, loop)
    set_scope(run.trainer.group)
    train_side(run, run.link, loop)
    return {}
