"""The few collectives every stage uses to keep ranks in step: agree on an error, sum or max a number.

Every rank calls each of these at the same point with its own value; each returns the same result on
every rank, so a decision taken from it (stop, skip, keep drawing) is taken by all ranks together.

"Every rank" is the ranks of this rank's role: all of them when colocated; in a split mesh
(rlcore/modes/split.py) the rollout ranks among themselves and the trainer ranks among themselves (`set_scope`),
so the stages run unchanged on either side.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from rlcore.distributed import watchdog
from rlcore.distributed.parallel import device_type


_scope = None  # the process group these collectives run over; None = the whole world
ALONE = object()  # a scope of this rank alone: each collective returns this rank's own value (`alone`)


class RunError(RuntimeError):
    """The run must stop (every rank raises it together, with the same one-line message)."""


class PeerGone(RunError):
    """This rank's alone: a rank it waited for has died (its connection closed). It stops with the line at once; the
    others stop by their own errors or by the launcher's signal, so it leaves without waiting for them."""


class Preempted(RunError):
    """SIGTERM / SIGUSR1: every rank finished the step and a checkpoint was written; requeue to continue."""


def set_scope(group) -> None:
    """Run this rank's collectives over `group` from now on (None: the whole world)."""
    global _scope
    _scope = group


@contextlib.contextmanager
def scoped(group):
    """This rank's collectives over `group` while in the block (ALONE: over itself alone). The streaming engines'
    first ranks score a group the moment it ends, a moment no other rank shares, and sum a batch's metrics among
    themselves only (rlcore/modes/stream/turns.py)."""
    global _scope
    outer, _scope = _scope, group
    try:
        yield
    finally:
        _scope = outer


@watchdog.stage("agree", waits=True)
def first_error(error: str | None, group=None) -> str | None:
    """Collective over `group` (None: the whole world): every rank's error or None; returns the first error
    (by rank), the same on every rank, so every rank can raise it together and none waits forever. The one
    way ranks agree on an error: the stages (`agree`), preflight (bad input) and checkpoints (save errors)."""
    if group is ALONE:
        return error
    errors = [None] * dist.get_world_size(group)
    dist.all_gather_object(errors, error, group=group)
    return next((e for e in errors if e), None)


def agree(error: str | None) -> None:
    """If any rank of this rank's scope hit an error, every rank raises the first one as a RunError."""
    first = first_error(error, _scope)
    if first:
        raise RunError(first)


@watchdog.stage("all_sum", waits=True)
def all_sum(*values: float) -> list[float]:
    if _scope is ALONE:
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=device_type())
    dist.all_reduce(t, group=_scope)
    return t.tolist()


@watchdog.stage("all_max", waits=True)
def all_max(value: float) -> float:
    if _scope is ALONE:
        return float(value)
    t = torch.tensor([value], dtype=torch.float64, device=device_type())
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=_scope)
    return t.item()


def all_min(value: float) -> float:
    return -all_max(-value)


@watchdog.stage("reduce_sum", waits=True)
def reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over every rank (the `reduce` algorithms use for global statistics)."""
    out = t.to(device_type(), torch.float64)
    if _scope is not ALONE:
        dist.all_reduce(out, group=_scope)
    return out.cpu()
