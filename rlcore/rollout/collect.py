"""A step's rollouts: prompt rows -> trajectories (rlcore.rollout.turns) -> rewards -> this rank's Batch,
with dynamic sampling's extra draws, and the greedy held-out eval through the same loop.

Every rank of a rollout group draws the same prompt rows; rank r of the group's k ranks trains (and owns
the environments of) the r-th k-th of them. Rewards are scored once, batched, after the loop, on the rank
that trains the trajectory: reward functions see `completions` = the last model turn's text and, with an
environment, the columns `transcripts`, `turns` and `envs`; the environment's summed step rewards are the
reward part "env", weighted by rollout.env_weight.
"""
from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING

import torch

from rlcore import rewards
from rlcore.batch import Batch
from rlcore.distributed import watchdog
from rlcore.distributed.collectives import RunError, agree, all_min, all_sum
from rlcore.rollout import agents, continuous
from rlcore.rollout.env import call_all
from rlcore.rollout.tools import declared_tools, tool_stats
from rlcore.rollout.turns import Trajectory, rollout, to_batch

if TYPE_CHECKING:
    from rlcore.run import Run


def rollout_seed(run_seed: int, step: int, prompt_index: int, group_size: int) -> int:
    """vLLM draws sample j of a request seeded s with seed s + j: keep prompts group_size apart."""
    return ((run_seed * 1_000_003 + step) * 1_000_033 + prompt_index) * group_size % 2**62


def agent_endpoint(run: Run):
    """This rank's endpoint, started at the first rollout (not at startup: the bad-input checks start nothing)."""
    from rlcore.rollout.endpoint import Endpoint

    if run.rollout.envs.endpoint is None:
        r, d = run.cfg.rollout, run.cfg.data
        run.rollout.envs.endpoint = Endpoint(run.tokenizer, r.temperature, r.max_new_tokens,
                                     r.max_model_len or d.max_prompt_tokens + (r.max_total_tokens or r.max_new_tokens),
                                     r.max_turns, r.agent_tool_format)
    return run.rollout.envs.endpoint


@watchdog.stage("generate")
def run_turns(run: Run, rows: list[dict], seeds: list[int], group_size: int, temperature: float,
              max_new_tokens: int, owners: list[int], budgets: bool = True):
    """Trajectories for `rows` (group_size each) run to their end; env errors stop every rank. `budgets`: the
    continuous schedule's trajectory and step time limits apply (not to the eval, whose accuracy they would bias)."""
    trajs = [Trajectory(row["prompt_ids"], row, seed + j, owner)
             for row, seed, owner in zip(rows, seeds, owners) for j in range(group_size)]
    r = run.cfg.rollout
    max_total = r.max_total_tokens or max_new_tokens
    if run.rollout.envs.agent is not None:  # failures are per trajectory (agent/failed): nothing to agree on
        endpoint = agent_endpoint(run)
        endpoint.temperature = temperature  # the eval's greedy calls are pinned to 0
        stats = agents.rollout(run.engine, endpoint, run.rollout.envs.agent, trajs, temperature, r.env_timeout_s,
                               r.env_workers, run.rollout.tp_rank, run.rollout.tp_group)
        if stats.first_error and not endpoint.reported:  # once per run; agent/failed counts every step
            endpoint.reported = True
            run.logger.print(f"rlcore: warning: agent '{run.rollout.envs.spec}' failed a trajectory (the run goes on; "
                             f"agent/failed counts them): {stats.first_error}")
        return [x for x in trajs if x.owner == run.rollout.tp_rank], stats
    if r.schedule == "continuous" and run.rollout.envs.factory is not None:  # single-turn: no tool time to overlap
        stats = continuous.rollout(run.engine, trajs, run.rollout.envs, max_new_tokens, max_total, temperature,
                                   run.rollout.tp_rank, run.rollout.tp_group,
                                   *((r.trajectory_timeout_s, r.step_deadline_s) if budgets else ()))
    else:
        stats = rollout(run.engine, trajs, run.rollout.envs, max_new_tokens, max_total, group_size, temperature,
                        run.rollout.tp_rank, run.rollout.tp_group)
    if run.rollout.envs.factory is not None:  # only an environment can fail here: no collective without one
        failed = next((x for x in trajs if x.error), None)
        agree(None if failed is None else
              f"environment '{run.rollout.envs.spec}' failed on sample {trajs.index(failed) % group_size} of prompt "
              f"{failed.row[run.cfg.data.prompt_column]!r}, {failed.error}")
    return [x for x in trajs if x.owner == run.rollout.tp_rank], stats


@watchdog.stage("reward")
def score(run: Run, mine: list[Trajectory], first_only: bool = False) -> tuple[torch.Tensor, dict]:
    """Rewards of this rank's trajectories [B] and their parts; closes their environments."""
    envs = run.rollout.envs
    # a trajectory the step deadline ended before its first model turn has none: it completed nothing
    completions = [envs.decode(x.turns[-1] if x.turns else []) for x in mine]
    extra = None
    if envs.factory is not None:
        extra = {"transcripts": [envs.decode(x.tokens) for x in mine],
                 "turns": [[envs.decode(t) for t in x.turns] for x in mine], "envs": [x.env for x in mine]}
    rows = [x.row for x in mine]
    if first_only:  # eval: correctness is the first reward function, or the environment's reward without one
        if not run.rollout.reward_fns:
            return torch.tensor([x.env_reward for x in mine]), {}
        prompts, columns = rewards.reward_inputs(rows, run.cfg.data.prompt_column)
        return rewards.score([(run.rollout.reward_fns[0][0], 1.0)], prompts, completions, columns | (extra or {}))
    total, parts = rewards.score_rollouts(run, rows, completions, extra)
    if envs.agent is not None:  # the agent's own reward; a failed agent's trajectory scores 0 (and trains nothing)
        parts["agent"] = torch.tensor([x.env_reward for x in mine])
        total = total + parts["agent"]
        total[torch.tensor([x.timed_out or x.error is not None for x in mine], dtype=torch.bool)] = 0.0
    if envs.factory is not None:
        r = run.cfg.rollout
        parts["env"] = torch.tensor([x.env_reward for x in mine])
        total = total + r.env_weight * parts["env"]
        total[torch.tensor([x.timed_out or x.failed is not None for x in mine], dtype=torch.bool)] = 0.0
        if r.truncated_reward is not None:
            total[torch.tensor([x.truncated for x in mine], dtype=torch.bool)] = r.truncated_reward
    return total, parts


def close_envs(run: Run, mine: list[Trajectory]) -> None:
    """close() every environment this rank owns (not those abandoned in a call: timed out, or cut by a budget)."""
    live = [x for x in mine if x.env is not None and not x.timed_out and not x.abandoned
            and callable(getattr(x.env, "close", None))]
    outs = call_all([x.env.close for x in live], run.rollout.envs.timeout_s, run.rollout.envs.workers)
    failed = next((o.error for o in outs if o.error), None)
    agree(None if failed is None else f"environment '{run.rollout.envs.spec}' failed in close(): {failed}")


def sample(run: Run, step: int, draw: int = 0) -> tuple[Batch, dict[str, torch.Tensor], dict]:
    """This group's next prompts run through the turn loop; returns this rank's share as a scored Batch, the
    reward parts, and counters for the metrics. `draw` > 0 are dynamic sampling's extra draws."""
    cfg, G = run.cfg, run.cfg.rollout.group_size
    rows = run.rollout.prompts.next_batch()  # identical on every rank of the group
    first = draw * cfg.rollout.prompts_per_step + run.rollout.group * len(rows)
    share = len(rows) // run.dims.tp
    seeds = [rollout_seed(cfg.seed, step, first + i, G) for i in range(len(rows))]
    t = time.perf_counter()
    mine, stats = run_turns(run, rows, seeds, G, cfg.rollout.temperature, cfg.rollout.max_new_tokens,
                            [i // share for i in range(len(rows))])
    rollout_s = time.perf_counter() - t
    batch = to_batch(mine, pad_id(run.tokenizer), G, run.rollout.model_budget)
    t = time.perf_counter()
    batch.rewards, parts = score(run, mine)
    if run.rollout.envs.factory is not None:
        close_envs(run, mine)
    counts = {"generated": stats.generated / run.dims.tp, "generate_s": stats.generate_s, "env_s": stats.env_s,
              "rollout_s": rollout_s,
              "reward_s": time.perf_counter() - t, "active": stats.active if run.rollout.tp_rank == 0 else [],
              "turns": sum(len(x.turns) for x in mine), "truncated": sum(x.truncated for x in mine),
              "timeouts": sum(x.timed_out for x in mine), "failed": sum(x.failed is not None for x in mine),
              "model_tokens": sum(x.model_tokens for x in mine),
              "env_tokens": sum(len(x.tokens) - x.model_tokens for x in mine)}
    if declared_tools(run.rollout.envs.factory) is not None:  # a ToolEnv: the same keys on every rank (env_metrics)
        counts |= tool_stats([x.env for x in mine]).metrics("tool/")
    if isinstance(stats, agents.AgentStats):
        counts |= {"agent_calls": stats.calls / run.dims.tp, "agent_failed": stats.failed,
                   "agent_timeouts": stats.timeouts, "agent_rewritten": stats.rewritten,
                   "rollout_s": stats.rollout_s, "agent_first_error": stats.first_error}
    if isinstance(stats, continuous.ContinuousStats):
        counts |= {"rollout_s": stats.rollout_s, "idle_s": stats.idle_s, "env_calls": stats.env_calls,
                   "deadline_truncated": stats.deadline_truncated if run.rollout.tp_rank == 0 else 0,
                   "budget_truncated": stats.budget_truncated if run.rollout.tp_rank == 0 else 0}
    return batch, parts, counts


def pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


@watchdog.stage("rollout")
def collect(run: Run, step: int) -> tuple[Batch, dict[str, float]]:
    """Generate and reward this rank's share of the step. With dynamic sampling, groups whose rewards are all
    equal (zero advantage under any group baseline) are dropped and further prompts drawn, in rounds taken
    by every rank together, until every rank has its share or the algorithm's bound on rounds is spent."""
    cfg, G = run.cfg, run.cfg.rollout.group_size
    extra_draws = cfg.algorithm.dynamic_sampling
    need = cfg.rollout.prompts_per_step // run.dims.generators * G  # sequences per rank
    kept: list[Batch] = []
    have = drawn_groups = kept_groups = 0
    r_sum = r_sq = r_n = 0.0
    part_sums: dict[str, float] = {}
    totals: dict = {}
    for draw in range(1 + extra_draws):
        batch, parts, counts = sample(run, step, draw)
        for name, values in parts.items():
            part_sums[name] = part_sums.get(name, 0.0) + values.sum().item()
        for k, v in counts.items():
            if k == "active":  # per-turn counts: add draw to draw, turn by turn
                totals[k] = [a + b for a, b in itertools.zip_longest(totals.get(k, []), v, fillvalue=0)]
            elif isinstance(v, str):  # the first error of the step on this rank
                totals[k] = totals.get(k) or v
            else:
                totals[k] = totals.get(k, 0) + v
        r_sum, r_sq, r_n = r_sum + batch.rewards.sum().item(), r_sq + (batch.rewards ** 2).sum().item(), r_n + len(batch)
        groups = batch.rewards.view(-1, G)  # [B / G, G]
        keep = (groups.max(-1).values > groups.min(-1).values) if extra_draws else torch.ones(len(groups), dtype=torch.bool)
        drawn_groups += len(groups)
        kept_groups += int(keep.sum())
        rows_kept = torch.repeat_interleave(keep, G).nonzero().squeeze(-1)  # [kept sequences]
        if len(rows_kept):
            kept.append(batch.select(rows_kept))
        have += len(rows_kept)
        if all_min(have) >= need:  # every rank has its share
            break
    else:
        lowest = int(all_min(have))
        raise RunError(f"dynamic sampling kept {lowest // G} of the {need // G} prompt groups a rank needs after "
                       f"{1 + extra_draws} draws at step {step} (every other group's rewards were all equal); "
                       f"raise algorithm.dynamic_sampling or rollout.group_size, or turn it off with "
                       f"algorithm.dynamic_sampling=0")
    batch = Batch.cat(kept, pad_id(run.tokenizer)).rows(0, need)
    names = sorted(part_sums) if len(part_sums) > 1 else []  # one reward: reward/mean says it all
    r_sum, r_sq, r_n, generated, drawn_groups, kept_groups, *part_totals = all_sum(
        r_sum, r_sq, r_n, totals["generated"], drawn_groups, kept_groups, *(part_sums[k] for k in names))
    mean = r_sum / r_n
    stats = {f"reward/{name}": total / r_n for name, total in zip(names, part_totals)}  # unweighted, each
    stats |= {"reward/mean": mean, "reward/std": max(r_sq / r_n - mean ** 2, 0.0) ** 0.5,
              "time/generate_s": totals["generate_s"], "time/rollout_s": totals["rollout_s"],
              "time/reward_s": totals["reward_s"],
              "throughput/generate_tok_s": generated / max(totals["generate_s"], 1e-9), "tokens/generated": generated}
    if extra_draws:
        stats |= {"rollout/draws": draw + 1, "rollout/kept_group_frac": kept_groups / drawn_groups}
    if run.rollout.envs.factory is not None:
        stats |= env_metrics(run, totals, r_n)
    if run.rollout.envs.agent is not None:
        calls, failed, timeouts, rewritten = all_sum(totals["agent_calls"], totals["agent_failed"],
                                                     totals["agent_timeouts"], totals["agent_rewritten"])
        stats |= {"agent/calls_mean": calls / r_n, "agent/failed": failed, "agent/timeouts": timeouts,
                  "agent/rewritten": rewritten, "agent/failed_frac": (failed + timeouts) / r_n}
        check_failed(cfg, step, failed + timeouts, r_n, totals["agent_first_error"] or (
            "timed out (rollout.env_timeout_s)" if totals["agent_timeouts"] else None))
    return batch, stats


def check_failed(cfg, step: int, failed: float, total: float, first: str | None) -> None:
    """Collective: a step whose agents failed on at least rollout.max_failed_frac of its trajectories (by default
    all of them: nothing to train on) stops every rank with the first failure (by rank), exit 3."""
    frac = cfg.rollout.max_failed_frac
    if failed >= frac * total:
        agree(f"{int(failed)} of {int(total)} trajectories' agents failed at step {step} (rollout.max_failed_frac="
              f"{frac:g}); the first: {first}" if first else None)


def env_metrics(run: Run, totals: dict, n: float) -> dict[str, float]:
    """Multi-turn metrics over every rank's trajectories of this step (all draws); with a ToolEnv, its
    ToolStats summed (tool/calls, tool/malformed, tool/unknown_tool, tool/bad_arguments, tool/tool_raised)."""
    turns = run.rollout.envs.max_turns
    active = (totals["active"] + [0] * turns)[:turns]
    tools = sorted(k for k in totals if k.startswith("tool/"))
    sums = all_sum(totals["turns"], totals["truncated"], totals["timeouts"], totals["model_tokens"],
                   totals["env_tokens"], totals["failed"], *active, *(totals[k] for k in tools))
    out = {"env/turns_mean": sums[0] / n, "env/truncated_frac": sums[1] / n, "env/timeouts": sums[2],
           "tokens/model_mean": sums[3] / n, "tokens/env_mean": sums[4] / n, "time/env_s": totals["env_s"],
           "rollout/failed_trajectories": int(sums[5])}
    out |= {f"env/active_turn{t + 1}": a for t, a in enumerate(sums[6:6 + turns])}
    out |= {k: int(v) for k, v in zip(tools, sums[6 + turns:])}
    if run.cfg.rollout.schedule == "continuous":  # every rank runs it (a collective)
        idle, rollout_s, calls_per_s, deadline, budget = all_sum(
            totals.get("idle_s", 0.0), totals.get("rollout_s", 0.0),
            totals.get("env_calls", 0) / max(totals.get("rollout_s", 0.0), 1e-9),
            totals.get("deadline_truncated", 0), totals.get("budget_truncated", 0))
        out |= {"rollout/engine_idle_frac": idle / max(rollout_s, 1e-9), "env/calls_per_s": calls_per_s,
                "rollout/deadline_truncated": deadline, "rollout/budget_truncated": budget}
    return out


@watchdog.stage("eval")
def evaluate(run: Run) -> dict[str, float]:
    """Greedy answers to the held-out prompts (through the environment, if any); accuracy = share whose first
    reward function gives >= 1 (without a reward function: whose environment reward is >= 1)."""
    rows = run.rollout.eval_rows[run.rollout.group::run.dims.rollout_groups]
    max_tokens = run.cfg.rollout.eval_max_new_tokens or run.cfg.rollout.max_new_tokens
    mine, _ = run_turns(run, rows, [0] * len(rows), 1, 0.0, max_tokens,
                        [i % run.dims.tp for i in range(len(rows))], budgets=False)
    correct = 0.0
    if mine:
        total, _ = score(run, mine, first_only=True)
        correct = (total >= 1.0).sum().item()
    if run.rollout.envs.factory is not None:
        close_envs(run, mine)
    correct, n = all_sum(correct, len(mine))
    return {"eval/accuracy": correct / max(n, 1.0)}
