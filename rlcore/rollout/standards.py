"""Environments of a standard, run through rlcore's own multi-turn tool path: TRL's `environment_factory`.

TRL's GRPOTrainer (1.16) takes an environment as a class (or any factory called without arguments): one instance
per trajectory, `reset(**row)` called first with every column of the dataset row, its public methods (type hints
and a Google-style docstring) shown to the model as tools and run on that instance, and the reward functions
handed the instances as `environments=`. The convention is duck-typed, so rlcore runs such classes without
importing TRL:

    class Adder:                                  # a TRL-style environment, unchanged
        def reset(self, **row) -> str | None:
            self.calls = 0
            return None                           # or text, added to the end of the prompt's user message
        def add(self, a: int, b: int) -> int:
            \"\"\"Add two integers.

            Args:
                a: the first
                b: the second
            \"\"\"
            self.calls += 1
            return a + b

    def correct(completions, answer, environments, **kwargs) -> list[float]:   # a TRL-style reward function
        return [float(c[-1]["content"].strip() == a) for c, a in zip(completions, answer)]

    cfg.rollout.env = trl_environment(Adder, format="hermes", max_tool_calling_iterations=1)
    cfg.rewards = trl_rewards([correct], env=Adder)

How the convention maps onto rlcore (rlcore.rollout.env, tools, turns):
- the instance lives inside an rlcore environment (`TRLEnv`), one per trajectory; its tools are a Toolbox made
  once from the class's public functions (inspect.getmembers order, as TRL lists them; `reset` and `get_reward`
  are not tools), bound to each instance. Calls are parsed in the model's format and answered as tool messages;
  a turn without a call ends the trajectory. Bad calls are answered with rlcore's error lines (tool/...
  metrics), a tool's own exception included, and never stop the run.
- reset's text goes into the prompt's user message (rlcore.rollout.env.PromptText): the prompt is rendered
  again, token ids as the chat template makes them. Only the model's sampled tokens carry loss.
- max_tool_calling_iterations N: N tool rounds, i.e. N + 1 model turns; None leaves the limit to
  rollout.max_turns (which must then be set).
- reward functions are called with keywords, as TRL calls them: `prompts` (one user message each, reset's
  text included), `completions` (the assistant and tool messages of the trajectory), `environments` and the
  dataset's columns; None scores 0 (TRL leaves a None out of the sum, with weight 1 the same). Not passed:
  `completion_ids`, `trainer_state`, `log_extra`, `log_metric`. A class with `get_reward()` adds it as a
  reward of weight 1, as TRL does.
- not mapped: a dict of factories (several environments in one run), multimodal tool results.
Bad declarations stop the run at startup (the recipe's config()) with one line, exit 2: a class without
`reset`, a public method that cannot become a tool schema, a reward function that TRL could not call.
"""
from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable

from rlcore.config import RewardSpec
from rlcore.rollout.env import PromptText, Step
from rlcore.rollout.toolcall import parse
from rlcore.rollout.tools import Toolbox, ToolStats

NOT_TOOLS = ("reset", "get_reward")  # the convention's own methods


def tool_methods(cls: type) -> list[Callable]:
    """The public functions of a TRL-style class, the tools its instances offer (as TRL finds them: on the
    class, so properties are not evaluated)."""
    return [fn for name, fn in inspect.getmembers(cls, inspect.isfunction)
            if name not in NOT_TOOLS and not name.startswith("_")]


class TRLEnv:
    """One trajectory's TRL-style environment (`environment`), run as an rlcore environment. Subclasses are made
    by trl_environment(); `toolbox` holds the schemas every prompt shows, `stats` the tool/... counts. Not an
    rlcore Env subclass: without max_tool_calling_iterations it declares no max_turns of its own."""

    factory: Callable[[], Any]
    toolbox: Toolbox

    def __init__(self, row: dict):
        self.environment = type(self).factory()
        self.row = row
        self.tools = self.toolbox.bind(self.environment)
        self.stats = ToolStats()
        self.reset_text = ""
        self.messages: list[dict] = []  # the completion as TRL's reward functions read it

    def reset(self) -> PromptText | None:
        # every column, as TRL passes them; prompt_ids is rlcore's own (the rendered prompt)
        text = self.environment.reset(**{k: v for k, v in self.row.items() if k != "prompt_ids"})
        if text is None:
            return None
        if not isinstance(text, str):
            raise TypeError(f"{type(self.environment).__name__}.reset() returned a {type(text).__name__}; "
                            f"it must return text or None")
        self.reset_text = text
        return PromptText(text)

    def step(self, action: str, action_ids: list[int]) -> Step:
        calls, error = parse(self.toolbox.format, action)
        message = {"role": "assistant", "content": action}
        if calls:
            message["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                     for c in calls]
        self.messages.append(message)
        if not calls and error is None:
            return Step(done=True)
        replies, stats = self.tools.run(calls, error)
        self.stats += stats
        self.messages += replies
        return Step(replies)

    def completion(self, turns: list[str]) -> list[dict]:
        """The trajectory's messages as the model saw them: a last model turn the environment was not shown
        (cut by a limit) is added from `turns`; tool answers after the last model turn, dropped by the turn or
        token limit, are left out (the trajectory ends on the model's turn, as TRL's does)."""
        stepped = sum(m["role"] == "assistant" for m in self.messages)
        messages = self.messages + [{"role": "assistant", "content": t} for t in turns[stepped:]]
        while messages and messages[-1]["role"] != "assistant":
            messages = messages[:-1]
        return messages

    def close(self) -> None:
        if callable(getattr(self.environment, "close", None)):
            self.environment.close()


def trl_environment(factory: Callable[[], Any], format: str = "hermes",
                    max_tool_calling_iterations: int | None = None) -> type[TRLEnv]:
    """An rlcore environment class (for rollout.env) running TRL-style environments made by `factory` (a class,
    or a function returning an instance: then one instance is made here to find its class, as TRL probes one).
    `format`: how the model writes tool calls (hermes, llama3, mistral). Raises a one-line ValueError on a
    declaration TRL would refuse or that cannot become a tool schema."""
    if not callable(factory):
        raise ValueError(f"trl_environment: {factory!r} is not a class or factory")
    cls = factory if isinstance(factory, type) else type(factory())
    name = cls.__name__
    if not callable(getattr(cls, "reset", None)):
        raise ValueError(f"TRL environment '{name}' has no reset() method; the convention needs reset(**row) "
                         f"returning text for the prompt or None")
    if max_tool_calling_iterations is not None and (isinstance(max_tool_calling_iterations, bool) or not isinstance(
            max_tool_calling_iterations, int) or max_tool_calling_iterations < 0):
        raise ValueError(f"TRL environment '{name}': max_tool_calling_iterations must be a whole number >= 0 or "
                         f"None (got {max_tool_calling_iterations!r})")
    try:  # no public methods: no tools (reset alone may write the prompt, get_reward score it)
        toolbox = Toolbox(tool_methods(cls), format=format)
    except ValueError as e:
        raise ValueError(f"TRL environment '{name}': {e}") from None
    attrs: dict[str, Any] = {"factory": staticmethod(factory), "toolbox": toolbox, "__module__": cls.__module__}
    if max_tool_calling_iterations is not None:
        attrs["max_turns"] = max_tool_calling_iterations + 1
    return type(f"TRL{name}", (TRLEnv,), attrs)


# ---- reward functions ---------------------------------------------------------------------------------------

NOT_PASSED = ("completion_ids", "trainer_state", "log_extra", "log_metric")  # TRL passes them; rlcore does not


def check_reward(fn: Callable) -> str:
    """Its name, or a one-line ValueError when TRL's keyword call could not reach it."""
    if not callable(fn):
        raise ValueError(f"TRL reward {fn!r} is not callable")
    name = getattr(fn, "__name__", type(fn).__name__)
    params = inspect.signature(fn).parameters.values()
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        raise ValueError(f"TRL reward function '{name}' takes no **kwargs; TRL calls reward functions with "
                         f"prompts=, completions=, environments= and every dataset column as keywords, so "
                         f"declare def {name}(completions, **kwargs)")
    for p in params:
        if p.kind is p.POSITIONAL_ONLY or (p.name in NOT_PASSED and p.default is p.empty):
            why = "is positional-only" if p.kind is p.POSITIONAL_ONLY else "is not passed by rlcore"
            raise ValueError(f"TRL reward function '{name}': parameter '{p.name}' {why}; it is called with "
                             f"prompts=, completions=, environments= and the dataset's columns as keywords")
    return name


def trl_reward(fn: Callable) -> Callable:
    """A TRL-style reward function as an rlcore one (rlcore.rewards: prompts, completions, **columns)."""
    name = check_reward(fn)

    def reward(prompts: list[str], completions: list[str], envs: list, turns: list, transcripts: list = (),
               **columns) -> list[float]:
        trl_prompts = [[{"role": "user", "content": p + e.reset_text}] for p, e in zip(prompts, envs)]
        messages = [e.completion(t) for e, t in zip(envs, turns)]
        values = fn(prompts=trl_prompts, completions=messages, environments=[e.environment for e in envs],
                    **columns)
        if inspect.isawaitable(values):  # an async reward function: scoring runs on a thread with no event loop
            values = asyncio.run(_awaited(values))
        return [0.0 if v is None else v for v in values]

    reward.__name__, reward.__qualname__ = name, getattr(fn, "__qualname__", name)
    reward.__module__ = getattr(fn, "__module__", reward.__module__)
    return reward


async def _awaited(awaitable):
    return await awaitable


def env_reward(cls: type) -> Callable:
    """A class's get_reward() as a reward function (TRL names it after the class)."""
    def reward(prompts: list[str], completions: list[str], envs: list, **_) -> list[float]:
        values = [e.environment.get_reward() for e in envs]
        return [asyncio.run(_awaited(v)) if inspect.isawaitable(v) else v for v in values]

    reward.__name__ = cls.__name__
    return reward


def trl_rewards(fns: list[Callable], env: Callable | None = None, weights: list[float] | None = None
                ) -> list[RewardSpec]:
    """RewardSpecs for TRL-style reward functions (weights 1 unless given, as TRL's reward_weights), plus the
    environment's get_reward() with weight 1 when its class defines one. The first is the eval's accuracy."""
    weights = [1.0] * len(fns) if weights is None else list(weights)
    if len(weights) != len(fns):
        raise ValueError(f"trl_rewards: {len(weights)} weights for {len(fns)} reward functions")
    specs = [RewardSpec(fn=trl_reward(fn), weight=w) for fn, w in zip(fns, weights)]
    cls = env if env is None or isinstance(env, type) else type(env())
    if cls is not None and callable(getattr(cls, "get_reward", None)):
        specs.append(RewardSpec(fn=env_reward(cls), weight=1.0))
    if not specs:
        raise ValueError("trl_rewards: no reward functions, and the environment defines no get_reward()")
    return specs
