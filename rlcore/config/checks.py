"""The config's checks before anything loads: each field in its range (VALID, rlcore/config/valid.py), and the
checks across fields and against the mesh (validate). Each failure is a ValueError naming the field and what would
be valid."""
from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from rlcore.algorithms.base import check as check_algorithm
from rlcore.config.roles import models_of
from rlcore.config.valid import VALID, check_fields

if TYPE_CHECKING:
    from rlcore.config.sections import Config


def validate(cfg: Config, dims) -> None:
    """Cheap checks of the whole config against the mesh (`dims`: rlcore.distributed.parallel.ParallelDims), before
    anything loads. Raises ValueError naming the field."""
    check_algorithm(cfg.algorithm)
    cfg.algorithm.validate(cfg)
    if not cfg.rewards and not cfg.rollout.env and not cfg.rollout.agent:
        raise ValueError("rewards is empty: the recipe must list at least one reward function or model, or set "
                         "rollout.env (an environment whose step rewards are the reward) or rollout.agent")
    for i, spec in enumerate(cfg.rewards):
        if bool(spec.fn) == bool(spec.model):
            raise ValueError(f"rewards[{i}] must set exactly one of fn (a reward function) or model (a "
                             f"sequence-classification reward model)")
    if cfg.data.eval_path and not any(spec.fn for spec in cfg.rewards) and not (cfg.rollout.env or cfg.rollout.agent):
        raise ValueError("data.eval_path needs a reward function in rewards (the first one scores held-out "
                         "correctness) or an environment; set data.eval_path= to turn eval off")
    check_values(cfg)
    r, t = cfg.rollout, cfg.train
    if r.schedule == "lockstep" and (r.trajectory_timeout_s or r.step_deadline_s):
        raise ValueError("rollout.trajectory_timeout_s and rollout.step_deadline_s need rollout.schedule=continuous "
                         "(the lockstep loop has no way to cut a trajectory short)")
    if not dims.split and r.prompts_per_step % dims.world_size:
        raise ValueError(f"rollout.prompts_per_step={r.prompts_per_step} must be divisible by the world "
                         f"size {dims.world_size} (every rank trains on whole prompt groups)")
    for ranks, role in ((dims.generators, "rollout ranks (each scores whole prompt groups)"),
                        (dims.trainers, "trainer ranks (each trains on whole prompt groups)")) if dims.split else ():
        if r.prompts_per_step % ranks:
            raise ValueError(f"rollout.prompts_per_step={r.prompts_per_step} must be divisible by the {ranks} {role}")
    rows = r.prompts_per_step // dims.trainers * r.group_size
    if rows % t.mini_batches:
        raise ValueError(f"train.mini_batches={t.mini_batches} must divide the {rows} sequences per rank")
    if r.max_staleness and not dims.split:
        raise ValueError(f"rollout.max_staleness={r.max_staleness} needs a split mesh: set rollout.ranks (the ranks "
                         f"that only generate); colocated runs are on-policy")
    if r.max_staleness and not cfg.algorithm.corrects_off_policy:
        raise ValueError(f"rollout.max_staleness={r.max_staleness} samples with older weights than it trains: the "
                         f"loss needs the off-policy correction, algorithm.tis_cap > 0 (e.g. 2)")
    if dims.split and models_of(cfg).engine_lora:
        raise ValueError("rollout.ranks > 0 (split mesh) sends full weights to the engines: set lora.sync=merged")
    if r.seeds == "engine" and (r.schedule != "lockstep" or r.stream or r.agent):
        raise ValueError("rollout.seeds=engine draws a sample's noise from whatever the engine runs beside it, so "
                         "with rollout.schedule=continuous, rollout.stream or rollout.agent a run could not reproduce "
                         "itself; valid there: rollout.seeds=request")
    if r.max_waiting and not (r.stream and (r.env or r.agent)):
        raise ValueError(f"rollout.max_waiting={r.max_waiting} admits trajectories beyond rollout.max_running while "
                         f"some wait for an environment or agent: it needs rollout.stream=true and rollout.env or "
                         f"rollout.agent (valid here: 0)")
    if r.stream:
        check_stream(cfg, dims)
    elif r.free_loads:
        raise ValueError("rollout.free_loads=true is a way of streaming: set rollout.stream=true (or free_loads=false)")
    if dims.split and any(spec.model for spec in cfg.rewards):
        raise ValueError("rewards[].model (a reward model) is not supported with rollout.ranks > 0 (split mesh): "
                         "rewards are scored on the rollout ranks, which hold no models; use a reward function")


def check_stream(cfg: Config, dims) -> None:
    """Streaming's own limits (rlcore/modes/stream/), before anything loads."""
    r = cfg.rollout
    if not dims.split:
        raise ValueError("rollout.stream=true needs a split mesh: set rollout.ranks (the ranks that only generate)")
    if not cfg.algorithm.corrects_off_policy:
        raise ValueError("rollout.stream=true loads weights under requests in flight, so samples span versions: "
                         "the loss needs the off-policy correction, algorithm.tis_cap > 0 (e.g. 2)")
    if r.step_deadline_s:
        raise ValueError("rollout.step_deadline_s cuts a step's rollout, which streaming does not have (trajectories "
                         "run across steps): set rollout.step_deadline_s=0 (rollout.trajectory_timeout_s bounds each)")
    if getattr(cfg.algorithm, "dynamic_sampling", 0):
        raise ValueError("rollout.stream=true trains fixed groups in a fixed order: set algorithm.dynamic_sampling=0")
    if r.load_lag_steps != "auto":
        check_lag(cfg, dims)
    for name in ("load_lag_margin", "load_lag_margin_blocked"):
        value, default = getattr(r, name), getattr(type(r), name)
        if value != default and (r.free_loads or r.load_lag_steps != "auto"):
            other = "loads each version on arrival (rollout.free_loads=true)" if r.free_loads else \
                f"has load_lag_steps={r.load_lag_steps}"
            raise ValueError(f"rollout.{name}={value} sizes the lag rollout.load_lag_steps=auto measures; this run "
                             f"{other}: leave {name} at {default}")
    if r.load_lag_margin_blocked > r.load_lag_margin:
        raise ValueError(f"rollout.load_lag_margin_blocked={r.load_lag_margin_blocked} is above rollout."
                         f"load_lag_margin={r.load_lag_margin}: the lag once something waits for the version is at "
                         f"most the lag (set it between 1 and {r.load_lag_margin})")


def check_lag(cfg: Config, dims) -> None:
    """A fixed rollout.load_lag_steps: deterministic loads only, and a lag the engine can reach. After hand-over v
    the engine holds version v - 1 and may run batches v + 1 .. v + k only (k = max_staleness): at most k x P prompt
    groups (P: the engine's share of a step), each group's trajectories at most T engine steps long (single-turn:
    max_new_tokens; with an environment each of its max_total_tokens tokens may be a turn of its own that then waits
    join_steps). Past k x P x T steps the engine has always run out of work and loaded (the lag does nothing)."""
    r = cfg.rollout
    if r.free_loads:
        raise ValueError(f"rollout.load_lag_steps={r.load_lag_steps} places the deterministic load point, and "
                         f"rollout.free_loads=true loads each version on arrival instead; valid there: "
                         f"load_lag_steps=auto (or free_loads=false)")
    if r.agent:
        return  # an agent's calls have no token bound of the config's
    engines = max(r.ranks // max(r.tensor_parallel, 1), 1)
    groups = r.max_staleness * (r.prompts_per_step // engines)
    tokens = r.max_total_tokens or r.max_new_tokens
    steps = tokens * (1 + r.join_steps) if r.env else r.max_new_tokens
    if r.load_lag_steps > groups * steps:
        raise ValueError(f"rollout.load_lag_steps={r.load_lag_steps} can never be reached: after a hand-over an "
                         f"engine has at most {groups * steps} engine steps of work it may run ({r.max_staleness} "
                         f"batch(es) ahead (max_staleness) x {r.prompts_per_step // engines} prompt groups x {steps} "
                         f"steps per trajectory), then loads; valid: 0 to {groups * steps}, or auto")


def check_values(cfg: Config) -> None:
    """Each field of VALID in range (a wrong type, e.g. a string where a number belongs, fails too), the
    AdamW betas and reward weights, and a run name that stays inside output_dir."""
    check_fields(cfg, VALID)
    for section, optim in (("optim", cfg.optim), ("critic.optim", cfg.critic.optim)):
        if len(optim.betas) != 2 or not all(0 <= b < 1 for b in optim.betas):
            raise ValueError(f"{section}.betas must be two numbers in [0, 1) (got {optim.betas})")
    for i, spec in enumerate(cfg.rewards):
        if not math.isfinite(spec.weight):
            raise ValueError(f"rewards[{i}].weight must be a finite number (got {spec.weight})")
    name = str(cfg.name)
    if not name or name in (".", "..") or "/" in name or os.sep in name or "\0" in name:
        raise ValueError(f"name must be a plain folder name inside output_dir, without '/' or '..' "
                         f"(got {name!r})")
