"""The top of rlcore: build the run (setup), then hand it to its mode, and write the summary however it ends.

    torchrun --nproc-per-node 8 launch/train.py recipe=grpo

setup checks everything cheap on every rank first (rlcore/preflight/), then builds the mesh, the engine and the
four models into a Run (rlcore/run.py). The mode decides who generates, who trains and where they meet:
colocated (rlcore/modes/colocated.py: every rank generates, then trains, then syncs), the split mesh
(rlcore/modes/split.py, rollout.ranks=R) or streaming (rlcore/modes/stream/, rollout.stream=true); what every mode
does around a step is rlcore/modes/loop.py's.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from rlcore import rewards
from rlcore.config import Config
from rlcore.config.roles import Models, models_of
from rlcore.data import PromptStream, load_tokenizer
from rlcore.distributed import collectives, watchdog
from rlcore.distributed.collectives import Preempted
from rlcore.distributed.parallel import ParallelDims, build_meshes, device_type, init_distributed
from rlcore.engine import RolloutEngine
from rlcore.models import build as models
from rlcore.models import lora
from rlcore.modes import colocated, split, stream, transfer
from rlcore.modes.loop import Loop
from rlcore.outputs import checkpoint
from rlcore.outputs.metrics import RunLogger
from rlcore.outputs.summary import Summary
from rlcore.preflight import checks as preflight
from rlcore.rollout.envs import model_budget
from rlcore.run import Rollout, Run, Trainer
from rlcore.sandbox import pool as sandbox


def setup(cfg: Config) -> Run:
    """Check everything cheap on every rank first (rlcore/preflight/checks.py), then load."""
    init_distributed(watchdog.group_timeout(cfg.train.watchdog_s))
    collectives.set_scope(None)  # over the whole world until a mode scopes them (a run before may have left its own)
    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    dims = ParallelDims(world, cfg.rollout.tensor_parallel, cfg.rollout.ranks)
    run_dir, meta, resume_from, resume_notes = preflight.on_every_rank(preflight.check_config, cfg, dims)
    checkpoint.check_not_complete(cfg, run_dir, resume_from)  # nothing to do: every rank stops here, exit 0
    watchdog.start(cfg.train.watchdog_s)  # stopped by launch/train.py, whatever ends the run
    # Tools and reward functions reach one sandbox per rank through rlcore.sandbox.shared(): started on first use.
    sandbox.configure(cfg.sandbox)
    preflight.on_every_rank(preflight.prepare, cfg)
    hf_config, max_model_len, (launch_plan, plan_note) = preflight.on_every_rank(
        preflight.check_models, cfg, dims, per_node)
    tokenizer, reward_fns, table, envs, eval_rows = preflight.on_every_rank(
        preflight.load_inputs, cfg, hf_config.vocab_size)
    fsdp_mesh, rollout_mesh = build_meshes(dims)
    link = transfer.Link.make(dims.rollout_ranks, world, dims.tp, cfg.rollout.stream, cfg.rollout.free_loads,
                              stream.early_handover(cfg, dims)) if dims.split else None
    group, tp_rank = rollout_mesh.get_local_rank("dp"), rollout_mesh.get_local_rank("tp")
    generates, trains = dims.generates(rank), dims.trains(rank)  # both when colocated
    prompts = PromptStream(table, cfg.rollout.prompts_per_step // dims.rollout_groups, dims.rollout_groups,
                           group, cfg.seed, cfg.data.num_workers) if generates else None
    if rank == 0:
        from rlcore.config.cli import save_config
        save_config(cfg, run_dir / "config.json")
    torch.manual_seed(cfg.seed)
    engine = RolloutEngine(cfg, max_model_len, launch_plan.kv_bytes if launch_plan else None, dormant=not generates)
    held = models_of(cfg)
    rollout = Rollout(group, tp_rank, rollout_mesh.get_group("tp"), prompts, eval_rows, reward_fns, [], envs,
                      model_budget(cfg, envs)) if generates else None
    common = dict(cfg=cfg, dims=dims, models=held, tokenizer=tokenizer, engine=engine, run_dir=run_dir, meta=meta,
                  plan=launch_plan, resume_from=resume_from, link=link)
    if not trains:  # a rollout rank of a split mesh holds no model
        logger = RunLogger(run_dir, cfg.train.steps, enabled=rank == 0, start_step=checkpoint.saved_step(resume_from),
                           every=cfg.train.log_every, off_policy=off_policy(cfg, dims))
        for line in layout(cfg, dims, held, 0) + resume_notes:
            logger.print(line)
        return Run(**common, logger=logger, rollout=rollout, trainer=None)
    # Each model is built on the meta device and sharded, then each rank reads only its shards' rows (meta=True:
    # rlcore/models/load.py). LoRA: adapters go in before fully_shard; the optimizer holds them only.
    policy = models.shard(lora.apply(models.load_causal_lm(cfg.model, meta=True), cfg.lora, cfg.seed), fsdp_mesh,
                          cfg.model)
    optimizer, scheduler = models.build_optimizer(policy, lora.optim_config(cfg.lora, cfg.optim),
                                                  total_optimizer_steps(cfg))
    trainer = Trainer(policy, optimizer, scheduler, group=fsdp_mesh.get_group() if dims.split else None)
    # With LoRA the reference is the policy with its adapters off (lora.adapters_off): no copy is built.
    if held.reference == "copy":  # the policy's starting weights, or a distillation teacher
        reference = models.reference_config(cfg.model, cfg.algorithm.teacher)
        frozen = models.load_causal_lm(reference, trainable=False, meta=True)
        trainer.reference = models.shard(frozen, fsdp_mesh, cfg.model, frozen=True)
    if held.critic:
        trainer.critic = models.shard(models.load_critic(cfg.critic, cfg.model, meta=True), fsdp_mesh, cfg.model)
        trainer.critic_optimizer, trainer.critic_scheduler = models.build_optimizer(
            trainer.critic, cfg.critic.optim, total_optimizer_steps(cfg))
    reward_models = [(rewards.RewardModel(spec.model, models.shard(models.load_reward_model(
        spec.model, cfg.model, meta=True), fsdp_mesh, cfg.model, frozen=True), load_tokenizer(spec.model)), spec.weight)
                     for spec in cfg.rewards if spec.model]
    if rollout is not None:  # colocated: the reward stage scores with models sharded over every rank
        rollout.reward_models = reward_models
    wandb = None
    if cfg.logging.wandb:
        from rlcore.config.cli import config_to_dict
        wandb = {"project": cfg.logging.wandb_project, "name": cfg.name, "config": config_to_dict(cfg),
                 "id": f"{cfg.name}-{meta['fingerprint']}"}  # a resumed run continues the same wandb run
    logger = RunLogger(run_dir, cfg.train.steps, enabled=rank == 0, start_step=checkpoint.saved_step(resume_from),
                       wandb=wandb, every=cfg.train.log_every, off_policy=off_policy(cfg, dims))
    for line in layout(cfg, dims, held, len(reward_models)):
        logger.print(line)
    offload = " (CPU-offloaded)" if cfg.model.offload_frozen and device_type() == "cuda" else ""
    adapters = f", LoRA r={cfg.lora.rank} alpha={cfg.lora.alpha:g}, {cfg.lora.sync} sync" if held.lora else ""
    logger.print(f"rlcore: models: actor {cfg.model.path} (trained{adapters}) | critic "
                 + (f"{cfg.model.path if cfg.critic.path == 'policy' else cfg.critic.path} + value head (trained)"
                    if held.critic else "none")
                 + " | reference " + {"copy": f"{cfg.algorithm.teacher or cfg.model.path} (frozen{offload})",
                                      "adapters_off": "the actor with adapters off (no copy)",
                                      "none": "none"}[held.reference]
                 + " | reward " + ", ".join([f"{rewards.fn_name(f)} x{w:g}" for f, w in reward_fns]
                                            + [f"model {m.path} (frozen{offload}) x{w:g}" for m, w in reward_models]
                                            + ([f"env x{cfg.rollout.env_weight:g}"] if envs.factory else [])))
    if plan_note:
        logger.print(plan_note)
    if envs.factory:
        logger.print(f"rlcore: environment {envs.spec}: up to {envs.max_turns} turns of {cfg.rollout.max_new_tokens} "
                     f"tokens, {cfg.rollout.max_total_tokens or cfg.rollout.max_new_tokens} tokens after the prompt")
    for line in resume_notes:
        logger.print(line)
    return Run(**common, logger=logger, rollout=rollout, trainer=trainer)


def layout(cfg: Config, dims: ParallelDims, models: Models, reward_models: int, shown: int = 8) -> list[str]:
    """Which ranks hold which models and engines: one line per rank (the first `shown`)."""
    w, k = dims.world_size, dims.tp
    held = ["actor (trained)"] + (["critic (trained)"] if models.critic else []) \
        + (["reference"] if models.reference == "copy" else [])
    held += [f"reward model {i}" for i in range(reward_models)]
    if dims.split:  # rlcore/modes/split.py
        r, n, ro = dims.rollout_ranks, dims.trainers, cfg.rollout
        running = ro.max_running or ro.prompts_per_step // dims.rollout_groups * ro.group_size
        each = " per engine" if dims.rollout_groups > 1 else ""
        ahead = (f"streaming: up to {running} trajectories in flight{each}, "
                 f"each token at most {ro.max_staleness} version(s) behind" if ro.stream else
                 f"batches at most {ro.max_staleness} version(s) behind")
        lines = [f"rlcore: {w} ranks, split: ranks 0-{r - 1} generate ({dims.rollout_groups} vLLM engine(s) x "
                 f"tp={k}), ranks {r}-{w - 1} train (FSDP over {n}; each holds 1/{n} of: {', '.join(held)}); {ahead}"]
        for i in list(range(min(w, shown))):
            lines.append(f"  rank {i:<3} generates: engine {i // k} (tp rank {i % k} of {k})" if i < r else
                         f"  rank {i:<3} trains: FSDP shard {i - r} of {n} | engine {i // k} dormant")
        if w > shown:
            lines.append(f"  ranks {shown}-{w - 1} alike: rank < {r} generates, engine = rank // {k}")
        return lines
    lines = [f"rlcore: {w} ranks, {dims.rollout_groups} vLLM engine(s) x tp={k}, FSDP over {w}; each rank holds "
             f"1/{w} of: {', '.join(held)}"]
    for r in range(min(w, shown)):
        lines.append(f"  rank {r:<3} engine {r // k} (tp rank {r % k} of {k}) | FSDP shard {r} of {w}")
    if w > shown:
        lines.append(f"  ranks {shown}-{w - 1} alike: engine = rank // {k}")
    return lines


def off_policy(cfg: Config, dims: ParallelDims) -> bool:
    """Samples of an older policy reach the update (split at k >= 1, streaming): the engine-vs-trainer gap is
    staleness there, and the probe after each load is the drift alarm."""
    return dims.split and (cfg.rollout.max_staleness > 0 or cfg.rollout.stream)


def total_optimizer_steps(cfg: Config) -> int:
    return cfg.train.steps * cfg.train.epochs_per_step * cfg.train.mini_batches


def train(cfg: Config) -> dict[str, float]:
    """Run the whole job; returns {"eval/accuracy_start", "eval/accuracy_end", ...} on every rank (in a split
    mesh, on the rollout ranks)."""
    run = setup(cfg)
    stop = checkpoint.StopSignal()
    report, status = Summary(), "finished"
    report.mesh = layout(cfg, run.dims, run.models, len(run.rollout.reward_models) if run.rollout else 0)[0]
    loop = Loop(run, report, stop)
    try:
        mode = (stream.train if cfg.rollout.stream else split.train) if run.dims.split else colocated.train
        summary = mode(run, loop)
        if run.rollout and run.rollout.eval_rows and "eval/accuracy" in summary and "eval/accuracy_start" in summary:
            summary["eval/accuracy_end"] = summary["eval/accuracy"]
            start, end = summary["eval/accuracy_start"], summary["eval/accuracy_end"]
            run.logger.print(f"eval/accuracy on {len(run.rollout.eval_rows)} held-out prompts: start "
                             f"{100 * start:.1f}% -> end {100 * end:.1f}% ({100 * (end - start):+.1f} points)")
    except BaseException as e:
        status = f"{'preempted' if isinstance(e, Preempted) else 'stopped'}: {type(e).__name__}: {e}"
        raise
    finally:
        stop.restore()
        if run.rollout and run.rollout.envs.endpoint is not None:  # its HTTP server and thread end with the run
            run.rollout.envs.endpoint.shutdown()
        if run.logger.enabled:  # rank 0; needs no collective, so it is written whatever stopped the run
            run.logger.print(report.write(run.run_dir, cfg.name, status).rstrip())
            run.logger.print(f"rlcore: summary written to {run.run_dir / 'summary.md'}")
        run.logger.close()
    return summary
