"""The colocated RL loop: generate -> reward -> logprobs -> advantages -> update -> sync, on every rank.

One torchrun program. Each step, every rollout group (k ranks, one vLLM engine) runs `group_size`
trajectories for each prompt of its slice (one model turn, or several with an environment:
rlcore/rollout/); each rank of the group then trains on its own 1/k of them with FSDP2 over the whole
world (rlcore/update.py); finally the new weights are streamed into the engines in place.
The algorithm (advantages + loss) is whatever object the recipe put in `cfg.algorithm`.
"""
from __future__ import annotations

import importlib
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from rlcore import checkpoint, export, models, rewards, update
from rlcore.collectives import RunError, all_max, all_sum, reduce_sum
from rlcore.config import Config, validate
from rlcore.data import PromptStream, load_table, load_tokenizer, tokenize_prompts
from rlcore.metrics import RunLogger, peak_memory_gb
from rlcore.parallel import ParallelDims, build_meshes, device_type, init_distributed
from rlcore.rollout import RolloutEngine, SyncStats
from rlcore.rollout.collect import collect, evaluate, make_envs, model_budget
from rlcore.rollout.engine import check_architecture
from rlcore.rollout.turns import Envs


class Preempted(RunError):
    """SIGTERM / SIGUSR1: every rank finished the step and a checkpoint was written; requeue to continue."""


@dataclass
class Run:
    """Everything a step needs, built once by `setup`."""
    cfg: Config
    dims: ParallelDims
    group: int  # this rank's rollout group (index along the "dp" axis)
    tp_rank: int  # this rank's place inside the group (index along the "tp" axis)
    tp_group: object  # the process group of this rank's engine (environment results are shared in it)
    tokenizer: object
    prompts: PromptStream
    eval_rows: list[dict]
    reward_fns: list  # [(function, weight)]
    reward_models: list  # [(RewardModel, weight)]
    envs: Envs  # the environment (or single-turn) settings of the turn loop
    model_budget: int  # model tokens a trajectory can hold (all turns)
    engine: RolloutEngine
    policy: torch.nn.Module
    reference: torch.nn.Module | None
    critic: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: object
    critic_optimizer: torch.optim.Optimizer | None
    critic_scheduler: object
    logger: RunLogger
    run_dir: Path
    meta: dict = field(default_factory=dict)  # what checkpoints record about this run (checkpoint.describe)
    resume_from: Path | None = None  # the checkpoint to load before the first step


def setup(cfg: Config) -> Run:
    """Validate everything cheap first (config, mesh degrees, model config, data), then load."""
    init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    dims = ParallelDims(world, cfg.rollout.tensor_parallel)
    dims.validate()
    validate(cfg, dims)
    run_dir = Path(cfg.output_dir) / cfg.name
    meta = checkpoint.describe(cfg, world, dims.rollout_groups)
    # A missing, incomplete or foreign checkpoint fails here, before anything loads.
    resume_from, resume_notes = checkpoint.resolve(cfg, run_dir, meta)
    if cfg.prepare:
        # Local assets (e.g. the embedded tiny model) are built once, by rank 0.
        if rank == 0:
            module, _, fn = cfg.prepare.partition(":")
            getattr(importlib.import_module(module), fn)(cfg)
        dist.barrier()
    hf_config = models.check_model(cfg.model.path)
    check_architecture(cfg.model.path, hf_config)
    for i, spec in enumerate(cfg.rewards):
        if spec.model:
            models.check_reward_model(spec.model, f"rewards[{i}].model")
    if needs_critic(cfg) and cfg.critic.path != "policy" and not _is_value_model(cfg.critic.path):
        models.check_model(cfg.critic.path, "critic.path")  # a backbone to put a new value head on
    dims.validate(hf_config.num_attention_heads, getattr(hf_config, "num_key_value_heads", None))
    # The engine's context holds the prompt and everything after it: all turns, model and environment tokens.
    after = cfg.rollout.max_total_tokens or cfg.rollout.max_new_tokens
    max_model_len = cfg.rollout.max_model_len or cfg.data.max_prompt_tokens + after
    context = getattr(hf_config, "max_position_embeddings", max_model_len)
    if max_model_len > context or cfg.data.max_prompt_tokens + after > max_model_len:
        which = "max_total_tokens" if cfg.rollout.max_total_tokens else "max_new_tokens"
        raise ValueError(f"data.max_prompt_tokens + rollout.{which} = {cfg.data.max_prompt_tokens + after} does "
                         f"not fit the engine context (rollout.max_model_len={max_model_len}, model max {context})")

    tokenizer = load_tokenizer(cfg.model.path)
    reward_fns = [(rewards.resolve(spec.fn), spec.weight) for spec in cfg.rewards if not spec.model]
    table = tokenize_prompts(load_table(cfg.data.path, cfg.data.split, cfg.data.name, "data.path"),
                             cfg.data, tokenizer, "data.path")
    fsdp_mesh, rollout_mesh = build_meshes(dims)
    group, tp_rank = rollout_mesh.get_local_rank("dp"), rollout_mesh.get_local_rank("tp")
    prompts = PromptStream(table, cfg.rollout.prompts_per_step // dims.rollout_groups, dims.rollout_groups,
                           group, cfg.seed, cfg.data.num_workers)
    envs = make_envs(cfg, tokenizer, table[0], hf_config.vocab_size)  # one instance from the first row, checked
    eval_rows = []
    if cfg.data.eval_path:
        held_out = tokenize_prompts(load_table(cfg.data.eval_path, cfg.data.eval_split, cfg.data.name,
                                               "data.eval_path"), cfg.data, tokenizer, "data.eval_path")
        eval_rows = list(held_out.select(range(min(len(held_out), cfg.data.eval_size or len(held_out)))))

    if rank == 0:
        from rlcore.cli import save_config
        save_config(cfg, run_dir / "config.json")
    torch.manual_seed(cfg.seed)
    engine = RolloutEngine(cfg, max_model_len)
    policy = models.shard(models.load_causal_lm(cfg.model), fsdp_mesh, cfg.model)
    optimizer, scheduler = models.build_optimizer(policy, cfg.optim, total_optimizer_steps(cfg))
    reference = critic = critic_optimizer = critic_scheduler = None
    if cfg.algorithm.needs_reference:
        reference = models.shard(models.load_causal_lm(cfg.model, trainable=False), fsdp_mesh, cfg.model,
                                 frozen=True)
    if needs_critic(cfg):
        critic = models.shard(models.load_critic(cfg.critic, cfg.model), fsdp_mesh, cfg.model)
        critic_optimizer, critic_scheduler = models.build_optimizer(critic, cfg.critic.optim,
                                                                    total_optimizer_steps(cfg))
    reward_models = [(rewards.RewardModel(spec.model, models.shard(models.load_reward_model(spec.model, cfg.model),
                                                           fsdp_mesh, cfg.model, frozen=True),
                                  load_tokenizer(spec.model)), spec.weight)
                     for spec in cfg.rewards if spec.model]
    logger = RunLogger(run_dir, cfg.train.steps, enabled=rank == 0, start_step=checkpoint.saved_step(resume_from))
    logger.print(f"rlcore: {world} ranks, {dims.rollout_groups} vLLM engine(s) x tp={dims.tp}, FSDP over "
                 f"{world}")
    critic_from = cfg.model.path if cfg.critic.path == "policy" else cfg.critic.path
    offload = " (CPU-offloaded)" if cfg.model.offload_frozen and device_type() == "cuda" else ""
    logger.print(f"rlcore: models: actor {cfg.model.path} (trained) | critic "
                 + (f"{critic_from} + value head (trained)" if critic else "none")
                 + " | reference " + (f"{cfg.model.path} (frozen{offload})" if reference else "none")
                 + " | reward " + ", ".join([f"{rewards.fn_name(f)} x{w:g}" for f, w in reward_fns]
                                            + [f"model {m.path} (frozen{offload}) x{w:g}" for m, w in reward_models]
                                            + ([f"env x{cfg.rollout.env_weight:g}"] if envs.factory else [])))
    if envs.factory:
        logger.print(f"rlcore: environment {envs.spec}: up to {envs.max_turns} turns of {cfg.rollout.max_new_tokens} "
                     f"tokens, {after} tokens after the prompt")
    for line in resume_notes:
        logger.print(line)
    return Run(cfg, dims, group, tp_rank, rollout_mesh.get_group("tp"), tokenizer, prompts, eval_rows, reward_fns,
               reward_models, envs, model_budget(cfg, envs), engine,
               policy, reference, critic, optimizer, scheduler, critic_optimizer, critic_scheduler, logger, run_dir,
               meta=meta, resume_from=resume_from)


def trained_models(run: Run) -> dict[str, tuple]:
    """Every model the run trains, with its optimizer and LR scheduler: what a checkpoint holds."""
    trained = {"policy": (run.policy, run.optimizer, run.scheduler)}
    if run.critic is not None:
        trained["critic"] = (run.critic, run.critic_optimizer, run.critic_scheduler)
    return trained


def needs_critic(cfg: Config) -> bool:
    return bool(getattr(cfg.algorithm, "needs_critic", False))


def _is_value_model(path: str) -> bool:
    """A saved critic (token classifier) rather than a causal LM backbone."""
    config = Path(path) / "config.json"
    return config.exists() and "ForTokenClassification" in config.read_text()


def total_optimizer_steps(cfg: Config) -> int:
    return cfg.train.steps * cfg.train.epochs_per_step * cfg.train.mini_batches


def train_step(run: Run, step: int) -> dict[str, float]:
    cfg, t_step = run.cfg, time.perf_counter()
    batch, metrics = collect(run, step)
    run.engine.sleep()

    t = time.perf_counter()
    # On-policy, the update's own forward gives the old logprobs and the check runs before its step.
    separate = not update.takes_old_logprobs(cfg)
    if separate:
        batch.old_logprobs = update.forward_logprobs(run, run.policy, batch)
    if run.reference is not None:
        batch.ref_logprobs = update.forward_logprobs(run, run.reference, batch)
    if run.critic is not None:
        batch.values = update.forward_values(run, batch)
    checked = {}

    def check_sync() -> None:
        # The engine sampled with the weights the trainer holds now: any gap is a broken sync.
        diff = (batch.old_logprobs - batch.rollout_logprobs).abs() * batch.loss_mask
        checked["sum"], checked["tokens"] = all_sum(diff.sum().item(), batch.loss_mask.sum().item())
        checked["max"] = all_max(diff.max().item())
        if checked["max"] > cfg.rollout.logprob_diff_threshold:
            raise RunError(f"rollout/logprob_diff_max={checked['max']:.3g} exceeds rollout.logprob_diff_threshold="
                           f"{cfg.rollout.logprob_diff_threshold:g} at step {step}: the inference engine holds "
                           f"stale or corrupted weights (weight sync failed)")

    if separate:
        check_sync()
    t_logprobs = time.perf_counter() - t

    t = time.perf_counter()
    batch.advantages, advantage_metrics = cfg.algorithm.advantages(batch, reduce_sum)
    metrics |= advantage_metrics | update.update(run, batch, before_step=None if separate else check_sync)
    t_train = time.perf_counter() - t

    # A step with nothing applied left the policy as the engine already holds it: no sync.
    stats = run.engine.sync_weights(run.policy) if metrics["optim/steps_applied"] else SyncStats(0.0, 0, 0)
    n, length = all_sum(len(batch), batch.loss_mask.sum().item())
    metrics |= {
        "response/length_mean": length / n,
        "rollout/logprob_diff_mean": checked["sum"] / max(checked["tokens"], 1.0),
        "rollout/logprob_diff_max": checked["max"],
        "time/logprobs_s": t_logprobs, "time/train_s": t_train, "time/sync_s": stats.seconds,
        "time/step_s": time.perf_counter() - t_step,
        "throughput/train_tok_s": length / max(t_train, 1e-9),
        "sync/gb": stats.bytes / 1e9, "sync/peak_bucket_gb": stats.peak_bucket_bytes / 1e9,
        "memory/peak_gb": all_max(peak_memory_gb()),
    }
    return metrics


def train(cfg: Config) -> dict[str, float]:
    """Run the whole job; returns {"eval/accuracy_start", "eval/accuracy_end", ...} on every rank."""
    run = setup(cfg)
    summary: dict[str, float] = {}
    # Everything the loop carries from step to step; a checkpoint saves it (rollout seeds are derived).
    loop = {"step": 0, "skipped_steps": 0, "skipped_in_a_row": 0}
    stop = checkpoint.StopSignal()
    try:
        if run.resume_from is not None:
            loop, notes = checkpoint.load(run.resume_from, trained_models(run), run.prompts, run.group)
            for line in notes:
                run.logger.print(line)
            # The engine started from model.path: it samples with the checkpointed weights from step one.
            run.engine.sync_weights(run.policy)
            summary = {k: v for k, v in loop.items() if k.startswith("eval/")}
        elif run.eval_rows:
            summary["eval/accuracy_start"] = loop["eval/accuracy_start"] = evaluate(run)["eval/accuracy"]
            run.logger.log(0, {"eval/accuracy": summary["eval/accuracy_start"]})
        for step in range(loop["step"] + 1, cfg.train.steps + 1):
            metrics = train_step(run, step)
            skipped = metrics.pop("train/skipped")
            loop["step"], loop["skipped_steps"] = step, loop["skipped_steps"] + int(skipped)
            loop["skipped_in_a_row"] = loop["skipped_in_a_row"] + 1 if skipped else 0
            metrics["train/skipped_steps"] = loop["skipped_steps"]
            if run.eval_rows and (step % cfg.train.eval_every == 0 or step == cfg.train.steps):
                metrics |= evaluate(run)
            run.logger.log(step, metrics)
            summary |= metrics
            if loop["skipped_in_a_row"] >= cfg.train.max_skipped_steps:
                raise RunError(f"{loop['skipped_in_a_row']} steps in a row had a non-finite loss or gradient "
                               f"(train.max_skipped_steps={cfg.train.max_skipped_steps}); stopped at step {step} "
                               f"with the weights of the last finite step")
            save_and_export(run, step, loop, stop)
        if run.eval_rows and "eval/accuracy" in summary and "eval/accuracy_start" in summary:
            summary["eval/accuracy_end"] = summary["eval/accuracy"]
            start, end = summary["eval/accuracy_start"], summary["eval/accuracy_end"]
            run.logger.print(f"eval/accuracy on {len(run.eval_rows)} held-out prompts: start {100 * start:.1f}% "
                             f"-> end {100 * end:.1f}% ({100 * (end - start):+.1f} points)")
    finally:
        stop.restore()
        run.logger.close()
    return summary


def save_and_export(run: Run, step: int, loop: dict, stop: checkpoint.StopSignal) -> None:
    """Checkpoint every train.save_every steps, at the end, and when a signal asks the run to stop;
    HF export every train.export_every steps and at the end. A save that fails stops the run."""
    t, last = run.cfg.train, step == run.cfg.train.steps
    preempted = stop.any_rank(device_type())  # collective: every rank stops after the same step
    root = run.run_dir / "checkpoints"
    try:
        if preempted or last or (t.save_every and step % t.save_every == 0):
            t0 = time.perf_counter()
            path = checkpoint.save(root, step, trained_models(run), run.prompts, loop, run.meta,
                                   t.keep_checkpoints, run.tokenizer)
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20
            run.logger.print(f"checkpoint {path} ({size:.1f} MiB, {time.perf_counter() - t0:.1f} s)")
        if last or (t.export_every and step % t.export_every == 0):
            export.export_hf(run.run_dir / "hf" / f"step_{step}", run.policy, run.cfg.model.path, run.tokenizer)
    except checkpoint.SaveError as e:
        complete = checkpoint.scan(root)[0]
        kept = f"{complete[-1]} is intact" if complete else "there is no earlier checkpoint"
        raise RunError(f"{e}; {kept}") from None
    if preempted:
        name = signal.Signals(stop.received).name if stop.received else "a signal to another rank"
        raise Preempted(f"{name} after step {step}; checkpoint {path} written; continue with resume=auto")
