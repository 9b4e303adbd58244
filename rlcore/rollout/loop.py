"""The rank's one event loop, on which agents and async environments run for the whole run (run_loop), and how
the engine's thread hands it work: post, one wake-up of the loop for a burst of callbacks (the agents a rollout
starts, the answers an engine step gives them)."""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
import weakref
from typing import Callable

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()
# Threads for the loop's blocking work: asyncio.to_thread in an agent (a synchronous framework's, e.g. smolagents'
# agent.run) takes one for the agent's whole run. asyncio's default pool (cores + 4: 6 here) let only 6 of a rank's
# agents run at once, and where the engine waits for an agent's next call (streaming, lockstep) the 7th never
# started and the first 6 never got their answers: every agent timed out. Threads start only as they are needed.
LOOP_THREADS = 1024


def run_loop() -> asyncio.AbstractEventLoop:
    """The rank's one event loop for coroutine calls (agents, async environments), in a daemon thread, for the
    whole run. What an agent or its library keeps between calls (an async HTTP client and its connection pool,
    LangChain's per-process client among them) is bound to the loop it was made on, so every rollout's calls run
    on this loop, which is never closed. (A call that blocks the loop for good, a synchronous sleep in an agent,
    holds up every later call too: they time out, rollout.env_timeout_s, and the trajectories fail.)"""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            _LOOP.set_default_executor(cf.ThreadPoolExecutor(LOOP_THREADS, thread_name_prefix="rlcore-to-thread"))
            threading.Thread(target=_LOOP.run_forever, name="rlcore-env-async", daemon=True).start()
        return _LOOP


class _Posts:
    """Callbacks handed to one event loop from other threads, a burst of them with one wake-up of the loop. A
    wake-up writes to the loop's socket, a system call (~0.07 ms here); one for each agent started and each call
    answered cost the tool task's agent rollout ~5% on 2 CPU cores (benchmarks/RESULTS.md)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = weakref.ref(loop)  # (kept in _POSTS by the loop: no reference back to it)
        self.lock, self.queued = threading.Lock(), []

    def __call__(self, fn: Callable, *args) -> None:
        with self.lock:
            self.queued.append((fn, args))
            if len(self.queued) > 1:  # a wake-up is on its way: it runs this one too
                return
        loop = self.loop()
        try:
            loop.call_soon_threadsafe(self._run)
        except (AttributeError, RuntimeError):  # the loop is gone or closed: nothing waits on it
            pass

    def _run(self) -> None:
        with self.lock:
            calls, self.queued = self.queued, []
        for fn, args in calls:
            try:
                fn(*args)
            except Exception as e:  # as a callback of call_soon's would be: reported, and the others still run
                asyncio.get_running_loop().call_exception_handler({"message": f"{fn!r} raised", "exception": e})


_POSTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Posts] = weakref.WeakKeyDictionary()


def post(loop: asyncio.AbstractEventLoop, fn: Callable, *args) -> None:
    """loop.call_soon_threadsafe(fn, *args), with one wake-up of the loop for a burst of them (_Posts)."""
    with _LOOP_LOCK:
        posts = _POSTS.get(loop)
        if posts is None:
            posts = _POSTS[loop] = _Posts(loop)
    posts(fn, *args)
