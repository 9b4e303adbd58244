"""The turn loop: prompt rows -> trajectories, one engine call per turn, token in and token out.

Every trajectory is the prompt's token ids followed by turns: the model's sampled tokens exactly as the
engine returned them, then the environment's observation tokens, encoded once. Nothing is ever decoded and
re-encoded to build the next turn. Each token is appended together with its flag and its logprob, so the
mask cannot drift from the tokens:

    tokens   <bos> 4 7 + 3 8 = | ?  |  _ 8 5 = | 8 5 <eos>      (calculator: call "?", tool " 85=", answer)
    sampled    0   0 0 0 0 0 0   1     0 0 0 0   1 1  1
    loss_mask      [0 0 0 0 0 0   1     0 0 0 0   1 1  1]        loss_mask[t] = sampled[t + 1]
    rollout_lp     [0 0 0 0 0 0  l?     0 0 0 0  l8 l5 le]       the engine's logprob where sampled, else 0

The ending rule, applied to each trajectory after each model turn (rlcore/rollout/env.py for the protocol):
  1. Without an environment the trajectory ends after its one turn (single-turn rollouts).
  2. A turn ends at EOS, at one of the environment's stop tokens, or at its token cap
     min(rollout.max_new_tokens, what is left of rollout.max_total_tokens). An action cut by that cap is
     incomplete when the environment declares stop tokens, or when the total budget made the cap smaller
     than max_new_tokens: the trajectory ends there, truncated, and the environment is not stepped.
  3. Otherwise the environment is stepped once with the action; its reward is added. Then the trajectory
     ends if the step said done; else, truncated, if this was the last turn allowed (rollout.max_turns or
     the environment's max_turns), or if the observation leaves no room for one more model token in
     rollout.max_total_tokens (the observation is dropped). Otherwise the observation is appended.
  4. A step that raises stops the run (EnvError, every rank); a step slower than rollout.env_timeout_s ends
     its trajectory with reward 0 and counts in env/timeouts; an observation whose content cannot be encoded
     (rlcore.rollout.observation) ends it with reward 0 and counts in rollout/failed_trajectories.
So a trajectory always ends on a model token, and trailing observations never reach the trainer. Each
environment call runs with Limits (rlcore.rollout.env) ending shortly before the earlier of
rollout.env_timeout_s and rollout.turn_deadline_s, which rlcore's tools keep to (rlcore.rollout.tools).

Tensor parallelism: every rank of an engine's group runs this loop on identical rows. Each environment
lives on the one rank that trains its trajectory (`owners`); that rank steps it, and the results are
shared inside the group with one all_gather_object per turn, so every rank feeds its engine identical token
ids, budgets and seeds, and each environment is stepped once per turn, not once per rank.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

from rlcore.rollout.env import PromptText, as_step, call_all
from rlcore.rollout.observation import Unencodable, clean
from rlcore.run import Envs


@dataclass
class Trajectory:
    prompt_ids: list[int]
    row: dict  # the dataset row (every column) the trajectory's prompt came from
    seed: int  # the engine seed of its first turn; later turns derive theirs from it
    owner: int  # the tensor-parallel rank that trains it and steps its environment
    tokens: list[int] = field(default_factory=list)  # everything after the prompt: model and environment
    sampled: list[int] = field(default_factory=list)  # 1 where the model sampled tokens[i]
    logprobs: list[float] = field(default_factory=list)  # the engine's logprob where sampled, else 0
    turns: list[list[int]] = field(default_factory=list)  # each model turn's token ids
    env: Any = None  # the environment instance (on the owner only)
    env_reward: float = 0.0
    done: bool = False
    truncated: bool = False  # ended by a limit (turns, tokens, an incomplete action), not by the environment
    timed_out: bool = False
    error: str | None = None  # what the environment raised (the run stops on it)
    failed: str | None = None  # why its observation could not be encoded (it ends, reward 0; the run goes on)
    abandoned: bool = False  # its environment was still in a call when the trajectory ended (not closed)
    # Where prompt_ids + tokens hold several sequences (an agent that rewrote its history): the offsets at which
    # the 2nd, 3rd, ... start; each attends only to itself in training (Batch.position_ids). [] = one sequence.
    starts: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # streaming: the weight version of each sampled token

    def append(self, ids: list[int], sampled: bool, logprobs: list[float] | None = None) -> None:
        self.tokens += ids
        self.sampled += [int(sampled)] * len(ids)
        self.logprobs += logprobs if sampled else [0.0] * len(ids)

    @property
    def model_tokens(self) -> int:
        return sum(self.sampled)


@dataclass
class TurnStats:
    active: list[int] = field(default_factory=list)  # trajectories that sampled in each turn
    generate_s: float = 0.0
    env_s: float = 0.0
    generated: int = 0  # tokens the engine sampled for this group



def turn_seed(first_seed: int, turn: int) -> int:
    """Turn 0 uses the trajectory's own seed (so single-turn sampling is unchanged); later turns mix in the turn."""
    return first_seed if turn == 0 else (first_seed * 1_000_003 + turn * 998_244_353) % 2**62


def rollout(engine, trajs: list[Trajectory], envs: Envs, max_new_tokens: int, max_total: int, group_size: int,
            temperature: float, tp_rank: int, tp_group) -> TurnStats:
    """Run every trajectory to its end (see the module docstring): at most `max_new_tokens` per model turn and
    `max_total` tokens after the prompt. `trajs` come in prompt groups of `group_size` consecutive
    trajectories, identical on every rank of the tensor-parallel group."""
    stats = TurnStats()
    if envs.factory is not None:
        t = time.perf_counter()
        mine = [i for i, x in enumerate(trajs) if x.owner == tp_rank]
        outs = call_all([lambda x=trajs[i]: start(x, envs.factory) for i in mine], envs.timeout_s, envs.workers,
                        envs.turn_s, envs.max_tool_calls)
        results = {i: outcome(o, lambda v, x=trajs[i]: reset_ids(v, x, envs), "creating it or in reset()")
                   for i, o in zip(mine, outs)}
        for i, res in share(results, tp_group).items():
            apply_reset(trajs[i], res, max_total)
        stats.env_s += time.perf_counter() - t
    for turn in range(envs.max_turns):
        active = [i for i, x in enumerate(trajs) if not x.done]
        if not active:
            break
        stats.active.append(len(active))
        t = time.perf_counter()
        samples = sample_turn(engine, trajs, active, turn, group_size, temperature, max_new_tokens, max_total,
                              envs.stop_ids)
        stats.generate_s += time.perf_counter() - t
        stepping = []
        for i, s in zip(active, samples):
            x = trajs[i]
            cap = min(max_new_tokens, max_total - len(x.tokens))
            x.append(s.token_ids, True, s.logprobs)
            x.turns.append(list(s.token_ids))
            stats.generated += len(s.token_ids)
            cut = s.finish_reason == "length"
            if envs.factory is None:
                x.done = True
            elif cut and (envs.stop_ids or cap < max_new_tokens):
                x.done = x.truncated = True  # an incomplete action: never shown to the environment
            else:
                stepping.append(i)
        if not stepping:
            continue
        t = time.perf_counter()
        mine = [i for i in stepping if trajs[i].owner == tp_rank]
        outs = call_all([lambda x=trajs[i]: x.env.step(envs.decode(x.turns[-1]), list(x.turns[-1])) for i in mine],
                        envs.timeout_s, envs.workers, envs.turn_s, envs.max_tool_calls)
        results = {i: outcome(o, lambda v: encode_step(v, envs), f"turn {turn + 1}")
                   for i, o in zip(mine, outs)}
        for i, res in share(results, tp_group).items():
            apply_step(trajs[i], res, turn, envs.max_turns, max_total)
        stats.env_s += time.perf_counter() - t
    return stats


# ---- helpers of the loop -------------------------------------------------------------------------------

def start(x: Trajectory, factory: Callable):
    """Make the trajectory's environment from its row; its reset() may add prompt tokens."""
    x.env = factory(x.row)
    return x.env.reset() if callable(getattr(x.env, "reset", None)) else None


def reset_ids(value, x: Trajectory, envs: Envs) -> list[int] | dict:
    """reset()'s return -> ids to append after the prompt, or {"prompt": ids} for the prompt rendered again
    with PromptText in its user message."""
    if not isinstance(value, PromptText):
        return envs.encode(value) if value not in (None, "", []) else []
    if not isinstance(value.text, str):
        raise TypeError(f"reset() returned PromptText of a {type(value.text).__name__}, not text")
    try:
        ids = envs.prompt(x.row, clean(value.text))
    except Exception as e:  # the text (or the template) refused: this trajectory fails, the run goes on
        raise Unencodable(f"the prompt with reset()'s text could not be rendered ({' '.join(str(e).split())})") from e
    return {"prompt": ids}


def env_outcome(o, x: Trajectory, envs: Envs) -> dict:
    """The Outcome of a trajectory's latest env call (reset() before its first turn, else step()) -> outcome()."""
    if x.turns:
        return outcome(o, lambda v: encode_step(v, envs), f"turn {len(x.turns)}")
    return outcome(o, lambda v: reset_ids(v, x, envs), "creating it or in reset()")


def outcome(o, convert: Callable, where: str) -> dict:
    """An env call's Outcome -> a small picklable dict to share in the group (errors as one-line text)."""
    if o.timed_out:
        return {"timeout": True}
    if o.error:
        return {"error": f"{where}: {o.error}"}
    try:
        return {"value": convert(o.value)}
    except Unencodable as e:  # what the model made the environment echo: this trajectory fails, the run goes on
        return {"failed": f"{where}: {e}"}
    except Exception as e:  # a wrong shape, ids outside the vocabulary: the environment's fault, reported
        return {"error": f"{where}: {' '.join(str(e).split())}"}


def encode_step(result, envs: Envs) -> tuple[list[int], float, bool]:
    step = as_step(result)
    ids = envs.encode(step.observation) if step.observation not in (None, "", []) else []
    return ids, step.reward, step.done


def share(results: dict[int, dict], tp_group) -> dict[int, dict]:
    """Every rank of the tensor-parallel group gets every owner's results (one all_gather_object)."""
    if tp_group is None or dist.get_world_size(tp_group) == 1:
        return results
    gathered = [None] * dist.get_world_size(tp_group)
    dist.all_gather_object(gathered, results, group=tp_group)
    return {i: r for part in gathered for i, r in part.items()}


def apply_reset(x: Trajectory, res: dict, max_total: int) -> None:
    if "error" in res or "timeout" in res or "failed" in res:
        x.done, x.timed_out, x.error, x.failed = True, "timeout" in res, res.get("error"), res.get("failed")
        return
    ids = res["value"]
    if isinstance(ids, dict):  # reset() put text into the prompt's user message: the prompt was rendered again
        x.prompt_ids = ids["prompt"]
        return
    if len(ids) >= max_total:
        x.done = x.truncated = True  # no room left for the model: nothing to train on
        return
    x.append(ids, False)


def apply_step(x: Trajectory, res: dict, turn: int, max_turns: int, max_total: int) -> None:
    if "timeout" in res:
        x.done = x.timed_out = True
        return
    if "error" in res or "failed" in res:
        x.done, x.error, x.failed = True, res.get("error"), res.get("failed")
        return
    ids, reward, done = res["value"]
    x.env_reward += reward
    if done:
        x.done = True
    elif turn + 1 >= max_turns or len(x.tokens) + len(ids) >= max_total:
        x.done = x.truncated = True  # out of turns, or the observation leaves no room: it is dropped
    else:
        x.append(ids, False)


def sample_turn(engine, trajs: list[Trajectory], active: list[int], turn: int, group_size: int,
                temperature: float, max_new_tokens: int, max_total: int, stop_ids: list[int]):
    """One engine call over the active trajectories. The first turn of a prompt group whose members are still
    identical is one request with n = group_size (sample j gets seed s + j, as vLLM draws it), which is
    exactly how a single-turn rollout samples; every other trajectory is its own request."""
    requests, slots = [], []  # slots[r] = the trajectory indices request r samples for
    i = 0
    while i < len(active):
        x = trajs[active[i]]
        group = active[i:i + group_size]
        whole = (turn == 0 and group_size > 1 and len(group) == group_size and group[0] % group_size == 0
                 and group[-1] == group[0] + group_size - 1
                 and all(trajs[j].tokens == x.tokens and trajs[j].prompt_ids == x.prompt_ids for j in group))
        if whole:
            requests.append((x.prompt_ids + x.tokens, group_size, min(max_new_tokens, max_total - len(x.tokens)),
                             turn_seed(x.seed, turn)))
            slots.append(group)
            i += group_size
        else:
            requests.append((x.prompt_ids + x.tokens, 1, min(max_new_tokens, max_total - len(x.tokens)),
                             turn_seed(x.seed, turn)))
            slots.append([active[i]])
            i += 1
    out = engine.generate([r[0] for r in requests], [r[1] for r in requests], [r[2] for r in requests],
                          temperature, [r[3] for r in requests], stop_ids)
    by_traj = {j: s for slot, samples in zip(slots, out) for j, s in zip(slot, samples)}
    return [by_traj[j] for j in active]


def to_batch(trajs: list[Trajectory], pad_id: int, group_size: int, max_model_tokens: int):
    """This rank's trajectories -> Batch (rewards left at 0 for the scorer)."""
    from rlcore.batch import Batch

    L = max(len(x.prompt_ids) + len(x.tokens) for x in trajs)
    B = len(trajs)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(B, L, dtype=torch.long)
    loss_mask = torch.zeros(B, L - 1)
    rollout_logprobs = torch.zeros(B, L - 1)
    # Rows of several sequences restart their positions at each one (e.g. starts [5]: 0 1 2 3 4 0 1 2 ...).
    position_ids = torch.arange(L).repeat(B, 1) if any(x.starts for x in trajs) else None  # [B, L]
    for i, x in enumerate(trajs):
        n, m = len(x.prompt_ids), len(x.tokens)
        input_ids[i, :n + m] = torch.tensor(x.prompt_ids + x.tokens)
        attention_mask[i, :n + m] = 1
        loss_mask[i, n - 1:n + m - 1] = torch.tensor(x.sampled, dtype=torch.float32)  # position t scores t + 1
        rollout_logprobs[i, n - 1:n + m - 1] = torch.tensor(x.logprobs)
        for start in x.starts:
            position_ids[i, start:] -= position_ids[i, start].clone()
    return Batch(input_ids, attention_mask, loss_mask, rollout_logprobs, torch.zeros(B), group_size, max_model_tokens,
                 position_ids=position_ids)
