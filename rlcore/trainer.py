"""The colocated RL loop: generate -> reward -> logprobs -> advantages -> update -> sync, on every rank.

One torchrun program. Each step, every rollout group (k ranks, one vLLM engine) samples `group_size`
responses for its slice of the prompts; each rank of the group then trains on its own 1/k of them
with FSDP2 over the whole world; finally the new weights are streamed into the engines in place.
The algorithm (advantages + loss) is whatever object the recipe put in `cfg.algorithm`.
"""
from __future__ import annotations

import importlib
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from rlcore import checkpoint, export, models, rewards
from rlcore.batch import Batch, Normaliser
from rlcore.config import Config
from rlcore.data import PromptStream, load_table, tokenize_prompts
from rlcore.metrics import RunLogger, peak_memory_gb
from rlcore.objectives import local_normaliser
from rlcore.parallel import ParallelDims, build_meshes, device_type, init_distributed
from rlcore.rollout import RolloutEngine, SyncStats


class RunError(RuntimeError):
    """The run must stop (every rank raises it together, with the same one-line message)."""


class Preempted(RunError):
    """SIGTERM / SIGUSR1: every rank finished the step and a checkpoint was written; requeue to continue."""


def agree(error: str | None) -> None:
    """Collective: if any rank hit an error, every rank raises it (so no rank waits forever)."""
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    first = next((e for e in errors if e), None)
    if first:
        raise RunError(first)


def all_sum(*values: float) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device_type())
    dist.all_reduce(t)
    return t.tolist()


def all_max(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device_type())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def all_min(value: float) -> float:
    return -all_max(-value)


def rollout_seed(run_seed: int, step: int, prompt_index: int, group_size: int) -> int:
    """vLLM draws sample j of a request seeded s with seed s + j: keep prompts group_size apart."""
    return ((run_seed * 1_000_003 + step) * 1_000_033 + prompt_index) * group_size % 2**62


@dataclass
class Run:
    """Everything a step needs, built once by `setup`."""
    cfg: Config
    dims: ParallelDims
    group: int  # this rank's rollout group (index along the "dp" axis)
    tp_rank: int  # this rank's place inside the group (index along the "tp" axis)
    tokenizer: object
    prompts: PromptStream
    eval_rows: list[dict]
    reward_fns: list  # [(function, weight)]
    reward_models: list  # [(RewardModel, weight)]
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


@dataclass
class RewardModel:
    """A frozen sequence classifier scoring (prompt, completion) texts with its own tokenizer."""
    path: str
    model: torch.nn.Module
    tokenizer: object


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
    for i, spec in enumerate(cfg.rewards):
        if spec.model:
            models.check_reward_model(spec.model, f"rewards[{i}].model")
    if needs_critic(cfg) and cfg.critic.path != "policy" and not _is_value_model(cfg.critic.path):
        models.check_model(cfg.critic.path, "critic.path")  # a backbone to put a new value head on
    dims.validate(hf_config.num_attention_heads, getattr(hf_config, "num_key_value_heads", None))
    max_model_len = cfg.rollout.max_model_len or cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    context = getattr(hf_config, "max_position_embeddings", max_model_len)
    if max_model_len > context or cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens > max_model_len:
        raise ValueError(f"data.max_prompt_tokens + rollout.max_new_tokens = "
                         f"{cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens} does not fit the engine "
                         f"context (rollout.max_model_len={max_model_len}, model max {context})")

    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    reward_fns = [(rewards.resolve(spec.fn), spec.weight) for spec in cfg.rewards if not spec.model]
    table = tokenize_prompts(load_table(cfg.data.path, cfg.data.split, cfg.data.name, "data.path"),
                             cfg.data, tokenizer, "data.path")
    fsdp_mesh, rollout_mesh = build_meshes(dims)
    group, tp_rank = rollout_mesh.get_local_rank("dp"), rollout_mesh.get_local_rank("tp")
    prompts = PromptStream(table, cfg.rollout.prompts_per_step // dims.rollout_groups, dims.rollout_groups,
                           group, cfg.seed, cfg.data.num_workers)
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
    reward_models = [(RewardModel(spec.model, models.shard(models.load_reward_model(spec.model, cfg.model),
                                                           fsdp_mesh, cfg.model, frozen=True),
                                  AutoTokenizer.from_pretrained(spec.model)), spec.weight)
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
                                            + [f"model {m.path} (frozen{offload}) x{w:g}" for m, w in reward_models]))
    for line in resume_notes:
        logger.print(line)
    return Run(cfg, dims, group, tp_rank, tokenizer, prompts, eval_rows, reward_fns, reward_models, engine,
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


def validate(cfg: Config, dims: ParallelDims) -> None:
    if cfg.algorithm is None or not hasattr(cfg.algorithm, "loss"):
        raise ValueError("algorithm is not set: the recipe must set cfg.algorithm (e.g. GRPO())")
    cfg.algorithm.validate(cfg)
    if not cfg.rewards:
        raise ValueError("rewards is empty: the recipe must list at least one reward function or model")
    for i, spec in enumerate(cfg.rewards):
        if bool(spec.fn) == bool(spec.model):
            raise ValueError(f"rewards[{i}] must set exactly one of fn (a reward function) or model (a "
                             f"sequence-classification reward model)")
    if cfg.data.eval_path and not any(spec.fn for spec in cfg.rewards):
        raise ValueError("data.eval_path needs a reward function in rewards (the first one scores held-out "
                         "correctness); set data.eval_path= to turn eval off")
    r, t = cfg.rollout, cfg.train
    if r.prompts_per_step % dims.world_size:
        raise ValueError(f"rollout.prompts_per_step={r.prompts_per_step} must be divisible by the world "
                         f"size {dims.world_size} (every rank trains on whole prompt groups)")
    rows = r.prompts_per_step // dims.world_size * r.group_size
    if rows % t.mini_batches:
        raise ValueError(f"train.mini_batches={t.mini_batches} must divide the {rows} sequences per rank")
    for name, value in (("train.steps", t.steps), ("train.micro_batch_size", t.micro_batch_size),
                        ("rollout.max_new_tokens", r.max_new_tokens), ("train.eval_every", t.eval_every),
                        ("train.keep_checkpoints", t.keep_checkpoints), ("train.max_skipped_steps",
                                                                         t.max_skipped_steps)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1 (got {value})")
    if r.temperature <= 0:
        raise ValueError(f"rollout.temperature must be > 0 for training samples (got {r.temperature})")
    for name, value in (("train.save_every", t.save_every), ("train.export_every", t.export_every)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0 (0 = only at the end; got {value})")


def total_optimizer_steps(cfg: Config) -> int:
    return cfg.train.steps * cfg.train.epochs_per_step * cfg.train.mini_batches


def sample(run: Run, step: int, draw: int = 0) -> tuple[Batch, list[dict], list[str], int]:
    """Sample this group's next prompts; keep this rank's 1/k of them. Returns (batch, rows, completions,
    tokens generated by this rank's share of the engine). `draw` > 0 are dynamic sampling's extra draws."""
    cfg, G = run.cfg, run.cfg.rollout.group_size
    rows = run.prompts.next_batch()  # identical on every rank of the group
    first = draw * cfg.rollout.prompts_per_step + run.group * len(rows)
    seeds = [rollout_seed(cfg.seed, step, first + i, G) for i in range(len(rows))]
    samples = run.engine.generate([r["prompt_ids"] for r in rows], G, cfg.rollout.max_new_tokens,
                                  cfg.rollout.temperature, seeds)
    generated = sum(len(s.token_ids) for per_prompt in samples for s in per_prompt)
    share = len(rows) // run.dims.tp
    mine = slice(run.tp_rank * share, (run.tp_rank + 1) * share)
    rows, samples = rows[mine], samples[mine]
    pairs = [(r["prompt_ids"], s) for r, per_prompt in zip(rows, samples) for s in per_prompt]
    L = max(len(p) + len(s.token_ids) for p, s in pairs)
    input_ids = torch.full((len(pairs), L), pad_id(run.tokenizer), dtype=torch.long)
    attention_mask = torch.zeros(len(pairs), L, dtype=torch.long)
    loss_mask = torch.zeros(len(pairs), L - 1)
    rollout_logprobs = torch.zeros(len(pairs), L - 1)
    for i, (p, s) in enumerate(pairs):
        n, m = len(p), len(s.token_ids)
        input_ids[i, :n + m] = torch.tensor(p + s.token_ids)
        attention_mask[i, :n + m] = 1
        loss_mask[i, n - 1:n + m - 1] = 1  # position t scores token t + 1
        rollout_logprobs[i, n - 1:n + m - 1] = torch.tensor(s.logprobs)
    completions = [run.tokenizer.decode(s.token_ids, skip_special_tokens=True) for _, s in pairs]
    batch = Batch(input_ids, attention_mask, loss_mask, rollout_logprobs, torch.zeros(len(pairs)), G,
                  cfg.rollout.max_new_tokens)
    return batch, [r for r in rows for _ in range(G)], completions, generated // run.dims.tp


def pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def collect(run: Run, step: int) -> tuple[Batch, dict[str, float]]:
    """Generate and reward this rank's share of the step. With dynamic sampling, groups whose rewards are all
    equal (zero advantage under any group baseline) are dropped and further prompts drawn, in rounds taken
    by every rank together, until every rank has its share or the algorithm's bound on rounds is spent."""
    cfg, G = run.cfg, run.cfg.rollout.group_size
    extra_draws = getattr(cfg.algorithm, "dynamic_sampling", 0)
    need = cfg.rollout.prompts_per_step // run.dims.world_size * G  # sequences per rank
    kept: list[Batch] = []
    have = drawn_groups = kept_groups = 0
    r_sum = r_sq = r_n = generated = t_generate = t_reward = 0.0
    part_sums: dict[str, float] = {}
    for draw in range(1 + extra_draws):
        t = time.perf_counter()
        batch, rows, completions, tokens = sample(run, step, draw)
        t_generate += time.perf_counter() - t
        t = time.perf_counter()
        batch.rewards, parts = score(run, rows, completions)
        t_reward += time.perf_counter() - t
        for name, values in parts.items():
            part_sums[name] = part_sums.get(name, 0.0) + values.sum().item()
        generated += tokens
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
        r_sum, r_sq, r_n, generated, drawn_groups, kept_groups, *(part_sums[k] for k in names))
    mean = r_sum / r_n
    stats = {f"reward/{name}": total / r_n for name, total in zip(names, part_totals)}  # unweighted, each
    stats |= {"reward/mean": mean, "reward/std": max(r_sq / r_n - mean ** 2, 0.0) ** 0.5,
             "time/generate_s": t_generate, "time/reward_s": t_reward,
             "throughput/generate_tok_s": generated / max(t_generate, 1e-9)}
    if extra_draws:
        stats |= {"rollout/draws": draw + 1, "rollout/kept_group_frac": kept_groups / drawn_groups}
    return batch, stats


def reward_inputs(rows: list[dict], prompt_column: str) -> tuple[list[str], dict[str, list]]:
    """Dataset rows -> (prompt texts, every other column as a list) for the reward functions."""
    columns = {k: [r[k] for r in rows] for k in rows[0] if k not in (prompt_column, "prompt_ids")}
    return [r[prompt_column] for r in rows], columns


def score(run: Run, rows: list[dict], completions: list[str]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weighted reward per sequence [B] from the reward functions plus the reward models, and each one's
    unweighted scores by name. Any rank's reward-function error stops every rank before the update."""
    prompts, columns = reward_inputs(rows, run.cfg.data.prompt_column)
    error, total, parts = None, torch.zeros(len(rows)), {}
    try:
        if run.reward_fns:
            total, parts = rewards.score(run.reward_fns, prompts, completions, columns)
    except rewards.RewardError as e:
        error = str(e)
    agree(error)
    for i, (rm, weight) in enumerate(run.reward_models):
        parts[f"model{i}"] = reward_model_scores(run, rm, prompts, completions)
        total = total + weight * parts[f"model{i}"]
    return total, parts


@torch.no_grad()
def reward_model_scores(run: Run, rm: RewardModel, prompts: list[str], completions: list[str]) -> torch.Tensor:
    """[B] scores from a reward model: prompt + completion re-tokenized with the reward model's tokenizer
    (through its chat template, as a user and an assistant turn, when the data uses one)."""
    if run.cfg.data.chat_template and rm.tokenizer.chat_template:
        ids = [rm.tokenizer.apply_chat_template([{"role": "user", "content": p}, {"role": "assistant", "content": c}],
                                                tokenize=True) for p, c in zip(prompts, completions)]
        ids = [x["input_ids"] if hasattr(x, "keys") else x for x in ids]
    else:
        ids = [rm.tokenizer(p + c).input_ids for p, c in zip(prompts, completions)]
    dev, mbs, out = device_type(), run.cfg.train.micro_batch_size, []
    for i in range(0, len(ids), mbs):
        chunk = ids[i:i + mbs]
        L = max(map(len, chunk))
        input_ids = torch.tensor([x + [pad_id(rm.tokenizer)] * (L - len(x)) for x in chunk], device=dev)
        attention_mask = torch.tensor([[1] * len(x) + [0] * (L - len(x)) for x in chunk], device=dev)
        out.append(models.sequence_scores(rm.model, input_ids, attention_mask).cpu())
    return torch.cat(out)


@torch.no_grad()
def forward_logprobs(run: Run, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    dev, mbs = device_type(), run.cfg.train.micro_batch_size
    out = [models.token_logprobs(model, batch.input_ids[i:i + mbs].to(dev),
                                 batch.attention_mask[i:i + mbs].to(dev), run.cfg.rollout.temperature).cpu()
           for i in range(0, len(batch), mbs)]
    return torch.cat(out)  # [B, T]


@torch.no_grad()
def forward_values(run: Run, batch: Batch) -> torch.Tensor:
    dev, mbs = device_type(), run.cfg.train.micro_batch_size
    out = [models.token_values(run.critic, batch.input_ids[i:i + mbs].to(dev),
                               batch.attention_mask[i:i + mbs].to(dev)).cpu() for i in range(0, len(batch), mbs)]
    return torch.cat(out) * batch.loss_mask  # [B, T]


def reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over every rank (the `reduce` algorithms use for global statistics)."""
    out = t.to(device_type(), torch.float64)
    dist.all_reduce(out)
    return out.cpu()


def update(run: Run, batch: Batch) -> dict[str, float]:
    """epochs x mini-batches optimizer steps; each normalises by counts summed over ranks + micro-batches.
    The critic (when there is one) takes its own optimizer step on the same micro-batches."""
    cfg, dev = run.cfg, device_type()
    rows = len(batch) // cfg.train.mini_batches
    sums: dict[str, float] = {}
    grad_norms, value_grad_norms, applied, skipped = [], [], 0, False
    for _ in range(cfg.train.epochs_per_step):
        if skipped:
            break
        for start in range(0, len(batch), rows):
            mini = batch.rows(start, start + rows)
            local = local_normaliser(mini.loss_mask)  # summed over this rank's micro-batches...
            tokens, sequences = all_sum(local.tokens, local.sequences)  # ...and over every rank
            norm = Normaliser(tokens, sequences, max_len=cfg.rollout.max_new_tokens)
            loss_sum = 0.0
            for i in range(0, len(mini), cfg.train.micro_batch_size):
                micro = mini.rows(i, i + cfg.train.micro_batch_size).to(dev)
                logprobs, entropy = models.token_logprobs(run.policy, micro.input_ids, micro.attention_mask,
                                                          cfg.rollout.temperature, with_entropy=True)
                loss, metrics = cfg.algorithm.loss(micro, logprobs, norm)
                loss.backward()
                loss_sum += loss.item()
                metrics["policy/entropy"] = (entropy.detach() * micro.loss_mask).sum() / max(norm.tokens, 1.0)
                if run.critic is not None:
                    values = models.token_values(run.critic, micro.input_ids, micro.attention_mask)
                    value_loss, value_metrics = cfg.algorithm.value_loss(micro, values, norm)
                    value_loss.backward()
                    loss_sum += value_loss.item()
                    metrics |= value_metrics
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
            grad_norms.append(models.clip_grad_norm(run.policy, cfg.optim.max_grad_norm))
            if run.critic is not None:
                value_grad_norms.append(models.clip_grad_norm(run.critic, cfg.critic.optim.max_grad_norm))
            # Non-finite guard: a NaN/inf loss (policy + critic) or gradient is never applied, and the rest
            # of the update is dropped (earlier optimizer steps of it stay applied). All numbers are global.
            if not step_is_finite(*all_sum(loss_sum), grad_norms[-1], *value_grad_norms[-1:]):
                for opt in (run.optimizer, run.critic_optimizer):
                    if opt is not None:
                        opt.zero_grad(set_to_none=True)
                skipped = True
                break
            applied += 1
            for opt, sched in ((run.optimizer, run.scheduler), (run.critic_optimizer, run.critic_scheduler)):
                if opt is not None:
                    opt.step()
                    sched.step()
                    opt.zero_grad(set_to_none=True)
    keys = sorted(sums)
    totals = all_sum(*(sums[k] for k in keys))
    n_steps = len(grad_norms)
    out = {k: v / n_steps for k, v in zip(keys, totals)}
    out["policy/grad_norm"] = sum(grad_norms) / n_steps
    out["optim/lr"] = run.scheduler.get_last_lr()[0]
    if value_grad_norms:
        out["value/grad_norm"] = sum(value_grad_norms) / n_steps
    out["optim/steps_applied"] = applied
    out["train/skipped"] = float(skipped)
    return out


def step_is_finite(*values: float) -> bool:
    """True when every value (global loss sums, global gradient norms) is finite: pass numbers that are
    the same on every rank, so every rank skips together. A critic adds its loss and norm here."""
    return all(math.isfinite(v) for v in values)


def train_step(run: Run, step: int) -> dict[str, float]:
    cfg, t_step = run.cfg, time.perf_counter()
    batch, metrics = collect(run, step)
    run.engine.sleep()

    t = time.perf_counter()
    batch.old_logprobs = forward_logprobs(run, run.policy, batch)
    if run.reference is not None:
        batch.ref_logprobs = forward_logprobs(run, run.reference, batch)
    if run.critic is not None:
        batch.values = forward_values(run, batch)
    # The engine sampled with the weights the trainer holds now: any gap is a broken sync.
    diff = (batch.old_logprobs - batch.rollout_logprobs).abs() * batch.loss_mask
    diff_sum, tokens = all_sum(diff.sum().item(), batch.loss_mask.sum().item())
    diff_max = all_max(diff.max().item())
    t_logprobs = time.perf_counter() - t
    if diff_max > cfg.rollout.logprob_diff_threshold:
        raise RunError(f"rollout/logprob_diff_max={diff_max:.3g} exceeds rollout.logprob_diff_threshold="
                       f"{cfg.rollout.logprob_diff_threshold:g} at step {step}: the inference engine holds "
                       f"stale or corrupted weights (weight sync failed)")

    t = time.perf_counter()
    batch.advantages, advantage_metrics = cfg.algorithm.advantages(batch, reduce_sum)
    metrics |= advantage_metrics | update(run, batch)
    t_train = time.perf_counter() - t

    # A step with nothing applied left the policy as the engine already holds it: no sync.
    stats = run.engine.sync_weights(run.policy) if metrics["optim/steps_applied"] else SyncStats(0.0, 0, 0)
    n, length = all_sum(len(batch), batch.loss_mask.sum().item())
    metrics |= {
        "response/length_mean": length / n,
        "rollout/logprob_diff_mean": diff_sum / max(tokens, 1.0),
        "rollout/logprob_diff_max": diff_max,
        "time/logprobs_s": t_logprobs, "time/train_s": t_train, "time/sync_s": stats.seconds,
        "time/step_s": time.perf_counter() - t_step,
        "throughput/train_tok_s": length / max(t_train, 1e-9),
        "sync/gb": stats.bytes / 1e9, "sync/peak_bucket_gb": stats.peak_bucket_bytes / 1e9,
        "memory/peak_gb": all_max(peak_memory_gb()),
    }
    return metrics


def evaluate(run: Run) -> dict[str, float]:
    """Greedy answers to the held-out prompts; accuracy = share whose first reward (correctness) is 1."""
    rows = run.eval_rows[run.group::run.dims.rollout_groups]
    max_tokens = run.cfg.rollout.eval_max_new_tokens or run.cfg.rollout.max_new_tokens
    outs = run.engine.greedy([r["prompt_ids"] for r in rows], max_tokens)
    mine = [(r, o) for i, (r, o) in enumerate(zip(rows, outs)) if i % run.dims.tp == run.tp_rank]
    correct = 0.0
    if mine:
        completions = [run.tokenizer.decode(o, skip_special_tokens=True) for _, o in mine]
        prompts, columns = reward_inputs([r for r, _ in mine], run.cfg.data.prompt_column)
        total, _ = rewards.score([(run.reward_fns[0][0], 1.0)], prompts, completions, columns)
        correct = (total >= 1.0).sum().item()
    correct, n = all_sum(correct, len(mine))
    return {"eval/accuracy": correct / max(n, 1.0)}


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
