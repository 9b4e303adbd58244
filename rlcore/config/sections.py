"""The run configuration: typed dataclasses, every field documented where it is declared.

A recipe (recipes/NAME.py) is a function `config() -> Config`. Command-line `key=value` overrides are
applied to it by rlcore.config.cli, by the runtime type of each field.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from rlcore.algorithms.base import check as check_algorithm
from rlcore.config.roles import models_of


@dataclass
class ModelConfig:
    path: str = ""  # HF hub id or local folder of a transformers causal LM (actor init and vLLM engine)
    dtype: str = "float32"  # master weights and optimizer state: float32 | bfloat16
    mixed_precision: str = "none"  # FSDP2 compute dtype: none | bfloat16 (GPU); reductions stay fp32
    activation_checkpointing: bool = False  # recompute each decoder layer in backward (saves memory, GPU)
    attn_implementation: str = "sdpa"  # transformers attention kernel for the trainer: sdpa | eager
    offload_frozen: bool = False  # CUDA: keep the frozen reference / reward models' shards in CPU memory


@dataclass
class DataConfig:
    path: str = ""  # hub dataset id, or a local .json / .jsonl / .parquet file of prompts
    split: str = "train"  # split to read (hub datasets)
    name: str = ""  # hub dataset config name, e.g. "main" for gsm8k; "" for none
    prompt_column: str = "prompt"  # column holding the prompt text
    chat_template: bool = False  # wrap each prompt as a user turn with the tokenizer's chat template
    system_prompt: str = ""  # optional system turn when chat_template is on
    eval_path: str = ""  # held-out prompts for eval/accuracy (same forms as path); "" disables eval
    eval_split: str = "test"  # split of eval_path to read (hub datasets)
    eval_size: int = 0  # use the first N held-out prompts; 0 = all
    max_prompt_tokens: int = 256  # longer prompts are dropped (counted in the log) before training
    num_workers: int = 0  # dataloader worker processes


@dataclass
class RolloutConfig:
    tensor_parallel: int = 1  # k: ranks per vLLM engine; engines are contiguous blocks of k ranks
    group_size: int = 8  # responses sampled per prompt
    prompts_per_step: int = 16  # prompts per training step, over all ranks (divisible by world size)
    max_new_tokens: int = 32  # tokens the model may sample in one turn (the whole response when single-turn)
    temperature: float = 1.0  # sampling temperature (logprobs are taken after it)
    max_model_len: int = 0  # engine context, tokens; 0 = max_prompt_tokens + max_new_tokens
    gpu_memory_utilization: float = 0.35  # fraction of GPU memory the engine may take (CUDA only)
    cpu_kv_cache_gb: float = 1.0  # KV-cache size per engine on CPU, GiB
    sleep_while_training: bool = True  # CUDA: free engine weights + KV cache during training
    logprob_diff_threshold: float = 1e-3  # stop the run if max |vLLM - trainer| logprob exceeds this
    eval_max_new_tokens: int = 0  # greedy eval response cap, tokens; 0 = max_new_tokens
    # Multi-turn (rlcore.rollout.env, rlcore.rollout.turns); with env="" a rollout is one model turn.
    env: Any = ""  # environment factory(row) -> env: a callable, "module:name" or "path/file.py:name"; "" = none
    max_turns: int = 0  # model turns per trajectory at most; 0 = the environment's own max_turns
    max_total_tokens: int = 0  # tokens after the prompt, model + environment, all turns; 0 = max_new_tokens
    env_timeout_s: float = 60.0  # an environment call slower than this ends its trajectory (reward 0), seconds
    env_workers: int = 8  # threads per rank stepping environments concurrently
    env_weight: float = 1.0  # weight of the summed environment step rewards (reward part "env")
    truncated_reward: float | None = None  # fixed reward of trajectories ended by a limit; None = scored as usual
    # Bring your own agent (rlcore.rollout.agents): `async def agent(client, row) -> reward` run once per
    # trajectory with its own openai client on an OpenAI-compatible endpoint (rlcore.rollout.endpoint). Its
    # calls are its turns: at most max_turns calls; env_timeout_s bounds the whole agent; env_workers agents
    # run at once per rank. "" = none.
    agent: Any = ""  # a callable, "module:name" or "path/file.py:name"
    agent_tool_format: str = "hermes"  # how the endpoint parses the model's tool calls: hermes | llama3 | mistral
    # What one model turn may ask of its tools (rlcore.rollout.tools; environments read both through
    # rlcore.rollout.env.limits()): calls past the cap are answered "not run" (tool/too_many_calls); no call
    # starts after the turn's deadline and the python tool's program is stopped at it (tool/deadline). The
    # loop's own limits (env_timeout_s, the continuous budgets) bring the deadline earlier when they end sooner.
    max_tool_calls: int = 8  # tool calls run per model turn at most; the rest are answered "not run"
    turn_deadline_s: float = 30.0  # seconds a turn's tool calls may take: none starts later, a program stops then
    # How turns meet the engine (rlcore.rollout.continuous): "lockstep" = one engine call per turn over every
    # active trajectory (bit-reproducible); "continuous" = each trajectory's next turn joins the running engine
    # as soon as its own environment answered (faster with slow tools; batches depend on tool timing).
    schedule: str = "lockstep"  # lockstep | continuous
    trajectory_timeout_s: float = 0.0  # continuous: a trajectory running longer ends truncated, seconds; 0 = none
    step_deadline_s: float = 0.0  # continuous: a rollout (one draw) ends its unfinished trajectories, seconds; 0 = none
    # Colocated or split (rlcore/modes/split.py): 0 = every rank generates and trains (colocated); R > 0 = ranks [0, R)
    # only generate (engines of tensor_parallel ranks) and the other ranks only train, overlapping.
    ranks: int = 0
    # Split mesh: the engines may sample a batch with weights at most this many optimizer steps older than the
    # weights that train on it (k); 0 = on-policy (the engines wait for each update). k >= 1 needs an
    # off-policy correction (an algorithm whose corrects_off_policy is true, e.g. algorithm.tis_cap > 0).
    max_staleness: int = 0
    # Streaming (rlcore/modes/stream/), with a split mesh: the engines never drain; each keeps up to max_running
    # sequences running, admits the next prompt group as soon as there is room, and loads each new version
    # between two engine steps under the requests in flight. max_staleness bounds every token's age.
    stream: bool = False
    max_running: int = 0  # streaming: trajectories in flight at once on each engine; 0 = its share of one step
    # streaming, lockstep schedule: an environment's answer joins the engine after this many engine steps
    # (the engine waits there for a late one), so the run does not depend on tool latency (rlcore/modes/stream/turns.py)
    join_steps: int = 2
    free_loads: bool = False  # streaming: load each version the moment it arrives (faster, not reproducible)


@dataclass
class OptimConfig:
    lr: float = 1e-6  # peak learning rate
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW betas
    eps: float = 1e-8  # AdamW epsilon
    warmup_steps: int = 0  # optimizer steps of linear warmup from 0 to lr
    schedule: str = "constant"  # after warmup: constant | linear | cosine (decay to min_lr_ratio * lr)
    min_lr_ratio: float = 0.0  # floor of the decay, as a fraction of lr
    max_grad_norm: float = 1.0  # clip the global gradient norm to this; 0 disables clipping


@dataclass
class TrainConfig:
    steps: int = 100  # RL steps (rollout + update + sync)
    epochs_per_step: int = 1  # passes over each rollout batch (PPO epochs)
    mini_batches: int = 1  # optimizer steps per pass; each sees 1/mini_batches of the batch
    micro_batch_size: int = 8  # sequences per forward/backward on one rank (when not packing, below)
    # Pack whole sequences, padding stripped, into micro-batches of at most this many tokens per rank
    # (rlcore.train.packing; a longer sequence runs alone); 0 = micro_batch_size padded rows per micro-batch
    max_tokens_per_micro_batch: int = 0
    # Logits are computed, log-softmaxed and (in backward) recomputed this many tokens at a time, so at most
    # one chunk's [tokens, vocab] fp32 tensors exist at once (rlcore.models.build.token_logprobs); 0 = all at once
    logprob_chunk_tokens: int = 1024
    eval_every: int = 10  # steps between held-out evals (also before the first and after the last step)
    log_every: int = 1  # steps between progress lines
    save_every: int = 0  # steps between checkpoints (runs/<name>/checkpoints/step_<N>/); 0 = only at the end
    keep_checkpoints: int = 2  # complete checkpoints kept on disk (the newest); older ones are deleted
    export_every: int = 0  # steps between HF exports (runs/<name>/hf/step_<N>/); 0 = only at the end
    max_skipped_steps: int = 3  # stop the run after this many steps in a row with a non-finite loss/gradient
    # Seconds without any rank finishing a stage (generate, reward, logprobs, update, sync, exchange, checkpoint,
    # eval, ...): then every rank prints where it is and which rank is behind, that rank's Python stack goes to
    # its log, and every rank exits 3 (rlcore/distributed/watchdog.py); process groups time out at 3x this (at least 5 min).
    # 30 min outlasts the longest stage of a healthy 8-GPU step (a batch's generation, minutes) many times over.
    watchdog_s: float = 1800.0


@dataclass
class LoraConfig:
    """LoRA adapters on the policy (rlcore/models/lora.py); each default's source is beside its field.
    `lora=true` on the command line is short for `lora.enabled=true`."""
    SHORTHAND: ClassVar[str] = "enabled"
    enabled: bool = False  # train low-rank adapters on a frozen base instead of every weight
    rank: int = 16  # r, adapter rank, 1..512 (vLLM serves up to 512); 16 as torchtune / prime-rl; RL works at 1
    alpha: float = 32.0  # the update is scaled by alpha / rank; 32 keeps the best LR near rank-independent (TML)
    # Decoder-layer linears to adapt, by their last name (HF Llama / Qwen names); every linear, MLP included
    # (TML "LoRA Without Regret"). Never embeddings or the LM head.
    targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                       "up_proj", "down_proj"])
    lr_scale: float = 10.0  # adapters train at lr_scale x optim.lr; ~10x the full fine-tuning LR (TML, Tinker)
    # How the engine gets the update: "adapter" writes only A and B as a PEFT folder that vLLM loads as a
    # LoRA (bytes ~ r/hidden of the model's); "merged" streams W + (alpha/r) B A, full weights, into an
    # engine without LoRA (needed for MoE models on CPU; serves at base speed).
    sync: str = "adapter"
    export_merged: bool = False  # exports also write the merged full model as an HF folder (hf/step_<N>_merged/)


@dataclass
class CriticConfig:
    path: str = ""  # "" = no critic; "policy" = initialise from model.path; or a transformers model folder/hub id
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))  # the critic's own AdamW + schedule


@dataclass
class RewardSpec:
    fn: Any = ""  # a callable, or "module:function" / "path/to/file.py:function" / a built-in name
    model: str = ""  # or: a transformers sequence-classification reward model (folder or hub id), frozen
    weight: float = 1.0  # weight of this reward in the weighted sum


@dataclass
class SandboxConfig:
    """Limits of the sandbox that runs model-written code (rlcore/sandbox/pool.py): one pool per rank, started on first
    use by a tool or reward function (rlcore.sandbox.shared(); e.g. rlcore.rollout.tools.python)."""
    timeout_s: float = 10.0  # wall clock per call; then the child's process group is killed, seconds
    cpu_s: float = 10.0  # RLIMIT_CPU of each process the code starts, seconds (rounded up)
    memory_mb: int = 512  # RLIMIT_AS of each process: address space, not resident memory, MiB
    file_mb: int = 16  # RLIMIT_FSIZE: the largest file the code may write, MiB
    tmp_mb: int = 64  # size of each call's private tmpfs (its cwd, /tmp, /var/tmp and /dev/shm: RAM), MiB
    max_processes: int = 32  # RLIMIT_NPROC of the call's uid: the code's processes at once (binds after the user drop)
    max_output_bytes: int = 16384  # stdout and stderr kept, bytes each; more ends the call, "output_truncated"
    workers: int = 2  # warm worker processes per rank: calls that run at once
    # modules each worker imports before it drops its user: free in every call, and the only ones there are
    # where the sandbox user cannot read the Python installation (e.g. a Python under /root, mode 0o700)
    preload: list[str] = field(default_factory=lambda: [
        "math", "cmath", "json", "re", "collections", "itertools", "functools", "operator", "random", "string",
        "fractions", "decimal", "statistics", "heapq", "bisect", "datetime", "copy", "typing", "textwrap"])

    def __post_init__(self):  # Sandbox(SandboxConfig(...)) outside a run; a run's are checked by check_values
        _check(self, _SANDBOX, "sandbox.")


@dataclass
class PlanConfig:
    """The launch plan (rlcore/preflight/plan.py). `plan=true` on the command line is short for `plan.show=true`."""
    SHORTHAND: ClassVar[str] = "show"
    show: bool = False  # print the plan (mesh, models, per-GPU memory) on rank 0 and exit, starting nothing
    strict: bool = True  # at launch, stop a run whose plan does not fit the memory; false = warn and go on


@dataclass
class LoggingConfig:
    """TensorBoard (runs/<name>/tb) and metrics.jsonl always; Weights & Biases on request."""
    wandb: bool = False  # mirror every logged key and the config to wandb (pip install 'rlcore[wandb]')
    wandb_project: str = "rlcore"  # wandb project; the run is named after `name` (WANDB_MODE=offline works)
    # show other libraries' warnings, deprecation notices and progress bars (vLLM, torch, transformers,
    # datasets), for debugging; false: their errors only. RLCORE_LIBRARY_LOGS=1 does the same (docs/running.md)
    library_logs: bool = False


@dataclass
class Config:
    name: str = "run"  # run name: outputs go to <output_dir>/<name>/
    output_dir: str = "runs"  # parent folder of run directories
    seed: int = 0  # run seed: model init, data order and every rollout seed derive from it
    resume: str = ""  # "" fresh; "auto" newest complete checkpoint of this run (fresh if none); or a step_<N> dir
    prepare: str = ""  # optional "module:function" run once on rank 0 before loading (builds local assets)
    plan: PlanConfig = field(default_factory=PlanConfig)  # launch plan: plan=true prints it; plan.strict
    logging: LoggingConfig = field(default_factory=LoggingConfig)  # metrics.jsonl + TensorBoard always; wandb on request
    model: ModelConfig = field(default_factory=ModelConfig)  # the actor (policy): its weights, dtype and kernels
    data: DataConfig = field(default_factory=DataConfig)  # training and held-out prompts
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # the vLLM engines, sampling, environments
    optim: OptimConfig = field(default_factory=OptimConfig)  # the policy's AdamW and LR schedule
    train: TrainConfig = field(default_factory=TrainConfig)  # steps, batching, evals, checkpoints, exports
    lora: LoraConfig = field(default_factory=LoraConfig)  # LoRA adapters on the policy; lora.enabled=true
    critic: CriticConfig = field(default_factory=CriticConfig)  # value model (PPO); unused by GRPO / REINFORCE++
    rewards: list[RewardSpec] = field(default_factory=list)  # summed with their weights
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)  # limits of model-written code (rlcore.sandbox)
    # The recipe's algorithm object, e.g. rlcore.algorithms.grpo.GRPO(); its contract (the flags and hooks the
    # trainer uses) is rlcore.algorithms.base.Algorithm. Typed Any: overrides are typed by the object's fields.
    algorithm: Any = None


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
    if r.max_running and r.max_running < r.group_size:
        raise ValueError(f"rollout.max_running={r.max_running} is below one prompt group (rollout.group_size="
                         f"{r.group_size}): the engine could never admit a group; valid: >= {r.group_size}")


def _at_least(low):
    return lambda v: v >= low, f">= {low}"


def _above(low):
    return lambda v: v > low, f"> {low}"


def _between(low, high, closed_high=True):
    ok = (lambda v: low <= v <= high) if closed_high else (lambda v: low <= v < high)
    return ok, f"in [{low}, {high}{']' if closed_high else ')'}"


def _whole(low):
    return lambda v: isinstance(v, int) and v >= low, f"a whole number >= {low}"


def _one_of(*names):
    return lambda v: v in names, "one of " + ", ".join(names)


_SECONDS = (lambda v: 0 < v < math.inf, "a finite number of seconds > 0")  # inf would disarm the deadlines
_SANDBOX = {"timeout_s": _SECONDS, "cpu_s": _SECONDS, "memory_mb": _whole(1), "file_mb": _whole(1),
            "tmp_mb": _whole(1), "max_processes": _whole(1), "max_output_bytes": _whole(1), "workers": _whole(1)}
# Every numeric and named-choice field with what is valid. NaN fails every test (comparisons with NaN
# are false), so `optim.lr=nan` is caught like `optim.lr=-1`. The algorithm checks its own fields.
_OPTIM = {"lr": _at_least(0), "weight_decay": _at_least(0), "eps": _above(0), "warmup_steps": _at_least(0),
          "schedule": _one_of("constant", "linear", "cosine"), "min_lr_ratio": _between(0, 1),
          "max_grad_norm": _at_least(0)}
VALID = {
    "seed": _at_least(0),
    "model.dtype": _one_of("float32", "bfloat16"),
    "model.mixed_precision": _one_of("none", "bfloat16", "float32"),
    "model.attn_implementation": _one_of("sdpa", "eager", "flash_attention_2"),
    "data.max_prompt_tokens": _at_least(1), "data.eval_size": _at_least(0), "data.num_workers": _at_least(0),
    "rollout.tensor_parallel": _at_least(1), "rollout.group_size": _at_least(1),
    "rollout.prompts_per_step": _at_least(1), "rollout.max_new_tokens": _at_least(1),
    "rollout.temperature": (lambda v: 0 < v <= 2, "in (0, 2] (vLLM refuses more)"), "rollout.max_model_len": _at_least(0),
    "rollout.gpu_memory_utilization": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "rollout.cpu_kv_cache_gb": _above(0), "rollout.logprob_diff_threshold": _at_least(0),
    "rollout.eval_max_new_tokens": _at_least(0), "rollout.max_turns": _at_least(0),
    "rollout.max_total_tokens": _at_least(0), "rollout.env_timeout_s": _above(0),
    "rollout.env_workers": _at_least(1), "rollout.env_weight": (math.isfinite, "a finite number"),
    "rollout.max_tool_calls": _whole(1), "rollout.turn_deadline_s": _SECONDS,
    "rollout.truncated_reward": (lambda v: v is None or math.isfinite(v), "a finite number or none"),
    "rollout.schedule": _one_of("lockstep", "continuous"),
    "rollout.agent_tool_format": _one_of("hermes", "llama3", "mistral"), "rollout.trajectory_timeout_s": _at_least(0),
    "rollout.step_deadline_s": _at_least(0), "rollout.ranks": _at_least(0), "rollout.max_staleness": _at_least(0),
    "rollout.max_running": _at_least(0), "rollout.join_steps": _at_least(0),
    **{f"{section}.{k}": test for section in ("optim", "critic.optim") for k, test in _OPTIM.items()},
    "train.steps": _at_least(1), "train.epochs_per_step": _at_least(1), "train.mini_batches": _at_least(1),
    "train.micro_batch_size": _at_least(1), "train.eval_every": _at_least(1), "train.log_every": _at_least(1),
    "train.save_every": _at_least(0), "train.keep_checkpoints": _at_least(1), "train.export_every": _at_least(0),
    "train.max_skipped_steps": _at_least(1), "train.logprob_chunk_tokens": _at_least(0),
    "train.max_tokens_per_micro_batch": _at_least(0), "train.watchdog_s": _SECONDS,
    # vLLM 0.32 takes max_lora_rank in {1, 8, ..., 320, 512} and serves any adapter rank up to it.
    "lora.rank": (lambda v: isinstance(v, int) and 1 <= v <= 512, "an integer in [1, 512] (vLLM's largest "
                  "max_lora_rank is 512)"),
    "lora.alpha": _above(0), "lora.lr_scale": _above(0), "lora.sync": _one_of("adapter", "merged"),
    **{f"sandbox.{k}": test for k, test in _SANDBOX.items()},
}


def check_values(cfg: Config) -> None:
    """Each field of VALID in range (a wrong type, e.g. a string where a number belongs, fails too), the
    AdamW betas and reward weights, and a run name that stays inside output_dir."""
    _check(cfg, VALID)
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


def _check(obj, table: dict, prefix: str = "") -> None:
    """Raise a ValueError naming the first field of `table` (dotted keys under `obj`) that is not valid."""
    for key, (ok, valid) in table.items():
        value = obj
        for part in key.split("."):
            value = getattr(value, part)
        try:
            good = bool(ok(value))
        except TypeError:
            good = False
        if not good or isinstance(value, bool) and not valid.startswith("one of"):
            raise ValueError(f"{prefix}{key} must be {valid} (got {value!r})")


RewardFn = Callable[..., list[float]]
