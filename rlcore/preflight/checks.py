"""Everything rlcore checks before the engines start, in four phases that each end in one collective.

    config   the config against the mesh, the output folder, the checkpoint to resume from
    prepare  the recipe's `prepare` function (rank 0 builds local assets, e.g. the embedded tiny model)
    models   each model's config.json and weights, the engine context, and the launch plan's memory fit
    inputs   tokenizer, reward functions, prompt files and the environment (one instance from row 0)

A phase runs on every rank; whatever bad input any rank finds (a file only one node cannot read, a
recipe that fails on one rank) is raised as the same InputError on every rank by `on_every_rank`, so
no rank is left waiting in a later collective. Each message is one line naming the key or file.
Nothing is written before these phases pass: no run directory, no config.json, no checkpoint.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from rlcore import rewards
from rlcore.config import Config, validate
from rlcore.config.errors import describe
from rlcore.config.roles import models_of
from rlcore.data import load_table, load_tokenizer, tokenize_prompts
from rlcore.distributed import watchdog
from rlcore.distributed.collectives import first_error
from rlcore.distributed.parallel import ParallelDims
from rlcore.engine.support import check_architecture
from rlcore.models import lora, build as models
from rlcore.outputs import checkpoint
from rlcore.preflight import plan
from rlcore.preflight.plan_render import checkpoint_line
from rlcore.rollout.envs import make_envs
from rlcore.rollout.tools import declared_tools


class InputError(ValueError):
    """Bad input that every rank raises together (rank 0 prints it)."""


def on_every_rank(check, *args):
    """check(*args) on every rank; if it raised ValueError on any rank, every rank raises the first one."""
    result, error, cause = None, None, None
    try:
        with watchdog.stage(f"preflight: {check.__name__}"):
            result = check(*args)
    except ValueError as e:
        error, cause = str(e), e
    first = first_error(error)
    if first:
        raise InputError(first) from cause
    return result


def check_output(cfg: Config) -> Path:
    """The run directory <output_dir>/<name> can be created (probed with a temporary folder, removed at
    once). That `name` stays inside output_dir is config.check_values' (a plain folder name)."""
    run_dir = Path(cfg.output_dir).expanduser() / cfg.name
    existing = run_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"output_dir {cfg.output_dir!r}: {str(existing)!r} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".rlcore-probe-"))
    except OSError as e:
        raise ValueError(f"output_dir {cfg.output_dir!r}: cannot create folders in {str(existing)!r} "
                         f"({e.strerror})") from None
    return run_dir


def check_config(cfg: Config, dims: ParallelDims):
    """-> (run_dir, checkpoint metadata, checkpoint to resume from or None, lines to print)."""
    dims.validate()
    validate(cfg, dims)
    run_dir = check_output(cfg)
    if cfg.logging.wandb and importlib.util.find_spec("wandb") is None:
        raise ValueError("logging.wandb=true needs the wandb package: pip install 'rlcore[wandb]' (or set "
                         "logging.wandb=false; TensorBoard logs are always written)")
    for name in cfg.sandbox.preload:  # each sandbox worker imports them as it starts: a missing one stops every call
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package missing, or an empty name
            found = False
        if not found:
            raise ValueError(f"sandbox.preload: there is no module named {name!r} to import into the sandbox workers")
    meta = checkpoint.describe(cfg, dims.world_size, dims.rollout_groups)
    resume_from, notes = checkpoint.resolve(cfg, run_dir, meta)  # a missing or foreign checkpoint fails here
    return run_dir, meta, resume_from, notes


def prepare(cfg: Config) -> None:
    """cfg.prepare ("module:function") once, on rank 0."""
    if not cfg.prepare or dist.get_rank() != 0:
        return
    module, _, fn = cfg.prepare.partition(":")
    try:
        function = getattr(importlib.import_module(module), fn)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"prepare '{cfg.prepare}' cannot be found: {describe(e)}") from e
    try:
        function(cfg)
    except ValueError:
        raise
    except Exception as e:  # the recipe's own code
        raise ValueError(f"prepare '{cfg.prepare}' raised {describe(e)}") from e


def check_models(cfg: Config, dims: ParallelDims, nproc_per_node: int):
    """-> (the actor's HF config, the engine context, (the launch plan or None, a line to print or ""))."""
    hf_config = models.check_model(cfg.model.path)
    lora.check(cfg, hf_config, torch.cuda.is_available())  # before check_architecture: a quantized base says why
    check_architecture(cfg.model.path, hf_config)
    weights = {"model.path": cfg.model.path}
    for i, spec in enumerate(cfg.rewards):
        if spec.model:
            models.check_reward_model(spec.model, f"rewards[{i}].model")
            weights[f"rewards[{i}].model"] = spec.model
    if cfg.algorithm.teacher:
        check_teacher(cfg.algorithm.teacher, cfg.model.path, hf_config)
        weights["algorithm.teacher"] = cfg.algorithm.teacher
    if models_of(cfg).critic and cfg.critic.path != "policy":
        if not models.is_value_model(cfg.critic.path):
            models.check_model(cfg.critic.path, "critic.path")  # a backbone to put a new value head on
        weights["critic.path"] = cfg.critic.path
    dims.validate(hf_config.num_attention_heads, getattr(hf_config, "num_key_value_heads", None))
    # The engine's context holds the prompt and everything after it: all turns, model and environment tokens.
    after = cfg.rollout.max_total_tokens or cfg.rollout.max_new_tokens
    max_model_len = cfg.rollout.max_model_len or cfg.data.max_prompt_tokens + after
    context = getattr(hf_config, "max_position_embeddings", max_model_len)
    if max_model_len > context or cfg.data.max_prompt_tokens + after > max_model_len:
        which = "max_total_tokens" if cfg.rollout.max_total_tokens else "max_new_tokens"
        raise ValueError(f"data.max_prompt_tokens + rollout.{which} = {cfg.data.max_prompt_tokens + after} does "
                         f"not fit the engine context (rollout.max_model_len={max_model_len}, model max {context})")
    fit = check_plan(cfg, dims.world_size, nproc_per_node)
    if cfg.rollout.stream:
        check_running(cfg, hf_config, max_model_len, fit[0].kv_bytes if fit[0] else None)
    for key, path in weights.items():  # last: reads the headers of every weights file
        models.check_weights(path, key)
    return hf_config, max_model_len, fit


def check_running(cfg: Config, hf_config, max_model_len: int, kv_bytes: int | None) -> None:
    """Streaming: rollout.max_running sequences of the engine context must fit its KV cache at once, or the
    engine would preempt them itself (rlcore/modes/stream/engine_side.py counts on running what it admitted)."""
    r = cfg.rollout
    running = r.max_running or r.prompts_per_step // (r.ranks // r.tensor_parallel) * r.group_size  # per engine
    budget = kv_bytes if torch.cuda.is_available() else r.cpu_kv_cache_gb * 2**30
    if not budget:  # CUDA without a plan: vLLM sizes the cache from gpu_memory_utilization at startup
        return
    dtype = cfg.model.mixed_precision if cfg.model.mixed_precision != "none" else cfg.model.dtype
    heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    heads = max(1, heads // r.tensor_parallel)  # each rank of a TP engine caches its heads (replicated below one)
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    per_token = 2 * hf_config.num_hidden_layers * heads * head_dim * getattr(torch, dtype).itemsize
    per_sequence = -(-max_model_len // 16) * 16 * per_token  # vLLM allocates 16-token blocks
    fits = int(budget // per_sequence)
    if running > fits:
        key = "rollout.max_running" if r.max_running else "rollout.max_running=0 (one step's batch)"
        raise ValueError(f"{key} = {running} sequences do not fit the engine's KV cache: {budget / 2**20:,.0f} MiB "
                         f"holds {fits} sequences of {max_model_len} tokens ({per_sequence / 2**10:,.0f} KiB each); "
                         f"valid: {r.group_size}-{fits}")


def check_teacher(teacher: str, student: str, student_config) -> None:
    """A distillation teacher scores the student's token ids: it must load and share the tokenizer (the same
    vocabulary size, token -> id map and special tokens); equal sizes alone are not enough."""
    teacher_config = models.check_model(teacher, "algorithm.teacher")
    mine, theirs = load_tokenizer(student), load_tokenizer(teacher, "algorithm.teacher")
    special = ("bos_token_id", "eos_token_id", "pad_token_id")
    for what, a, b in (("vocab_size", student_config.vocab_size, teacher_config.vocab_size),
                       ("tokenizer", mine.get_vocab(), theirs.get_vocab()),
                       ("special tokens", [getattr(mine, s) for s in special], [getattr(theirs, s) for s in special])):
        if a != b:
            shown = f" ({b} vs the student's {a})" if what != "tokenizer" else " (another token -> id map)"
            raise ValueError(f"algorithm.teacher '{teacher}' has another {what} than model.path{shown}: on-policy "
                             f"distillation compares both models' logprobs of the same token ids, so the teacher "
                             f"must share the student's tokenizer")


def check_plan(cfg: Config, world: int, nproc_per_node: int) -> tuple[plan.Plan | None, str]:
    """The launch plan: a run that does not fit stops here (plan.strict), before any engine starts.
    -> (the plan, or None when the model's shapes are outside its formulas; a line to print, or "")."""
    try:
        result = plan.build(cfg, nproc_per_node, max(1, world // nproc_per_node))
    except (AttributeError, KeyError, TypeError, ZeroDivisionError) as e:  # a config.json outside the formulas
        return None, f"rlcore: plan: skipped, the model's config.json is outside its formulas ({describe(e)})"
    if result.fits:
        late = not result.save_fits_grace and os.environ.get("SLURM_JOB_ID")  # a preemption's save may be cut off
        return result, f"rlcore: warning: {checkpoint_line(result).split(chr(10))[0]}" if late else ""
    line = f"the launch plan does not fit: {result.error()} (plan.strict=false runs it anyway)"
    if cfg.plan.strict:
        raise ValueError(line)
    return result, f"rlcore: warning: {line}"


def load_inputs(cfg: Config, vocab_size: int):
    """-> (tokenizer, reward functions with weights, the prompt table, the environment settings, eval rows)."""
    tokenizer = load_tokenizer(cfg.model.path)
    reward_fns = [(rewards.resolve(spec.fn, f"rewards[{i}].fn"), spec.weight)
                  for i, spec in enumerate(cfg.rewards) if not spec.model]
    # An environment with native tool calls (rlcore.rollout.tools) shows its tools in every prompt.
    toolbox = declared_tools(rewards.resolve(cfg.rollout.env, "rollout.env")) if cfg.rollout.env else None
    schemas = toolbox.schemas if toolbox else None
    table = tokenize_prompts(load_table(cfg.data.path, cfg.data.split, cfg.data.name, "data.path"),
                             cfg.data, tokenizer, "data.path", schemas)
    envs = make_envs(cfg, tokenizer, table[0], vocab_size)  # one instance from the first row, checked
    eval_rows = []
    if cfg.data.eval_path:
        held_out = tokenize_prompts(load_table(cfg.data.eval_path, cfg.data.eval_split, cfg.data.name,
                                               "data.eval_path"), cfg.data, tokenizer, "data.eval_path", schemas)
        eval_rows = list(held_out.select(range(min(len(held_out), cfg.data.eval_size or len(held_out)))))
    return tokenizer, reward_fns, table, envs, eval_rows
