"""No run hangs in silence: each rank says which stage it is in, and a run where no rank has finished a stage
for train.watchdog_s seconds stops every rank with one line that names the rank behind.

    with watchdog.stage("reward"):     # in a stage module (rlcore/rollout/collect.py, update.py, ...)
        scores = reward_fn(...)

When it fires, every rank prints (rank 1 stuck in a reward function; rank 0 waits in a collective):

    rlcore: watchdog: no rank finished a stage for 15 s (train.watchdog_s=15): this rank (0) is in 'rollout'
    for 15.2 s; rank 1 is behind, in 'rollout > reward' for 15.2 s (its stack is in its log); every rank exits 3

the rank behind writes the Python stack of all its threads to its log, and every rank leaves with os._exit(3)
on its own (a stuck main thread never reaches an exception handler, and launch/slurm.sbatch runs with
--kill-on-bad-exit=0: Slurm frees the nodes only when every task has exited).

How: a stage is a local variable the main thread sets (no I/O, so markers cost nothing). A side thread per rank
publishes it, every `poll` seconds, to the rendezvous store of torchrun (a TCP key-value store every rank
reaches without a collective, so it answers while the main thread blocks in one), and adds the stages it
finished to one shared counter. When the counter has not moved for train.watchdog_s by this rank's clock, or
another rank has fired, it reads every rank's stage and names the one whose stage began first (by the ranks'
wall clocks: across nodes as exact as their time sync). If the side thread itself cannot run (a C call that
never releases the GIL), faulthandler's own timer, re-armed by the thread at each poll, dumps every thread and
exits 1.
"""
from __future__ import annotations

import faulthandler
import json
import math
import os
import sys
import threading
import time
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as dist

EXIT_CODE = 3  # launch/train.py's EXIT_RUN_STOPPED: the run stopped itself
# Process groups time out this many times train.watchdog_s after the watchdog, never before it: in a split mesh
# a rank waits in one collective through several stages of the other side (at k=0 the rollout ranks wait
# through the trainers' logprobs, update and send), each shorter than train.watchdog_s. Never below 5 min:
# startup skews (a recipe's prepare on rank 0, a slower node's model load) are not stages.
GROUP_TIMEOUT_FACTOR, GROUP_TIMEOUT_FLOOR_S = 3, 300.0

_stack: list[str] = []  # the stages this rank is in, outermost first
_waits = 0  # > 0 while this rank waits in a collective for the others (it cannot be the rank behind)
_since = time.time()  # wall time of this rank's last stage change
_finished = 0  # stages this rank has finished
_last = ""  # the stage it finished last
_watch: Watchdog | None = None


@contextmanager
def stage(name: str, waits: bool = False):
    """Mark the code inside as stage `name` of this rank (nested stages read 'outer > inner'). `waits`: a
    collective, where this rank waits for the others: the rank behind is looked for among the ranks that do not."""
    global _since, _finished, _last, _waits
    _stack.append(name)
    _since, _waits = time.time(), _waits + waits
    try:
        yield
    finally:
        _stack.pop()
        _since, _finished, _last, _waits = time.time(), _finished + 1, name, _waits - waits


def where() -> str:
    """This rank's stage as the watchdog's line says it."""
    stages = tuple(_stack)
    return f"'{' > '.join(stages)}'" if stages else f"no stage (after '{_last}')" if _last else "no stage"


def _state() -> dict:
    return {"stage": where(), "since": _since, "waits": _waits > 0}


def _says(state: dict, now: float) -> str:
    return f"{'waits' if state['waits'] else 'is'} in {state['stage']} for {now - state['since']:.1f} s"


def group_timeout(watchdog_s) -> timedelta | None:
    """The process groups' timeout for train.watchdog_s; None (torch's default) for a value preflight refuses."""
    if not isinstance(watchdog_s, (int, float)) or not 0 < watchdog_s < math.inf:
        return None
    return timedelta(seconds=max(GROUP_TIMEOUT_FACTOR * watchdog_s, GROUP_TIMEOUT_FLOOR_S))


class Watchdog:
    """The side thread of one rank. `store` is shared by every rank (one per run and restart)."""

    def __init__(self, seconds: float, store, rank: int, world: int):
        self.seconds, self.store, self.rank, self.world = seconds, store, rank, world
        self.poll = min(5.0, seconds / 10)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="rlcore-watchdog", daemon=True)

    def _publish(self, state: dict) -> None:
        self.store.set(f"rank/{self.rank}", json.dumps(state))

    def _watch(self) -> None:
        counted, total, moved = 0, -1, time.monotonic()
        states: list[dict | None] = [None] * self.world
        while not self.done.wait(self.poll):
            faulthandler.dump_traceback_later(self.seconds + 2 * self.poll, exit=True, file=sys.__stderr__)
            try:
                self._publish(_state())
                now_total = self.store.add("finished", _finished - counted)
                counted = _finished
                fired = self.store.add("fired", 0)
            except (RuntimeError, OSError):  # the store is unreachable: only this rank's own progress counts
                now_total, fired = total, 0
            if now_total != total:
                total, moved = now_total, time.monotonic()
            if fired or time.monotonic() - moved >= self.seconds:
                self._fire(states)

    def _fire(self, states: list) -> None:
        try:
            self.store.add("fired", 1)
            states = [json.loads(s) for s in self.store.multi_get([f"rank/{r}" for r in range(self.world)])]
        except (RuntimeError, OSError):  # the store is gone: say what this rank knows
            states[self.rank] = _state()
        now = time.time()
        running = {r: s for r, s in enumerate(states) if s and not s.get("done")}
        # The rank behind: of those not waiting for the others, the one in its stage longest.
        working = {r: s for r, s in running.items() if not s["waits"]} or running
        behind = min(working, key=lambda r: working[r]["since"], default=self.rank)
        mine = f"this rank ({self.rank}) {_says(_state(), now)}"
        if behind == self.rank:
            other = "it is the rank behind (its stack follows)"
        else:
            other = f"rank {behind} is behind, it {_says(running[behind], now)} (its stack is in its log)"
        line = (f"rlcore: watchdog: no rank finished a stage for {self.seconds:g} s (train.watchdog_s="
                f"{self.seconds:g}): {mine}; {other}; every rank exits {EXIT_CODE}")
        # One write of the whole line: torchrun runs ranks with -u, where print() writes the text and its newline
        # in two syscalls, and another rank's line can land between them (two lines merged into one).
        sys.__stderr__.write(line + "\n")
        sys.__stderr__.flush()
        record(line)
        if behind == self.rank:
            faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)
        sys.__stderr__.flush()
        # Leave once every rank has said its line (each sees "fired" within a poll), or after two polls: the
        # first exit makes torchrun terminate the other ranks of its node.
        deadline = time.monotonic() + 2 * self.poll + 1
        try:
            self.store.add("said", 1)
            while self.store.add("said", 0) < len(running) and time.monotonic() < deadline:
                time.sleep(0.05)
        except (RuntimeError, OSError):
            pass
        os._exit(EXIT_CODE)


def record(line: str) -> None:
    """torchrun's failure report prints the first failed rank's TORCHELASTIC_ERROR_FILE: make it this line."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump({"message": line, "timestamp": int(time.time())}, f)


def _store(seconds: float):
    """The store every rank of this run and restart shares: torchrun's (MASTER_ADDR:MASTER_PORT, where the
    default process group met), or an in-process one when this rank is alone."""
    world = dist.get_world_size()
    prefix = f"rlcore/watchdog/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    if world == 1:
        return dist.PrefixStore(prefix, dist.HashStore())
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=timedelta(seconds=max(10.0, min(60.0, seconds))))
    return dist.PrefixStore(prefix, store)


def start(seconds: float) -> None:
    """Start this rank's watchdog (after init_process_group; every rank calls it)."""
    global _watch, _since
    stop()
    _since = time.time()
    _watch = Watchdog(seconds, _store(seconds), dist.get_rank(), dist.get_world_size())
    _watch._publish(_state())
    _watch.thread.start()


def stop() -> None:
    """Stop this rank's watchdog (every exit of a run, error or not); other ranks no longer name it."""
    global _watch
    if _watch is None:
        return
    _watch.done.set()
    _watch.thread.join()
    faulthandler.cancel_dump_traceback_later()
    try:
        _watch._publish(_state() | {"done": True})
    except (RuntimeError, OSError):
        pass
    _watch = None
