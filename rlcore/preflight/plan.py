"""The launch plan: the mesh, the four models and the per-GPU memory of a run, before anything loads.

    python launch/plan.py recipe=grpo --nproc-per-node 8 --gpu-memory-gb 80
    torchrun --nproc-per-node 8 launch/train.py recipe=grpo plan=true

Arithmetic on each model's config.json (a local folder or the hub cache) and on its model class built on the
meta device from it: no process group, no GPU, no weights. `build(cfg, nproc_per_node, nnodes, gpu_memory_gb)
-> Plan` is the one call; `plan.fits`, `plan.levers` and `plan.error()` are what a launch-time check needs.
Formulas, not a simulator.

Notation: P parameters, W ranks (the world), S FSDP ranks (W; W - R in a split mesh), k rollout TP degree,
L layers, V vocab, root and layer the parameters of the root FSDP unit and of the largest decoder layer, T
tokens of a micro-batch = micro_batch_size * seq, seq = max_prompt_tokens + (max_total_tokens or max_new_tokens)
(rows are padded to that); packed (train.max_tokens_per_micro_batch > 0), T = max(max_tokens_per_micro_batch, seq). b_m bytes of model.dtype (master weights), b_c of the compute dtype (mixed_precision, else
b_m); the engine runs in b_c. GB = 2**30 bytes.

P, root and layer per role (counted on the model built on the meta device), LoRA adapter parameters A, KV and
activation bytes per token: rlcore/preflight/shapes.py.
Train bar, bytes per GPU:
  trained model  params b_m*P/S + grads b_m*P/S + AdamW m and v 2*b_m*P/S (torch keeps them in the param
                 dtype: 16*P/S for float32)
  frozen model   b_m*P/S; 0 with model.offload_frozen on CUDA
  LoRA actor     base b_m*P/S (frozen) + adapters 4*A/S + their grads 4*A/S + AdamW 8*A/S (fp32); no
                 reference model (the reference is the actor with adapters off); gathered units hold no
                 root gradient (embedding and head are frozen) and one layer's adapter gradient 4*A/L
  gathered       the largest trained model: b_c*(root + 2*layer) + b_c*root + 4*layer. The root unit
                 (embedding, final norm, head) stays gathered through forward and backward with its unsharded
                 gradient; two decoder layers are in flight (prefetch); one layer's
                 unsharded gradient is reduced in fp32
  activations    T * the activation bytes per token (rlcore/preflight/shapes.py), with or without checkpointing
  logits         C * V * (b_c + 16), C = min(T, train.logprob_chunk_tokens) (T when 0): a chunk's logits in
                 b_c and four fp32 [C, V] tensors that
                 models.token_logprobs materialises (cast / temperature, log_softmax, exp for the entropy,
                 the gradient)
  engine         0 while it sleeps (CUDA with sleep_while_training), else its whole budget (below)
Generation bar, bytes per GPU:
  trainer        trained params + AdamW state (gradients are freed) + frozen shards kept on the GPU
  runtime        CPU only: CPU_RUNTIME_GB per rank (the process itself, measured on the demo)
  engine         CUDA: gpu_memory_utilization * memory (vLLM takes that fraction), holding weights
                 b_c*P/k (+ with lora.sync=adapter one LoRA slot b_c*A'/k, A' = A at vLLM's max_lora_rank),
                 an overhead of ENGINE_OVERHEAD_GB (activation peak, CUDA graphs, NCCL) and
                 the KV cache in the rest; CPU: weights + cpu_kv_cache_gb
  KV per token   in b_c (rlcore/preflight/shapes.py); sequences = KV tokens / (max_prompt_tokens + response tokens)
Split mesh (rollout.ranks = R > 0, rlcore/modes/split.py): a bar per kind of GPU instead of one per phase; the
models shard over the S = W - R trainer ranks.
  rollout bar    ranks [0, R): runtime (CPU) + the engine (it never sleeps) + the largest unit of the weight
                 transfer received, b_c*max(root, layer) (a flat buffer outside the engine's budget); no models
  trainer bar    ranks [R, W): the train bar over S ranks + the trainer's dormant engine: on CUDA 0 (dummy
                 weights, put to sleep at level 2 once built, before the models load: weights and KV cache
                 freed, CUDA graphs and runtime buffers moved to host memory; its CUDA context and NCCL
                 buffers are within MARGIN), on CPU its weights and KV cache. Between steps rank R sends the
                 weights with grads, gathered units, activations and logits freed; b_c*(2*root + layer) is in
                 flight (a unit gathered and its cast copy or flat buffer, the next unit prefetched): the bar
                 counts what of it exceeds the step's transient parts (0 unless the step's are smaller)
A bar fits when it is at most (1 - MARGIN) * memory, and the KV cache holds one full sequence (vLLM
refuses to start otherwise). On CPU the ranks of a node share the host: nproc_per_node * bar is compared
with MemTotal (split: a node's rollout and trainer ranks together, on the node where the bar's kind holds
the most). A lever is applied to a copy of the config and the plan rebuilt; levers rank by how much
of the bar's shortfall they remove.

Why one file of ~350 lines: every memory bar's formula sits side by side, so they can be compared and checked
together; the text is plan_render.py's.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

from rlcore.config import Config, validate
from rlcore.config.roles import models_of
from rlcore.distributed.parallel import ParallelDims
from rlcore.preflight.shapes import Shapes, model_shapes

GB = 2**30
MARGIN = 0.10  # CUDA context, allocator fragmentation and NCCL buffers are not in the bars
CPU_RUNTIME_GB = 1.0  # resident memory of a CPU rank before any model: imports 0.66 GB + vLLM's engine state
ENGINE_OVERHEAD_GB = 2.0  # vLLM's profiled activation peak + CUDA graphs + context inside its budget (calibrate)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
# Checkpoints under Slurm: after the signal torchrun gives the ranks RLCORE_SHUTDOWN_TIMEOUT (launch/slurm_node.sh)
# for the step in flight and a whole save. WRITE_GB_S is an assumption, not a measurement: what one node's client
# of a parallel file system writes (Lustre / GPFS clients: 1-5 GB/s; a local NVMe ~3).
SHUTDOWN_GRACE_S = 170
WRITE_GB_S = 2.0


@dataclass
class Model:
    role: str  # actor | critic | reference | reward
    path: str
    shapes: Shapes
    trained: bool
    offloaded: bool = False
    adapters: int = 0  # LoRA: the trained adapter parameters (the base is frozen)

    @property
    def params(self) -> int:
        return self.shapes.params


@dataclass
class Bar:
    name: str  # colocated: "train" | "generation" (two phases of every GPU); split: "rollout" | "trainer"
    parts: list[tuple[str, float]]  # (component, bytes per GPU or per rank)
    limit: float  # usable bytes: (1 - MARGIN) * memory
    ranks_sharing: int = 1  # CPU: the ranks of this bar on a node share the host memory
    kv_short: float = 0.0  # bytes the KV cache lacks for one full sequence
    neighbours: tuple[int, float] = (0, 0.0)  # CPU, split: the other kind's ranks on the same host, their bytes

    @property
    def total(self) -> float:
        return sum(b for _, b in self.parts)

    @property
    def used(self) -> float:  # bytes held per GPU, or per host on CPU
        return self.total * self.ranks_sharing + self.neighbours[1]

    @property
    def short(self) -> float:  # bytes to save before the bar fits; <= 0 when it fits
        return max(self.used - self.limit, self.kv_short)

    @property
    def fits(self) -> bool:
        return self.short <= 0


@dataclass
class Plan:
    cfg: Config
    nproc_per_node: int
    nnodes: int
    device: str  # cuda | cpu
    memory: float  # bytes per GPU (cuda) or of the host (cpu)
    models: list[Model]
    train: Bar  # split: the trainer ranks' bar
    generation: Bar  # split: the rollout ranks' bar
    kv_per_token: int
    kv_tokens: int
    seq_len: int
    micro_tokens: int
    sync_bytes: int = 0  # bytes handed to each engine rank per weight sync
    checkpoint_bytes: int = 0  # one checkpoint, all ranks together
    levers: dict[str, list[tuple[str, float, bool]]] = field(default_factory=dict)  # bar -> (lever, saved, fits)

    @property
    def kv_bytes(self) -> int:  # the KV cache each engine rank gets
        return self.kv_tokens * self.kv_per_token

    grace_s = SHUTDOWN_GRACE_S  # (class constants, so plan_render.py reads them from the plan)
    write_gb_s = WRITE_GB_S

    @property
    def save_seconds(self) -> float:
        """A checkpoint's expected write time: its size over WRITE_GB_S per node (every node writes its shards)."""
        return self.checkpoint_bytes / (WRITE_GB_S * 1e9 * self.nnodes)

    @property
    def save_fits_grace(self) -> bool:
        return self.save_seconds <= SHUTDOWN_GRACE_S

    @property
    def world(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def split(self) -> bool:
        return self.cfg.rollout.ranks > 0

    @property
    def bars(self) -> list[Bar]:  # in rank order
        return [self.generation, self.train] if self.split else [self.train, self.generation]

    def bar(self, name: str) -> Bar:
        return next(b for b in self.bars if b.name == name)

    @property
    def fits(self) -> bool:
        return all(bar.fits for bar in self.bars)

    def error(self) -> str:
        """One line per failing bar: the bar, by how much, and the levers (empty when the plan fits)."""
        out = []
        for bar in self.bars:
            if bar.fits:
                continue
            over = bar.used - bar.limit
            what = [f"needs {bar.used / GB:.1f} GB, {over / GB:.1f} GB over the "
                    f"{bar.limit / GB:.1f} GB usable"] if over > 0 else []
            what += [f"leaves the KV cache {bar.kv_short / GB:.2f} GB short of one {self.seq_len}-token "
                     f"sequence"] if bar.kv_short > 0 else []
            what = " and ".join(what)
            levers = ", ".join(f"{name} (-{saved / GB:.1f} GB{', fits' if ok else ''})"
                               for name, saved, ok in self.levers.get(bar.name, []))
            out.append(f"the {bar.name.upper()} bar {what} per {'GPU' if self.device == 'cuda' else 'host'}; "
                       f"levers: {levers or 'none found'}")
        return "; ".join(out)

    def render(self) -> str:
        """What plan=true and launch/plan.py print (rlcore/preflight/plan_render.py)."""
        from rlcore.preflight.plan_render import render
        return render(self)


def host_memory() -> float:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))


def build(cfg: Config, nproc_per_node: int, nnodes: int = 1, gpu_memory_gb: float | None = None) -> Plan:
    """The plan of `cfg` on nnodes x nproc_per_node ranks. GPU memory: gpu_memory_gb, else this machine's
    GPU, else the plan is for CPU ranks against the host's memory. Raises ValueError on bad input."""
    device, memory = "cuda", (gpu_memory_gb or 0) * GB
    if gpu_memory_gb is None:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
        memory = torch.cuda.get_device_properties(0).total_memory if device == "cuda" else host_memory()
    plan = _build(cfg, nproc_per_node, nnodes, device, memory)
    plan.levers = {bar.name: _levers(plan, bar.name) for bar in plan.bars if not bar.fits}
    return plan


def _build(cfg: Config, nproc: int, nnodes: int, device: str, memory: float) -> Plan:
    m, r, t = cfg.model, cfg.rollout, cfg.train
    for key, value, allowed in (("model.dtype", m.dtype, DTYPE_BYTES), ("model.mixed_precision", m.mixed_precision,
                                                                         ["none", *DTYPE_BYTES])):
        if value not in allowed:
            raise ValueError(f"{key} must be one of {', '.join(allowed)} (got '{value}')")
    world, cuda = nproc * nnodes, device == "cuda"
    dims = ParallelDims(world, r.tensor_parallel, r.ranks)
    dims.validate()
    validate(cfg, dims)
    actor = model_shapes(m.path)
    dims.validate(actor.heads, actor.kv_heads)
    offload = m.offload_frozen and cuda
    lo = cfg.lora
    adapters = actor.adapter_params(lo.rank, lo.targets) if lo.enabled else 0
    models = [Model("actor", m.path, actor, trained=True, adapters=adapters)]
    held = models_of(cfg)
    if held.critic:
        path = m.path if cfg.critic.path == "policy" else cfg.critic.path
        models.append(Model("critic", path, model_shapes(path, "critic.path", "critic"), trained=True))
    if held.reference == "copy":  # LoRA: the actor with adapters off is the reference
        models.append(Model("reference", m.path, actor, trained=False, offloaded=offload))
    models += [Model("reward", s.model, model_shapes(s.model, f"rewards[{i}].model", "reward"), trained=False,
                     offloaded=offload) for i, s in enumerate(cfg.rewards) if s.model]

    b_m = DTYPE_BYTES[m.dtype]
    b_c = DTYPE_BYTES.get(m.mixed_precision, b_m)
    seq = cfg.data.max_prompt_tokens + (r.max_total_tokens or r.max_new_tokens)
    tokens = max(t.max_tokens_per_micro_batch, seq) if t.max_tokens_per_micro_batch else t.micro_batch_size * seq
    # A CPU rank's own process: interpreter, torch, transformers and vLLM code and their state.
    runtime = [] if cuda else [("process runtime (python, torch, vLLM; measured)", CPU_RUNTIME_GB * GB)]
    resident, grads, shards = [], [], dims.trainers  # grads are freed after each optimizer step
    for x in models:
        if x.adapters:
            resident += [(f"{x.role} base params, frozen ({m.dtype}, /{shards})", b_m * x.params / shards),
                         (f"{x.role} LoRA adapters (float32, /{shards})", 4 * x.adapters / shards),
                         (f"{x.role} AdamW m + v of the adapters (float32, /{shards})", 8 * x.adapters / shards)]
            grads.append((f"{x.role} adapter grads (float32, /{shards})", 4 * x.adapters / shards))
        elif x.trained:
            resident += [(f"{x.role} params ({m.dtype}, /{shards})", b_m * x.params / shards),
                         (f"{x.role} AdamW m + v ({m.dtype}, /{shards})", 2 * b_m * x.params / shards)]
            grads.append((f"{x.role} grads ({m.dtype}, /{shards})", b_m * x.params / shards))
        elif not x.offloaded:
            resident.append((f"{x.role} params, frozen ({m.dtype}, /{shards})", b_m * x.params / shards))
    big = max((x for x in models if x.trained), key=lambda x: x.params).shapes
    gathered = b_c * (2 * big.root + 2 * big.layer) + 4 * big.layer
    if adapters:  # LoRA (no critic): no root gradient, one layer's adapter gradient
        gathered = b_c * (big.root + 2 * big.layer) + 4 * adapters // big.layers
    rows = min(tokens, t.logprob_chunk_tokens) if t.logprob_chunk_tokens else tokens  # logits rows held at once
    act = big.activation_bytes_per_token(m.activation_checkpointing, b_c)
    other = big.activation_bytes_per_token(not m.activation_checkpointing, b_c)

    kv_per_token = actor.kv_bytes_per_token(r.tensor_parallel, b_c)
    weights = b_c * actor.params / r.tensor_parallel
    if held.engine_lora:  # vLLM allocates one LoRA slot at max_lora_rank up front
        from rlcore.models.lora import engine_max_rank
        weights += b_c * actor.adapter_params(engine_max_rank(lo.rank), lo.targets) / r.tensor_parallel
    sync = b_c * (adapters if held.engine_lora else actor.params)
    if cuda:
        budget = r.gpu_memory_utilization * memory
        kv = budget - weights - ENGINE_OVERHEAD_GB * GB
        engine = [(f"engine (gpu_memory_utilization={r.gpu_memory_utilization:g}): weights {weights / GB:.2f} + "
                   f"overhead {ENGINE_OVERHEAD_GB:g} + KV {max(kv, 0) / GB:.2f}", budget)]
    else:
        kv = r.cpu_kv_cache_gb * GB
        engine = [(f"engine weights (/tp {r.tensor_parallel})", weights),
                  (f"engine KV cache (rollout.cpu_kv_cache_gb={r.cpu_kv_cache_gb:g})", kv)]
    step = grads + [
        ("gathered units (root + 2 layers) + unsharded grads", gathered),
        (f"activations (checkpointing {'on' if m.activation_checkpointing else 'off'}; "
         f"{tokens * other / GB:.1f} GB {'off' if m.activation_checkpointing else 'on'})", tokens * act),
        (f"logits + fp32 log-softmax copies [{rows}, {actor.vocab}]"
         + (f" (chunks of train.logprob_chunk_tokens={t.logprob_chunk_tokens})" if rows < tokens else ""),
         rows * actor.vocab * (b_c + 16)),
    ]
    limit, sharing, kv_short = (1 - MARGIN) * memory, 1 if cuda else nproc, seq * kv_per_token - kv
    if not dims.split:
        asleep = cuda and r.sleep_while_training
        train = Bar("train", runtime + resident + step + ([] if asleep else engine), limit, sharing)
        generation = Bar("generation", runtime + resident + engine, limit, sharing, kv_short=kv_short)
    else:
        unit = b_c * max(actor.root, actor.layer)  # the root unit unless the vocabulary is tiny
        generation = Bar("rollout", runtime + engine + [
            ("weight transfer: its largest unit received", unit)], limit, kv_short=kv_short)
        send = b_c * (2 * actor.root + actor.layer)
        freed = sum(b for _, b in step)  # by the time rank R sends the weights
        dormant = [("dormant engine, eager, asleep (level 2: weights, KV freed)", 0.0)] if cuda else \
            [(f"dormant {name}", b) for name, b in engine]
        train = Bar("trainer", runtime + resident + step + [
            (f"weight send (rank {r.ranks}): {send / GB:.2f} in flight after the step frees {freed / GB:.2f}",
             max(0.0, send - freed))] + dormant, limit)
        if not cuda:
            _share_host(generation, train, r.ranks, nproc, nnodes)
    # A checkpoint holds each trained model's weights and AdamW moments (model.dtype; LoRA: fp32 adapters).
    saved = sum(12 * x.adapters if x.adapters else 3 * b_m * x.params for x in models if x.trained)
    return Plan(cfg, nproc, nnodes, device, memory, models, train, generation, kv_per_token,
                max(0, int(kv // kv_per_token)), seq, tokens, sync_bytes=sync, checkpoint_bytes=saved)


def _share_host(rollout: Bar, trainer: Bar, ranks: int, nproc: int, nnodes: int) -> None:
    """CPU, split mesh: a host holds its node's rollout ranks and trainer ranks together. Each bar is checked
    on the node where the host holds the most among those with ranks of its kind."""
    nodes = [(g, nproc - g) for g in (min(max(ranks - n * nproc, 0), nproc) for n in range(nnodes))]
    for bar, other, mine in ((rollout, trainer, 0), (trainer, rollout, 1)):
        ours, theirs = max(((c[mine], c[1 - mine]) for c in nodes if c[mine]),
                           key=lambda c: c[0] * bar.total + c[1] * other.total)
        bar.ranks_sharing, bar.neighbours = ours, (theirs, theirs * other.total)


def _levers(plan: Plan, bar: str) -> list[tuple[str, float, bool]]:
    """Up to three (lever, bytes saved, then fits), the most saving first. Each lever tries its settings in
    order and keeps the first that makes the bar fit, else the one that saves most."""
    cfg, m, r = plan.cfg, plan.cfg.model, plan.cfg.rollout
    cuda, before = plan.device == "cuda", plan.bar(bar).short
    frozen = any(not x.trained for x in plan.models)
    ladders = {
        "train.logprob_chunk_tokens": [1024] if not cfg.train.logprob_chunk_tokens else [],
        "train.micro_batch_size": [cfg.train.micro_batch_size >> i for i in range(1, 8)
                                   if cfg.train.micro_batch_size >> i],
        "model.activation_checkpointing": [True] if not m.activation_checkpointing else [],
        "model.offload_frozen": [True] if cuda and frozen and not m.offload_frozen else [],
        "model.dtype": ["bfloat16"] if m.dtype == "float32" else [],
        "rollout.sleep_while_training": [True] if cuda and not r.sleep_while_training else [],
        "rollout.tensor_parallel": [r.tensor_parallel << i for i in range(1, 4)
                                    if r.tensor_parallel << i <= plan.nproc_per_node],
        "rollout.gpu_memory_utilization": sorted((i / 20 for i in range(1, 20)
                                                  if abs(i / 20 - r.gpu_memory_utilization) > 1e-9),
                                                 key=lambda v: abs(v - r.gpu_memory_utilization)) if cuda else [],
        "rollout.ranks": list(range(r.ranks - r.tensor_parallel, 0, -r.tensor_parallel)),  # more trainers
        "--nnodes": [plan.nnodes << i for i in range(1, 4)],
    }
    found = []
    for key, values in ladders.items():
        tried = []
        for value in values:
            nnodes, changed = plan.nnodes, copy.deepcopy(cfg)
            if key == "--nnodes":
                nnodes = value
            else:
                section, name = key.split(".")
                setattr(getattr(changed, section), name, value)
            try:
                after = _build(changed, plan.nproc_per_node, nnodes, plan.device, plan.memory).bar(bar)
            except ValueError:  # not a valid setting for this model or mesh
                continue
            label = f"--nnodes {value}" if key == "--nnodes" else f"{key}={str(value).lower()}"
            tried.append((label, before - after.short, after.fits))
            if after.fits:
                break
        best = tried[-1] if tried and tried[-1][2] else max(tried, key=lambda x: x[1], default=None)
        if best and best[1] > 0:
            found.append(best)
    return sorted(found, key=lambda x: -x[1])[:3]
