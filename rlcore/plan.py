"""The launch plan: the mesh, the four models and the per-GPU memory of a run, before anything loads.

    python launch/plan.py recipe=grpo --nproc-per-node 8 --gpu-memory-gb 80
    torchrun --nproc-per-node 8 launch/train.py recipe=grpo plan=true

Arithmetic on each model's config.json (a local folder or the hub cache): no process group, no GPU, no
weights. `build(cfg, nproc_per_node, nnodes, gpu_memory_gb) -> Plan` is the one call; `plan.fits`,
`plan.levers` and `plan.error()` are what a launch-time check needs. Formulas, not a simulator.

Notation: P parameters, W FSDP ranks (the world), k rollout TP degree, L layers, h hidden, I MLP width,
V vocab, n_q / n_kv attention / key-value heads, d head_dim, T tokens of a micro-batch =
micro_batch_size * (max_prompt_tokens + (max_total_tokens or max_new_tokens)) (rows are padded to that).
b_m bytes of model.dtype (master weights), b_c of the compute dtype (mixed_precision, else b_m); the engine
runs in b_c. GB = 2**30 bytes.

Parameters (qwen2 / qwen3 / llama decoders: RMSNorm, SwiGLU MLP, grouped-query attention):
  layer  = 2*h*n_q*d + 2*h*n_kv*d + 3*h*I + 2*h   [+ n_q*d + 2*n_kv*d qkv biases: qwen2, attention_bias]
           [+ h o_proj bias: attention_bias]   [+ 2*d q/k norms: qwen3]
  actor, reference   P = L*layer + V*h embedding + h final norm [+ V*h lm_head when not tied]
  critic             P without the lm_head + h + 1 (value head, with bias)
  LoRA adapters      A = L * r * sum over lora.targets of (in + out): q (h, n_q*d), k and v (h, n_kv*d),
                     o (n_q*d, h), gate and up (h, I), down (I, h); other names count 0
  reward model       P without the lm_head + h (score head, no bias)
Train bar, bytes per GPU:
  trained model  params b_m*P/W + grads b_m*P/W + AdamW m and v 2*b_m*P/W (torch keeps them in the param
                 dtype: 16*P/W for float32)
  frozen model   b_m*P/W; 0 with model.offload_frozen on CUDA
  LoRA actor     base b_m*P/W (frozen) + adapters 4*A/W + their grads 4*A/W + AdamW 8*A/W (fp32); no
                 reference model (the reference is the actor with adapters off); gathered units hold no
                 root gradient (embedding and head are frozen) and one layer's adapter gradient 4*A/L
  gathered       the largest trained model: b_c*(root + 2*layer) + b_c*root + 4*layer, where
                 root = V*h (2*V*h untied) + h. The root unit stays gathered through forward and backward
                 with its unsharded gradient; two decoder layers are in flight (prefetch); one layer's
                 unsharded gradient is reduced in fp32
  activations    T * b_c/2 * L*(10h + 4*n_kv*d + 8I) bytes without activation checkpointing,
                 T * b_c/2 * (2h*L + 10h + 4*n_kv*d + 8I) with it (each layer's input kept, one layer live)
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
  KV per token   2 (K and V) * L * max(1, n_kv/k) * d * b_c (vLLM shards KV heads over TP, replicating
                 them when k > n_kv); sequences = KV tokens / (max_prompt_tokens + response tokens)
A bar fits when it is at most (1 - MARGIN) * memory, and the KV cache holds one full sequence (vLLM
refuses to start otherwise). On CPU the ranks of a node share the host: nproc_per_node * bar is compared
with MemTotal. A lever is applied to a copy of the config and the plan rebuilt; levers rank by how much
of the bar's shortfall they remove.
"""
from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field

from rlcore.config import Config, validate
from rlcore.parallel import ParallelDims

GB = 2**30
MARGIN = 0.10  # CUDA context, allocator fragmentation and NCCL buffers are not in the bars
CPU_RUNTIME_GB = 1.0  # resident memory of a CPU rank before any model: imports 0.66 GB + vLLM's engine state
ENGINE_OVERHEAD_GB = 2.0  # vLLM's profiled activation peak + CUDA graphs + context inside its budget (calibrate)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


@dataclass
class Shapes:
    """What the formulas need from a config.json."""
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False

    @classmethod
    def from_config(cls, c: dict) -> Shapes:
        h, heads = c["hidden_size"], c["num_attention_heads"]
        bias = bool(c.get("attention_bias", False))
        return cls(h, c["num_hidden_layers"], heads, c.get("num_key_value_heads") or heads,
                   c.get("head_dim") or h // heads, c["intermediate_size"], c["vocab_size"],
                   bool(c.get("tie_word_embeddings", False)), qkv_bias=bias or c.get("model_type") == "qwen2",
                   o_bias=bias, qk_norm=c.get("model_type") == "qwen3")

    @property
    def layer(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return (2 * h * q + 2 * h * kv + 3 * h * self.intermediate + 2 * h + (q + 2 * kv) * self.qkv_bias
                + h * self.o_bias + 2 * self.head_dim * self.qk_norm)

    def adapter_params(self, rank: int, targets: list[str]) -> int:
        """LoRA parameters over all layers: r * (in + out) for each adapted linear (rlcore/lora.py)."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        sides = {"q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h, "gate_proj": h + i,
                 "up_proj": h + i, "down_proj": i + h}
        return self.layers * rank * sum(sides.get(t, 0) for t in set(targets))

    @property
    def root(self) -> int:  # the FSDP root unit: embedding, final norm, lm_head when untied
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def params(self, role: str = "actor") -> int:
        backbone = self.layers * self.layer + self.vocab * self.hidden + self.hidden
        head = {"critic": self.hidden + 1, "reward": self.hidden}.get(role, 0 if self.tied else self.vocab * self.hidden)
        return backbone + head

    def kv_bytes_per_token(self, tp: int, dtype_bytes: int) -> int:
        return 2 * self.layers * max(1, self.kv_heads // tp) * self.head_dim * dtype_bytes

    def activation_bytes_per_token(self, checkpointing: bool, dtype_bytes: int) -> float:
        one = 10 * self.hidden + 4 * self.kv_heads * self.head_dim + 8 * self.intermediate
        return dtype_bytes / 2 * (2 * self.hidden * self.layers + one if checkpointing else self.layers * one)


def read_config(path: str, field_: str = "model.path") -> dict:
    """config.json of a local model folder, or of a hub id already in the hub cache (never the network)."""
    local = os.path.join(os.path.expanduser(path), "config.json")
    if not os.path.isfile(local):
        local = None
        if path and not path.startswith(("/", ".", "~")) and path.count("/") <= 1:
            from huggingface_hub import try_to_load_from_cache
            found = try_to_load_from_cache(path, "config.json")
            local = found if isinstance(found, str) else None
    if local is None:
        raise ValueError(f"{field_} '{path}' has no config.json locally or in the hub cache; the plan reads "
                         f"model shapes from there (download the model, or run the recipe's prepare first)")
    try:
        with open(local) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{field_} '{path}': config.json is not readable JSON ({e})") from None


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
        return self.shapes.params(self.role)


@dataclass
class Bar:
    name: str  # "train" | "generation"
    parts: list[tuple[str, float]]  # (component, bytes per GPU or per rank)
    limit: float  # usable bytes: (1 - MARGIN) * memory
    ranks_sharing: int = 1  # CPU: the ranks of a node share the host memory
    kv_short: float = 0.0  # bytes the KV cache lacks for one full sequence

    @property
    def total(self) -> float:
        return sum(b for _, b in self.parts)

    @property
    def short(self) -> float:  # bytes to save before the bar fits; <= 0 when it fits
        return max(self.total * self.ranks_sharing - self.limit, self.kv_short)

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
    train: Bar
    generation: Bar
    kv_per_token: int
    kv_tokens: int
    seq_len: int
    micro_tokens: int
    sync_bytes: int = 0  # bytes handed to each engine rank per weight sync
    levers: dict[str, list[tuple[str, float, bool]]] = field(default_factory=dict)  # bar -> (lever, saved, fits)

    @property
    def kv_bytes(self) -> int:  # the KV cache each engine rank gets
        return self.kv_tokens * self.kv_per_token

    @property
    def world(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def fits(self) -> bool:
        return self.train.fits and self.generation.fits

    def error(self) -> str:
        """One line per failing bar: the bar, by how much, and the levers (empty when the plan fits)."""
        out = []
        for bar in (self.train, self.generation):
            if bar.fits:
                continue
            over = bar.total * bar.ranks_sharing - bar.limit
            what = [f"needs {bar.total * bar.ranks_sharing / GB:.1f} GB, {over / GB:.1f} GB over the "
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
        cfg, w, k = self.cfg, self.world, self.cfg.rollout.tensor_parallel
        unit = f"{self.device} GPU" if self.device == "cuda" else "CPU rank"
        where = (f"{self.memory / GB:.1f} GB per GPU" if self.device == "cuda" else
                 f"host memory {self.memory / GB:.1f} GB shared by {self.nproc_per_node} ranks")
        groups = " ".join("[" + ",".join(map(str, range(g * k, g * k + k))) + "]" for g in range(w // k))
        lines = [f"rlcore plan: {cfg.name} on {self.nnodes} node(s) x {self.nproc_per_node} {unit}s; {where}",
                 f"mesh: world {w}; FSDP over ranks 0-{w - 1}; {w // k} rollout group(s) x tp={k}: {groups}"]
        for role in ("actor", "critic", "reference"):
            if role == "reference" and cfg.lora.enabled and cfg.algorithm.needs_reference:
                lines.append(f"  {role:<9} the actor with its adapters off (LoRA): no copy")
            elif role not in {m.role for m in self.models if m.role != "reward"}:
                lines.append(f"  {role:<9} none")
            for m in (m for m in self.models if m.role == role):
                how = "trained, AdamW" if m.trained else "frozen" + (", offloaded to CPU" if m.offloaded else "")
                if m.adapters:
                    how = (f"base frozen; LoRA r={cfg.lora.rank} adapters trained, AdamW: {m.adapters:,} params "
                           f"({100 * m.adapters / m.params:.2f}%)")
                lines.append(f"  {role:<9} {m.path}: {m.params / 1e9:.3f}B params ({m.params:,}), {how}, "
                             f"FSDP over {w} ranks ({m.shapes.layers} layer units + root)")
        lines += [f"  {'reward':<9} model {m.path}: {m.params / 1e9:.3f}B params ({m.params:,}), frozen"
                  + (", offloaded to CPU" if m.offloaded else "") for m in self.models if m.role == "reward"]
        lines += [f"  {'reward':<9} function {s.fn if isinstance(s.fn, str) else getattr(s.fn, '__name__', s.fn)}"
                  for s in cfg.rewards if s.fn]
        for bar in (self.train, self.generation):
            lines.append(f"{bar.name.upper()} bar per {'GPU' if self.device == 'cuda' else 'rank'}"
                         + (f" (micro-batch {cfg.train.micro_batch_size} x {self.seq_len} = {self.micro_tokens} tokens)"
                            if bar.name == "train" else ""))
            lines += [f"  {name:<58} {b / GB:8.2f} GB" for name, b in bar.parts]
            total = bar.total * bar.ranks_sharing
            verdict = "fits" if bar.fits else f"DOES NOT FIT ({bar.short / GB:.1f} GB short)"
            lines.append(f"  {'total' + (f' x {bar.ranks_sharing} ranks' if bar.ranks_sharing > 1 else ''):<58} "
                         f"{total / GB:8.2f} GB  of {bar.limit / GB:.1f} usable: {verdict}")
        what = (f"LoRA adapters only (lora.sync=adapter; {self.models[0].adapters:,} of "
                f"{self.models[0].params:,} params)"
                if cfg.lora.enabled and cfg.lora.sync == "adapter" else
                "full weights, adapters merged (lora.sync=merged)" if cfg.lora.enabled else "full weights")
        lines.append(f"SYNC per step: {self.sync_bytes / GB:.4f} GB per engine rank before its TP cut, {what}")
        per_engine = cfg.rollout.prompts_per_step // (w // k) * cfg.rollout.group_size
        lines.append(f"KV cache: {self.kv_per_token:,} B/token per TP rank; {self.kv_tokens:,} tokens fit = "
                     f"{self.kv_tokens // self.seq_len:,} sequences of {self.seq_len} tokens "
                     f"(a step samples {per_engine} per engine)")
        if not self.fits:
            lines.append(f"rlcore: does not fit: {self.error()}")
        return "\n".join(lines)


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
    plan.levers = {bar.name: _levers(plan, bar.name) for bar in (plan.train, plan.generation) if not bar.fits}
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
    actor = Shapes.from_config(read_config(m.path))
    dims.validate(actor.heads, actor.kv_heads)
    offload = m.offload_frozen and cuda
    lo = cfg.lora
    adapters = actor.adapter_params(lo.rank, lo.targets) if lo.enabled else 0
    models = [Model("actor", m.path, actor, trained=True, adapters=adapters)]
    if getattr(cfg.algorithm, "needs_critic", False):
        path = m.path if cfg.critic.path == "policy" else cfg.critic.path
        models.append(Model("critic", path, Shapes.from_config(read_config(path, "critic.path")), trained=True))
    if cfg.algorithm.needs_reference and not lo.enabled:  # LoRA: the actor with adapters off is the reference
        models.append(Model("reference", m.path, actor, trained=False, offloaded=offload))
    models += [Model("reward", s.model, Shapes.from_config(read_config(s.model, f"rewards[{i}].model")),
                     trained=False, offloaded=offload) for i, s in enumerate(cfg.rewards) if s.model]

    b_m = DTYPE_BYTES[m.dtype]
    b_c = DTYPE_BYTES.get(m.mixed_precision, b_m)
    seq = cfg.data.max_prompt_tokens + (r.max_total_tokens or r.max_new_tokens)
    tokens = t.micro_batch_size * seq
    resident, grads = [], []  # grads are freed after each optimizer step: not in the generation bar
    if not cuda:  # a CPU rank's own process: interpreter, torch, transformers and vLLM code and their state
        resident.append((f"process runtime (python, torch, vLLM; measured)", CPU_RUNTIME_GB * GB))
    for x in models:
        if x.adapters:
            resident += [(f"{x.role} base params, frozen ({m.dtype}, /{world})", b_m * x.params / world),
                         (f"{x.role} LoRA adapters (float32, /{world})", 4 * x.adapters / world),
                         (f"{x.role} AdamW m + v of the adapters (float32, /{world})", 8 * x.adapters / world)]
            grads.append((f"{x.role} adapter grads (float32, /{world})", 4 * x.adapters / world))
        elif x.trained:
            resident += [(f"{x.role} params ({m.dtype}, /{world})", b_m * x.params / world),
                         (f"{x.role} AdamW m + v ({m.dtype}, /{world})", 2 * b_m * x.params / world)]
            grads.append((f"{x.role} grads ({m.dtype}, /{world})", b_m * x.params / world))
        elif not x.offloaded:
            resident.append((f"{x.role} params, frozen ({m.dtype}, /{world})", b_m * x.params / world))
    big = max((x for x in models if x.trained), key=lambda x: x.params).shapes
    gathered = b_c * (2 * big.root + 2 * big.layer) + 4 * big.layer
    if adapters:  # LoRA (no critic): no root gradient, one layer's adapter gradient
        gathered = b_c * (big.root + 2 * big.layer) + 4 * adapters // big.layers
    rows = min(tokens, t.logprob_chunk_tokens) if t.logprob_chunk_tokens else tokens  # logits rows held at once
    act = big.activation_bytes_per_token(m.activation_checkpointing, b_c)
    other = big.activation_bytes_per_token(not m.activation_checkpointing, b_c)

    kv_per_token = actor.kv_bytes_per_token(r.tensor_parallel, b_c)
    weights = b_c * actor.params() / r.tensor_parallel
    if lo.enabled and lo.sync == "adapter":  # vLLM allocates one LoRA slot at max_lora_rank up front
        from rlcore.lora import engine_max_rank
        weights += b_c * actor.adapter_params(engine_max_rank(lo.rank), lo.targets) / r.tensor_parallel
    sync = b_c * (adapters if lo.enabled and lo.sync == "adapter" else actor.params())
    if cuda:
        budget = r.gpu_memory_utilization * memory
        kv = budget - weights - ENGINE_OVERHEAD_GB * GB
        engine = [(f"engine (gpu_memory_utilization={r.gpu_memory_utilization:g}): weights {weights / GB:.2f} + "
                   f"overhead {ENGINE_OVERHEAD_GB:g} + KV {max(kv, 0) / GB:.2f}", budget)]
    else:
        kv = r.cpu_kv_cache_gb * GB
        engine = [(f"engine weights (/tp {r.tensor_parallel})", weights),
                  (f"engine KV cache (rollout.cpu_kv_cache_gb={r.cpu_kv_cache_gb:g})", kv)]
    asleep = cuda and r.sleep_while_training
    train = Bar("train", resident + grads + [
        (f"gathered units (root + 2 layers) + unsharded grads", gathered),
        (f"activations (checkpointing {'on' if m.activation_checkpointing else 'off'}; "
         f"{tokens * other / GB:.1f} GB {'off' if m.activation_checkpointing else 'on'})", tokens * act),
        (f"logits + fp32 log-softmax copies [{rows}, {actor.vocab}]"
         + (f" (chunks of train.logprob_chunk_tokens={t.logprob_chunk_tokens})" if rows < tokens else ""),
         rows * actor.vocab * (b_c + 16)),
    ] + ([] if asleep else engine), (1 - MARGIN) * memory, 1 if cuda else nproc)
    generation = Bar("generation", resident + engine, (1 - MARGIN) * memory, 1 if cuda else nproc,
                     kv_short=seq * kv_per_token - kv)
    return Plan(cfg, nproc, nnodes, device, memory, models, train, generation, kv_per_token,
                max(0, int(kv // kv_per_token)), seq, tokens, sync_bytes=sync)


def _levers(plan: Plan, bar: str) -> list[tuple[str, float, bool]]:
    """Up to three (lever, bytes saved, then fits), the most saving first. Each lever tries its settings in
    order and keeps the first that makes the bar fit, else the one that saves most."""
    cfg, m, r = plan.cfg, plan.cfg.model, plan.cfg.rollout
    cuda, before = plan.device == "cuda", getattr(plan, bar).short
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
                after = getattr(_build(changed, plan.nproc_per_node, nnodes, plan.device, plan.memory), bar)
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
