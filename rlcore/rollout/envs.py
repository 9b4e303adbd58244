"""The run's environment settings, built and checked once at startup from the config: which environment
(or none: single-turn), its turns, stop tokens, time limits and how its observations become token ids
(`Envs`, rlcore/rollout/turns.py). The protocol environments implement is rlcore/rollout/env.py."""
from __future__ import annotations

from rlcore import rewards
from rlcore.config.errors import describe
from rlcore.data import render_prompt
from rlcore.rollout.env import check_env
from rlcore.rollout.observation import encoder
from rlcore.rollout.tools import declared_tools
from rlcore.run import Envs


def make_envs(cfg, tokenizer, first_row: dict, vocab_size: int) -> Envs:
    """Resolve and check the recipe's environment at startup (one instance from the first row), or the
    single-turn settings without one. Raises ValueError naming the setting."""
    r = cfg.rollout
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    if r.agent:
        return make_agent(cfg, tokenizer, decode)
    if not r.env:
        if r.max_turns > 1 or r.max_total_tokens:
            raise ValueError("rollout.max_turns and rollout.max_total_tokens need an environment: set rollout.env")
        return Envs(None, "", 1, [], r.env_timeout_s, 1, lambda obs: [], decode, r.turn_deadline_s, r.max_tool_calls)
    spec = r.env if isinstance(r.env, str) else rewards.fn_name(r.env)
    factory = rewards.resolve(r.env, "rollout.env")
    if r.max_total_tokens < r.max_new_tokens:
        raise ValueError(f"rollout.max_total_tokens={r.max_total_tokens} is smaller than one turn "
                         f"(rollout.max_new_tokens={r.max_new_tokens}); it bounds model + environment tokens "
                         f"after the prompt, over all turns")
    try:
        env = factory(first_row)
    except Exception as e:  # the user's factory: name it and the exception
        raise ValueError(f"rollout.env '{spec}' raised when called with the first data row: {describe(e)}") from e
    own_turns, stop_ids = check_env(env, spec, lambda s: tokenizer.encode(s, add_special_tokens=False))
    if callable(getattr(env, "close", None)):
        env.close()
    turns = min(t for t in (own_turns, r.max_turns) if t) if (own_turns or r.max_turns) else 0
    if turns < 1:
        raise ValueError(f"rollout.env '{spec}' declares no max_turns: set rollout.max_turns (>= 1)")
    if cfg.data.chat_template:
        from rlcore.rollout import chat
        chat.check_prefix_preserving(tokenizer)
    toolbox = declared_tools(env)
    if toolbox and declared_tools(factory) is not toolbox:  # rlcore.preflight.checks reads it from the factory
        raise ValueError(f"rollout.env '{spec}' makes environments with tools but does not declare them itself, so "
                         f"prompts cannot show them: name the ToolEnv subclass, or set the factory's `toolbox`")
    if toolbox and not cfg.data.chat_template:
        raise ValueError(f"rollout.env '{spec}' declares tools, which reach the model through its chat template: "
                         f"set data.chat_template=true")
    if toolbox:
        toolbox.check_template(tokenizer, cfg.model.path)
    # any observation -> bounded, cleaned, encodable ids (rlcore.rollout.observation)
    encode = encoder(tokenizer, vocab_size, r.max_total_tokens or r.max_new_tokens)
    return Envs(factory, spec, turns, stop_ids, r.env_timeout_s, r.env_workers, encode, decode, r.turn_deadline_s,
                r.max_tool_calls, prompt=prompt_renderer(cfg.data, tokenizer, toolbox))


def prompt_renderer(data, tokenizer, toolbox):
    """(row, text) -> the row's prompt ids with `text` added to its user message (reset()'s PromptText)."""
    schemas = toolbox.schemas if toolbox else None

    def render(row: dict, text: str) -> list[int]:
        ids = render_prompt(tokenizer, data, row[data.prompt_column] + text, schemas)
        if len(ids) > data.max_prompt_tokens:
            raise ValueError(f"it is {len(ids)} tokens, more than data.max_prompt_tokens={data.max_prompt_tokens}")
        return ids

    return render



def make_agent(cfg, tokenizer, decode) -> Envs:
    """rollout.agent, checked at startup: an async function, a call budget, a template the endpoint can extend."""
    from rlcore.rollout import chat
    from rlcore.rollout.agents import check_agent

    r = cfg.rollout
    spec = r.agent if isinstance(r.agent, str) else rewards.fn_name(r.agent)
    if r.env:
        raise ValueError(f"rollout.agent '{spec}' and rollout.env '{r.env}' are two ways to run a trajectory; set one")
    agent = rewards.resolve(r.agent, "rollout.agent")
    check_agent(agent, spec)
    if r.max_turns < 1:
        raise ValueError(f"rollout.agent '{spec}' needs rollout.max_turns >= 1: the engine calls one trajectory "
                         f"may make")
    chat.check_prefix_preserving(tokenizer, "rollout.agent")
    return Envs(None, spec, r.max_turns, [], r.env_timeout_s, r.env_workers, lambda obs: [], decode, agent=agent)


def model_budget(cfg, envs: Envs) -> int:
    """Model tokens one trajectory can hold at most: seq-mean-token-sum-norm's divisor, DAPO's overlong cap."""
    r = cfg.rollout
    return min(envs.max_turns * r.max_new_tokens, r.max_total_tokens or r.max_new_tokens)
