"""Environments: what a user implements to make a rollout multi-turn (a game, a tool, a sandbox).

One instance per trajectory, made by the recipe's factory from the dataset row (every column, hidden ones
such as a secret or a test suite included):

    class Guess(Env):
        max_turns = 4                       # model turns at most (rollout.max_turns may lower it)
        def __init__(self, row): self.secret = int(row["secret"])
        def step(self, action, action_ids):
            guess = int(action) if action.isdigit() else None
            if guess == self.secret:
                return Step("=", reward=1.0, done=True)
            return Step("?" if guess is None else "+" if guess < self.secret else "-")

    rollout.env = "my_envs.py:Guess"        # the factory: a callable, "module:name" or "file.py:name"

The loop (rlcore.rollout.turns) calls `reset()` once (it may return prompt tokens to append, or PromptText: text
for the end of the prompt's user message, rendered again), then after every model turn `step(action_text,
action_ids)` with that turn's decoded text (special tokens dropped) and its exact token ids, until `done`,
the turn limit or the token budget ends the trajectory. `step` returns a `Step` or a tuple
(observation, reward, done). An observation is text (encoded once, without special tokens), token ids, or
chat messages ([{"role": "tool", "content": ...}], encoded by rlcore.rollout.chat for the trained model's
template); it is appended after the model's tokens and never trained on. A tool is an environment that
parses the action and answers with the tool's output; a malformed call should be answered with an
observation that says so, not an exception: an exception stops the run (it is a bug in the environment).

`stop` lists strings, each one token of the tokenizer, that end a model turn besides EOS (e.g. a tool-call
token); the stop token stays in the model's tokens. `close()` is called once the trajectory is scored.

Every call into an environment runs with limits it can read, `limits()` and `time_left()`: the turn's
deadline (rollout.turn_deadline_s, and never later than the moment the loop would give up on the call:
rollout.env_timeout_s or the continuous schedule's budgets) and the tool calls one turn may run
(rollout.max_tool_calls). rlcore's tools keep to them (rlcore.rollout.tools); a long-running environment
should too, since a call the loop gives up on cannot be stopped (Python cannot stop a thread).

Why one file of ~330 lines: the protocol users implement and the runner that calls it with deadlines read side by
side: the contract and its enforcement.
"""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextvars
import inspect
import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from rlcore.config import RolloutConfig
from rlcore.config.errors import describe
from rlcore.rollout.loop import post, run_loop


@dataclass
class Step:
    observation: str | list[int] | list[dict] | None = None  # appended after the model's turn (never trained on)
    reward: float = 0.0  # added to the trajectory's environment reward (the reward part "env")
    done: bool = False  # the trajectory ends after this step


@dataclass
class PromptText:
    """What reset() may return instead of prompt tokens: text added to the end of the prompt's user message,
    after which the prompt is rendered again (the chat template with the environment's tools, or the plain
    text tokenized). A prompt it makes longer than data.max_prompt_tokens fails its trajectory."""
    text: str


class Env:
    """Optional base class: an environment only needs `step`; these are the defaults of the rest."""

    max_turns: int = 1  # model turns at most
    stop: tuple[str, ...] = ()  # one-token strings that end a model turn besides EOS (kept in the tokens)

    def reset(self) -> str | list[int] | list[dict] | PromptText | None:
        """Extra prompt tokens before the first model turn (text, ids or chat messages), text for the prompt's
        user message (PromptText), or None."""
        return None

    def step(self, action: str, action_ids: list[int]) -> Step:
        raise NotImplementedError

    def close(self) -> None:
        pass


class EnvError(RuntimeError):
    """An environment misbehaved; the message is one line naming the environment, the sample and the turn."""


def as_step(result: Any) -> Step:
    """A Step, or a tuple (observation, reward, done), checked; anything else is an EnvError."""
    if isinstance(result, tuple) and len(result) == 3:
        result = Step(*result)
    if not isinstance(result, Step):
        got = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
        raise EnvError(f"step() returned {got}; it must return Step(observation, reward, done) or a "
                       f"tuple (observation, reward, done)")
    obs = result.observation
    ok_obs = obs is None or isinstance(obs, str) or (isinstance(obs, list) and (
        all(isinstance(x, int) and not isinstance(x, bool) for x in obs) or all(isinstance(x, dict) for x in obs)))
    if not ok_obs:
        raise EnvError(f"step() returned an observation of type {type(obs).__name__}; it must be text, "
                       f"a list of token ids or a list of chat messages")
    try:
        reward = float(result.reward)
    except (TypeError, ValueError):
        raise EnvError(f"step() returned reward {result.reward!r}, not a number") from None
    if reward != reward or abs(reward) == float("inf"):
        raise EnvError(f"step() returned reward {reward} (NaN or inf)")
    return Step(obs, reward, bool(result.done))


def check_env(env: Any, spec: str, vocab: Callable[[str], list[int]]) -> tuple[int, list[int]]:
    """Startup check of one instance: returns (its turn limit or 0 if it declares none, stop token ids)."""
    if not callable(getattr(env, "step", None)):
        raise ValueError(f"rollout.env '{spec}' returned a {type(env).__name__} without a step() method; an "
                         f"environment needs step(action_text, action_ids) -> (observation, reward, done)")
    max_turns = getattr(env, "max_turns", 0)  # 0: the environment sets no limit of its own
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or (hasattr(env, "max_turns") and max_turns < 1):
        raise ValueError(f"rollout.env '{spec}': max_turns must be a whole number >= 1 (got {max_turns!r})")
    stop_ids = []
    for s in getattr(env, "stop", ()) or ():
        ids = vocab(s) if isinstance(s, str) else None
        if not ids or len(ids) != 1:
            raise ValueError(f"rollout.env '{spec}': stop token {s!r} is not one token of the tokenizer "
                             f"(it encodes to {ids}); stop tokens must each be a single token")
        stop_ids.append(ids[0])
    return max_turns, stop_ids


# ---- limits of one environment call ------------------------------------------------------------------------

ANSWER_S = 0.25  # tools stop this long (at most a quarter of the call's time) before the loop gives up on the
# call, so that their answer, and the sandbox worker they held, are back before it does


@dataclass(frozen=True)
class Limits:
    deadline: float = math.inf  # time.monotonic() by which the call should have returned
    max_tool_calls: int = RolloutConfig.max_tool_calls  # tool calls one turn may run

    @staticmethod
    def starting_now(seconds: float, max_tool_calls: int, budget_s: float = math.inf) -> Limits:
        """The limits of a call that the loop gives up on `seconds` from now, or when a budget of the whole
        rollout ends `budget_s` from now (the continuous schedule's), whichever comes first."""
        now = time.monotonic()
        return Limits(min(now + seconds - min(ANSWER_S, seconds / 4), now + budget_s - ANSWER_S), max_tool_calls)


# Outside a rollout (a test, a notebook) there is no deadline and the config's default cap.
_limits: contextvars.ContextVar[Limits] = contextvars.ContextVar("rlcore_env_limits", default=Limits())


def limits() -> Limits:
    """The limits of the environment call running in this thread (or asyncio task)."""
    return _limits.get()


def time_left() -> float:
    """Seconds until this call's deadline (inf outside a rollout); <= 0 once it has passed."""
    return _limits.get().deadline - time.monotonic()


def within(limits: Limits, fn: Callable, *args) -> Any:
    """fn(*args) with `limits` as this thread's limits, the previous ones restored after."""
    token = _limits.set(limits)
    try:
        return fn(*args)
    finally:
        _limits.reset(token)


async def awithin(limits: Limits, fn: Callable, *args) -> Any:
    """await fn(*args) with `limits` as this asyncio task's limits."""
    token = _limits.set(limits)
    try:
        return await fn(*args)
    finally:
        _limits.reset(token)


@dataclass
class Outcome:
    value: Any = None
    error: str | None = None  # "ExceptionType: message" of an exception the call raised
    timed_out: bool = False
    seconds: float = 0.0


def call_all(calls: list[Callable[[], Any]], timeout_s: float, workers: int, turn_s: float = math.inf,
             max_tool_calls: int = RolloutConfig.max_tool_calls) -> list[Outcome]:
    """Run environment calls on an EnvRunner and wait for all of them (the lockstep loop's turns, closes);
    each gets `timeout_s` from the moment it starts, and runs with Limits of min(timeout_s, turn_s) and
    `max_tool_calls` (what its tools keep to).

    A call past its time is abandoned (Python cannot stop a thread; its result is ignored) and reported as
    timed out, so one slow environment never holds up the rest or a collective for longer than that."""
    runner, out = EnvRunner(workers, min(timeout_s, turn_s), max_tool_calls), {}
    try:
        for i, call in enumerate(calls):
            runner.submit(i, call)
        while len(out) < len(calls):
            runner.wait(0.01)
            out |= runner.finished(timeout_s)
    finally:
        runner.close()
    return [out[i] for i in range(len(calls))]


class EnvRunner:
    """This rank's environment calls off the main thread: plain functions on `workers` daemon threads, coroutine
    functions on the rank's one event loop (`run_loop`), at most `workers` of each running at once.

        runner.submit(3, env.step, "7?", [18]); ...; runner.finished(timeout_s=60) -> {3: Outcome(value=...)}

    Daemon threads, not a ThreadPoolExecutor: the executor's threads are joined when the process exits, so a
    call stuck for good would hold up the end of the run after the rollout had long abandoned it.

    Each call runs with Limits (rlcore.rollout.env) that end when the loop would give up on it: `timeout_s`
    after its start, and no later than `until` (time.perf_counter(): the rollout's budgets)."""

    def __init__(self, workers: int, timeout_s: float = math.inf, max_tool_calls: int = RolloutConfig.max_tool_calls,
                 until: float = math.inf):
        self.workers, self.timeout_s, self.max_tool_calls, self.until = workers, timeout_s, max_tool_calls, until
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.limit: asyncio.Semaphore | None = None  # made on the loop's own thread
        self.calls: dict[int, tuple[cf.Future, dict]] = {}  # trajectory -> (future, {"t": start time})

    def submit(self, i: int, fn: Callable, *args) -> None:
        clock: dict = {}
        if inspect.iscoroutinefunction(fn):  # a task on the loop, its outcome in `future` (run_coroutine_threadsafe's
            future = cf.Future()             # way, with the loop woken once for a burst of them: post)
            post(self._event_loop(), self._start, future, fn, args, clock)
        else:
            future = cf.Future()
            self.jobs.put((future, fn, args, clock))
            if self.threads < self.workers:
                self.threads += 1
                threading.Thread(target=self._work, name="rlcore-env", daemon=True).start()
        self.calls[i] = (future, clock)

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            future, fn, args, clock = job
            if not future.set_running_or_notify_cancel():  # dropped before it started
                continue
            clock["t"] = time.perf_counter()  # the timeout counts from the call's start, not from its queueing
            try:
                future.set_result(within(self._limits(clock["t"]), fn, *args))
            except Exception as e:  # the environment's own error: handed to finished() with the future
                future.set_exception(e)

    def _start(self, future: cf.Future, fn: Callable, args: tuple, clock: dict) -> None:
        """On the loop: the call as a task whose outcome goes to `future`; cancelling `future` cancels it."""
        if future.cancelled():  # dropped before it started
            return
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._limited(fn, args, clock))

        def outcome(t: asyncio.Task) -> None:
            if t.cancelled():
                future.cancel()
            elif future.set_running_or_notify_cancel():
                if t.exception() is not None:
                    future.set_exception(t.exception())
                else:
                    future.set_result(t.result())
        task.add_done_callback(outcome)
        future.add_done_callback(lambda f: f.cancelled() and post(loop, task.cancel))

    async def _limited(self, fn, args, clock):
        if self.limit is None:
            self.limit = asyncio.Semaphore(self.workers)
        async with self.limit:
            clock["t"] = time.perf_counter()
            return await awithin(self._limits(clock["t"]), fn, *args)

    def _limits(self, started: float) -> Limits:
        return Limits.starting_now(self.timeout_s, self.max_tool_calls, self.until - started)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self.loop is None:
            self.loop = run_loop()
        return self.loop

    def finished(self, timeout_s: float) -> dict[int, Outcome]:
        """Calls that returned, raised, or ran past `timeout_s` (abandoned: a thread cannot be stopped)."""
        now, out = time.perf_counter(), {}
        for i, (future, clock) in list(self.calls.items()):
            seconds = now - clock.get("t", now)
            if future.done():
                try:
                    out[i] = Outcome(value=future.result(), seconds=seconds)
                except Exception as e:  # the environment's own error: reported with its place by outcome()
                    out[i] = Outcome(error=describe(e), seconds=seconds)
            elif seconds > timeout_s:
                out[i] = Outcome(timed_out=True, seconds=seconds)
                future.cancel()
            else:
                continue
            del self.calls[i]
        return out

    def wait(self, timeout_s: float) -> None:
        """Until one of this rank's calls finishes, or `timeout_s` (at once when none is running)."""
        if self.calls and timeout_s > 0:
            cf.wait([f for f, _ in self.calls.values()], timeout=timeout_s, return_when=cf.FIRST_COMPLETED)

    def drop(self, i: int) -> bool:
        """Forget trajectory i's call (its result will be ignored); whether one was running."""
        call = self.calls.pop(i, None)
        if call is not None:
            call[0].cancel()
        return call is not None

    def close(self) -> None:
        for _ in range(self.threads):  # each idle thread takes one and ends; a stuck one ends with the process
            self.jobs.put(None)
        for future, _ in self.calls.values():  # calls still pending were abandoned: their coroutines are cancelled
            future.cancel()  # (the loop itself stays, for the next rollout's calls)
        self.calls.clear()
