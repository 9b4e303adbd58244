"""The split mesh's two channels between rollout and trainer ranks (rlcore/modes/split.py drives them): the weights,
unit by unit from the first trainer rank into each engine's in-place reload, and the batches with errors and stop
signals, over gloo between every rank. Every rank makes the groups; each side calls its half in the same order."""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from rlcore.distributed import watchdog
from rlcore.distributed.collectives import PeerGone
from rlcore.distributed.parallel import device_type, new_group
from rlcore.models.weights import checkpoint_units

if TYPE_CHECKING:
    from rlcore.run import Run


@dataclass
class Link:
    """The process groups of a split mesh, made on every rank in the same order (new_group is collective)."""
    rollout: object  # ranks [0, R): the rollout side's own collectives
    weights: object  # rank R and ranks [0, R): the transfer's broadcasts (the default backend: NCCL on GPU)
    headers: object  # the same ranks over gloo: per-unit names, shapes and dtypes, the header
    objects: object  # every rank over gloo: batches, errors and stop signals
    leader: int  # R, the first trainer rank: it sends the weights
    # streaming (rlcore/modes/stream/), several engines: their first ranks (the batch's metrics: the default backend, as
    # `rollout`, since rlcore.distributed.collectives' sums are device tensors)
    leads: object = None
    # rollout.free_loads or rollout.early_handover: rank R and each engine's first rank over gloo, "version v waits"
    ready: object = None
    # rollout.early_handover: the same ranks, the other way: "my load point is this far" (microseconds, told at
    # each engine step; CALLING: the load begins)
    calls: object = None

    @staticmethod
    def make(rollout_ranks: int, world: int, tp: int = 1, stream: bool = False, free_loads: bool = False,
             early: bool = False) -> Link:
        side, leads = list(range(rollout_ranks)), list(range(0, rollout_ranks, tp))
        return Link(new_group(side), new_group(side + [rollout_ranks]), new_group(side + [rollout_ranks], "gloo"),
                    new_group(list(range(world)), "gloo"), rollout_ranks,
                    new_group(leads) if stream and len(leads) > 1 else None,
                    new_group(leads + [rollout_ranks], "gloo") if free_loads or early else None,
                    new_group(leads + [rollout_ranks], "gloo") if early else None)


# ---- the two halves of an exchange -------------------------------------------------------------------------

@watchdog.stage("send weights")
def send_weights(run: Run, link: Link, header: dict) -> tuple[float, int]:
    """Trainer ranks (a collective over them, for the FSDP2 gathers); rank R broadcasts. Returns (seconds,
    bytes). With an error in the header nothing follows it."""
    t0, leader = time.perf_counter(), dist.get_rank() == link.leader
    if leader:
        dist.broadcast_object_list([header], src=link.leader, group=link.headers)
    if header.get("error"):
        return 0.0, 0
    sent = 0
    for unit in checkpoint_units(run.trainer.policy, dtype=run.engine.dtype):
        if leader:
            meta = [(name, tuple(t.shape), t.dtype) for name, t in unit.items()]
            dist.broadcast_object_list([meta], src=link.leader, group=link.headers)
            for flat in _flat_by_dtype(unit):
                dist.broadcast(flat, src=link.leader, group=link.weights)
                sent += flat.numel() * flat.element_size()
    if leader:
        dist.broadcast_object_list([None], src=link.leader, group=link.headers)
    return time.perf_counter() - t0, sent


@watchdog.stage("receive weights", waits=True)
def receive_weights(run: Run, link: Link) -> dict:
    """Rollout ranks: the header, then (without an error) the weights, streamed into the engine's reload.
    The engine's version becomes the header's."""
    box = [None]
    dist.broadcast_object_list(box, src=link.leader, group=link.headers)
    header = box[0]
    if header.get("error"):
        return header
    t0, received = time.perf_counter(), [0]

    def stream():
        while True:
            dist.broadcast_object_list(box, src=link.leader, group=link.headers)
            if box[0] is None:
                return
            meta = box[0]
            for dtype in sorted({d for _, _, d in meta}, key=str):
                entries = [(n, s) for n, s, d in meta if d == dtype]
                flat = torch.empty(sum(math.prod(s) for _, s in entries), dtype=dtype, device=device_type())
                dist.broadcast(flat, src=link.leader, group=link.weights)
                received[0] += flat.numel() * flat.element_size()
                offset = 0
                for name, shape in entries:
                    yield name, flat[offset:offset + math.prod(shape)].view(shape)
                    offset += math.prod(shape)

    weights = stream()
    run.engine.load(weights)
    for _ in weights:  # whatever the reload did not ask for: the broadcasts must still pair up
        pass
    run.engine.version = header["version"]
    header["receive_s"], header["receive_bytes"] = time.perf_counter() - t0, received[0]
    return header


def _flat_by_dtype(unit: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """One flat buffer per dtype, in the order `receive_weights` reads them (dtypes sorted by name)."""
    dtypes = sorted({t.dtype for t in unit.values()}, key=str)
    return [torch.cat([t.reshape(-1) for t in unit.values() if t.dtype == d]) for d in dtypes]


@watchdog.stage("exchange", waits=True)
def exchange(link: Link, mine: dict) -> list[dict]:
    """Every rank's message to every rank (a collective over the whole world, gloo)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine, group=link.objects)
    return out


CALLING = -1  # the engine's last word to the trainers before a load, with the early hand-over: it begins (no distance)


def listen(group, src: int, until: int | None = None, first: tuple[int, float] | None = None) -> threading.Event:
    """Set once `src` sends one number over `group`, which it keeps as `.number` (streaming: the trainers' "version
    v waits", or with the early hand-over "done, and our micro-batches take this long", to an engine's first rank,
    Link.ready). With `until`, it goes on receiving, `.number` and `.at` the latest (and `.said`, both as one pair
    another thread reads whole), until `src` sends `until` (the engine's "my load point is this far", told again at
    each engine step, then its call: to the trainers, Link.calls). `first`: a (number, at) already heard another
    way (the engine's word in the early hand-over's message), the latest until `src` sends one.
    A thread receives it: gloo's irecv only completes inside wait(), so polling it from a loop would never see it."""
    arrived = threading.Event()
    arrived.number, arrived.error, arrived.at = None, None, None  # at: when it arrived (time.perf_counter)
    arrived.said = (None, None)
    if first is not None:
        arrived.number, arrived.at = first
        arrived.said = first
        arrived.set()

    def receive() -> None:
        number = torch.zeros(1, dtype=torch.long)
        while True:
            try:
                dist.recv(number, src=src, group=group)
                arrived.number = int(number)
            except Exception as e:  # src's process is gone: whoever waits for the number hears that, not nothing
                arrived.error = f"rank {src} is gone: its connection closed before it sent its signal ({said(e)})"
            arrived.at = time.perf_counter()
            arrived.said = (arrived.number, arrived.at)
            arrived.set()
            if until is None or arrived.error is not None or arrived.number == until:
                return

    arrived.thread = threading.Thread(target=receive, name="rlcore-stream-listen", daemon=True)
    arrived.thread.start()
    return arrived


def received(arrived: threading.Event) -> int:
    """The number `listen` received, once it has; PeerGone if the receive failed (the sender's process died: this
    rank stops with that line instead of waiting for a signal that cannot come)."""
    arrived.wait()
    if arrived.error is not None:
        raise PeerGone(arrived.error)
    return arrived.number


def tell(group, dst: int, number: int) -> Told:
    """The other end of `listen`: one number to `dst` over `group` (wait() the returned send)."""
    return Told(dst, dist.isend(torch.tensor([number]), dst=dst, group=group))


@dataclass
class Told:
    dst: int
    work: object

    def wait(self) -> None:
        """Until the number is sent; PeerGone, as `received`, if `dst`'s process is gone (its connection closed)."""
        try:
            self.work.wait()
        except Exception as e:
            raise PeerGone(f"rank {self.dst} is gone: its connection closed before it took a signal ({said(e)})") from e


def said(e: Exception) -> str:
    """gloo's error, its first words: "[file:line] Connection closed by peer ..." -> "Connection closed by peer"."""
    return (str(e).splitlines() or [type(e).__name__])[0].split("] ", 1)[-1].split(". ")[0]


def error_in(messages: list[dict]) -> str | None:
    return next((m["error"] for m in messages if m and m.get("error")), None)


