"""The run configuration: typed dataclasses, every field documented where it is declared (what is valid for
each: rlcore/config/valid.py; the checks across fields: rlcore/config/checks.py).

A recipe (recipes/NAME.py) is a function `config() -> Config`. Command-line `key=value` overrides are
applied to it by rlcore.config.cli, by the runtime type of each field.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal

from rlcore.config.valid import SANDBOX_LIMITS, check_fields


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
    logprob_diff_threshold: float = 1e-3  # fp32 engine: stop the run if max |vLLM - trainer| logprob exceeds this
    logprob_diff_mean_threshold: float = 0.1  # bf16 engine: stop if the mean |vLLM - trainer| per token exceeds this
    eval_max_new_tokens: int = 0  # greedy eval response cap, tokens; 0 = max_new_tokens
    # request: every request its own seed, so a sample is the same whatever runs beside it (another mesh, a resume,
    # any schedule); engine: the engine's generator, reseeded per lockstep call (vLLM's batched sampler; the same
    # run on the same mesh reproduces itself). benchmarks/sampler.py measures the difference.
    seeds: str = "request"
    # rollout.agent: a step where at least this fraction of the trajectories' agents failed (raised, refused, timed
    # out) stops the run, naming the first failure; 1.0 = only when all failed (nothing left to train on)
    max_failed_frac: float = 1.0
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
    # sequences running, admits the next trajectory the step a slot frees, and loads each new version
    # between two engine steps under the requests in flight. max_staleness bounds every token's age.
    stream: bool = False
    max_running: int = 0  # streaming: trajectories in flight at once on each engine; 0 = its share of one step
    # streaming with rollout.env or rollout.agent: trajectories admitted beyond max_running while some wait for their
    # environment's answer (or their agent's next call), so the engine keeps max_running sequences running; it never
    # runs more: a turn ready beyond them queues for the next free one (rlcore/modes/stream/turns.py). 0: a trajectory
    # waiting holds its slot.
    max_waiting: int = 0
    # streaming, lockstep schedule: an environment's answer joins the engine after this many engine steps
    # (the engine waits there for a late one), so the run does not depend on tool latency (rlcore/modes/stream/turns.py)
    join_steps: int = 2
    free_loads: bool = False  # streaming: load each version the moment it arrives (faster, not reproducible)
    # streaming, deterministic loads: version v loads this many engine steps after batch v is handed over (the
    # engine keeps decoding meanwhile; it waits only if the trainers are later); auto = measured over the first two
    # versions, then fixed for the run in predicted engine time (1.25 x the trainers' step; a step's time from its
    # running sequences and the prefill tokens it computes) and saved in its checkpoints. A number makes two runs
    # identical.
    load_lag_steps: int | Literal["auto"] = "auto"
    # streaming, load_lag_steps=auto: the lag it fixes over the trainers' measured step. Longer: where a batch's
    # engine work outlasts the trainers' step but not the lag, the engine runs out of admissible work before the
    # load and drains (stream/occupancy). Shorter than the trainers' step-to-step spread: the engine freezes
    # (throughput/frozen_share). 1.25 covers this CPU's 1.9-3.3 s steps; a GPU's steadier steps allow less.
    load_lag_margin: float = 1.25
    # streaming, load_lag_steps=auto: the same, once admission (a free slot whose next trajectory needs the version)
    # or the next hand-over (its batch complete) waits for the version: the engine would run emptier, or the
    # trainers idle, through the margin's room. Between 1 and load_lag_margin (which turns it off).
    load_lag_margin_blocked: float = 1.1
    # streaming, deterministic loads, one engine: the next batch goes to the trainers once it is complete and they are
    # done with their step, before the engine loads the version that step made; they start the next step with it and
    # send that version at the engine's load point, joined before or between two of their micro-batches (told how far
    # it is, they come at the poll where their wait there, less what they waited in their step before, would be no
    # longer than the engine's for one more micro-batch).
    # The load points and every number are the same either way; what changes is that the trainers no longer wait for
    # the lag.
    early_handover: bool = True


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
        check_fields(self, SANDBOX_LIMITS, "sandbox.")


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


RewardFn = Callable[..., list[float]]
