"""The trainer side on one GPU, for real and without vLLM: FSDP2 update, logprobs, packing, the sync's gather, memory.

    python benchmarks/device_check.py --size gpu --out device_check.json   # one CUDA GPU: Qwen2.5-0.5B and 1.5B shapes
    python benchmarks/device_check.py --size tiny                          # CPU, seconds (tests/test_device_check.py)

World size 1: a process group of one (nccl on CUDA, gloo on CPU) and FSDP2 as the trainer shards
(rlcore.models.build.shard). Each model is a random-init Qwen2 of the real config.json's shape, written (config.json
and weights) to a temporary folder and loaded from there by rlcore's own build path; nothing is downloaded. Per model:
  a. build     write the folder, load and shard the policy: fp32 master weights, bf16 mixed precision, AdamW
  b. update    GRPO optimizer steps (rlcore.train.update.update) on random tokens (gpu: 8 rows x 1024): tokens/s and
               MFU = 6 N tokens / seconds / peak bf16 FLOP/s (the attention's T^2 FLOPs are not counted)
  c. chunking  rlcore's token logprobs with train.logprob_chunk_tokens=0 vs C: max |diff|, seconds, peak memory
  d. packing   rows of random lengths, padded vs packed (train.max_tokens_per_micro_batch): max |diff|, seconds, memory
  e. gather    the weight sync's gather-and-convert (rlcore.models.weights.checkpoint_weights in the engine's bf16) and
               the export's (master=True, fp32) vs what transformers' save_pretrained writes for the same weights:
               names, shapes, dtypes, bytes and torch.equal, tensor by tensor
  f. memory    the launch plan's train bar (rlcore.preflight.plan, engine parts left out) vs
               torch.cuda.max_memory_reserved over the update; on CPU the process's peak RSS, not compared
Prints each part's seconds as it goes and a table at the end, writes every number to --out (JSON), and exits 1 when a
check fails: a skipped (non-finite) update step, a logprob diff past its bound (chunk_bound, packing_bound), any
difference in the gather. Imports nothing that imports vLLM.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rlcore.algorithms.grpo import GRPO  # noqa: E402
from rlcore.batch import Batch  # noqa: E402
from rlcore.config import (Config, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig,  # noqa: E402
                           TrainConfig)
from rlcore.distributed.parallel import ParallelDims, build_meshes, device_type, init_distributed  # noqa: E402
from rlcore.models import build as models, weights  # noqa: E402
from rlcore.preflight import plan as launch_plan  # noqa: E402
from rlcore.run import Trainer  # noqa: E402
from rlcore.train import forward, update  # noqa: E402

GB = 2**30
EPS = {torch.bfloat16: 2.0**-7, torch.float32: 2.0**-23}  # torch.finfo(dtype).eps: one ulp at 1.0
# Qwen2.5-0.5B / -1.5B config.json (hidden, layers, heads, kv heads, MLP width); both tie the embeddings.
SHAPES = {"0.5B": (896, 24, 14, 2, 4864), "1.5B": (1536, 28, 12, 2, 8960), "tiny": (64, 2, 4, 2, 128)}
QWEN25 = dict(architectures=["Qwen2ForCausalLM"], tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6,
              max_position_embeddings=32768, hidden_act="silu", initializer_range=0.02, use_sliding_window=False)
# bf16 dense peaks (NVIDIA datasheets, no sparsity), the longest matching name first.
PEAKS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "H200": 989e12}
CUDA = torch.cuda.is_available()  # else CPU: the tiny size, as the test suite runs it


@dataclasses.dataclass
class Settings:
    models: tuple[str, ...]
    vocab: int
    rows: int  # sequences per batch (one micro-batch)
    seq: int  # tokens per row
    chunk: int  # train.logprob_chunk_tokens of the update and of part c
    steps: int  # timed optimizer steps, after one warm-up
    checkpointing: bool = True  # as the GPU recipes (recipes/grpo.py)


SIZES = {"gpu": Settings(("0.5B", "1.5B"), vocab=151936, rows=8, seq=1024, chunk=1024, steps=3),
         "tiny": Settings(("tiny",), vocab=1024, rows=4, seq=64, chunk=64, steps=2)}


def chunk_bound(compute: torch.dtype, vocab: int, max_logit: float, temperature: float) -> float:
    """Chunked vs whole logprobs. Both run the decoder on the same rows with the same kernels, so the final hidden
    states are equal; only the LM head's product runs on other row counts ([C, H] vs [B * L, H]) and may sum in
    another order. Its fp32 sums then differ by far less than one ulp of the compute dtype, so each logit, rounded to
    it, differs by at most one ulp <= eps_c |z|. log p = z_t - logsumexp(z), and logsumexp moves by at most
    max_v |dz_v|: 2 eps_c max|z|. The fp32 log-softmax adds its own sum over V (independent roundings:
    sqrt(V) eps_32 max|z|). All over the temperature."""
    return (2 * EPS[compute] + math.sqrt(vocab) * EPS[torch.float32]) * max_logit / temperature


def packing_bound(compute: torch.dtype, layers: int, vocab: int, seq: int, max_logit: float,
                  temperature: float) -> float:
    """Packed vs padded logprobs. Every op runs on other shapes (packed rows as wide as the longest sequence, the
    attention under another mask), so each compute-dtype tensor on a logit's path may round to a neighbour: one ulp,
    <= eps_c relative. A decoder layer writes 16 of them (input norm, q, k, v, rotated q and k, attention output,
    o_proj, residual add, post-attention norm, gate, up, silu, silu * up, down, residual add), the final norm and the
    head 2 more: R = 16 L + 2. The norms carry relative errors to the logits with a gain of about 1, and independent
    roundings add as sqrt(R) (a statistical bound, as tests/conftest.py's ENGINE_BOUND for fp32 sums):
    |dz| <= sqrt(R) eps_c max|z|, doubled by the log-softmax as in chunk_bound, plus the fp32 sums over the keys (seq)
    and the vocabulary: (2 sqrt(16 L + 2) eps_c + sqrt(seq + V) eps_32) max|z| / temperature."""
    fp32 = math.sqrt(seq + vocab) * EPS[torch.float32]
    return (2 * math.sqrt(16 * layers + 2) * EPS[compute] + fp32) * max_logit / temperature


# ---- setup --------------------------------------------------------------------------------------------------------

def start_group():
    """A process group of one (rlcore's init_distributed: RANK 0, WORLD_SIZE 1) on a free port, and its FSDP mesh."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ.setdefault("MASTER_PORT", str(s.getsockname()[1]))
    init_distributed()
    return build_meshes(ParallelDims(world_size=1, tp=1))[0]


def write_model(folder: Path, shape: str, vocab: int, seed: int = 0) -> Path:
    """config.json and random-init fp32 weights, as save_pretrained leaves a downloaded checkpoint."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hidden, layers, heads, kv_heads, intermediate = SHAPES[shape]
    config = AutoConfig.for_model("qwen2", **QWEN25, vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                  num_attention_heads=heads, num_key_value_heads=kv_heads,
                                  intermediate_size=intermediate, max_window_layers=layers)
    torch.manual_seed(seed)
    with torch.device(device_type()):  # random init on the GPU: seconds instead of a minute for 1.5B
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    return folder


def run_config(path: Path, s: Settings) -> Config:
    """A run's config for this model and batch: the plan reads the same micro-batch (rows x seq tokens)."""
    half = s.seq // 2
    return Config(model=ModelConfig(path=str(path), dtype="float32", mixed_precision="bfloat16",
                                    activation_checkpointing=s.checkpointing),
                  data=DataConfig(max_prompt_tokens=half),
                  rollout=RolloutConfig(group_size=s.rows, prompts_per_step=1, max_new_tokens=s.seq - half),
                  optim=OptimConfig(lr=1e-6), train=TrainConfig(micro_batch_size=s.rows, logprob_chunk_tokens=s.chunk),
                  rewards=[RewardSpec(fn="rlcore.rewards:gsm8k")],  # never called: a run's config needs a reward
                  algorithm=GRPO())


def build_run(cfg: Config, mesh) -> SimpleNamespace:
    """What the stages read of a Run: the config and the trainer (the policy sharded as rlcore.trainer.setup does)."""
    policy = models.shard(models.load_causal_lm(cfg.model, meta=True), mesh, cfg.model)
    optimizer, scheduler = models.build_optimizer(policy, cfg.optim, total_steps=100)
    return SimpleNamespace(cfg=cfg, trainer=Trainer(policy, optimizer, scheduler))


def with_train(run: SimpleNamespace, **train) -> SimpleNamespace:
    """The same trainer under other train.* settings."""
    cfg = dataclasses.replace(run.cfg, train=dataclasses.replace(run.cfg.train, **train))
    return SimpleNamespace(cfg=cfg, trainer=run.trainer)


def random_batch(s: Settings, lengths: torch.Tensor | None = None, seed: int = 0) -> Batch:
    """rows x seq random tokens (right-padded to seq when `lengths` [B] are given); the second half is the response."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.full((s.rows,), s.seq) if lengths is None else lengths
    attention_mask = (torch.arange(s.seq)[None] < lengths[:, None]).long()  # [B, L]
    input_ids = torch.randint(0, s.vocab, (s.rows, s.seq), generator=g) * attention_mask  # [B, L]
    t = torch.arange(s.seq - 1)[None]
    loss_mask = ((t >= s.seq // 2 - 1) & (t < lengths[:, None] - 1)).float()  # [B, T]
    batch = Batch(input_ids, attention_mask, loss_mask, rollout_logprobs=torch.zeros(s.rows, s.seq - 1),
                  rewards=torch.zeros(s.rows), group_size=s.rows, max_model_tokens=s.seq)
    batch.advantages = torch.randn(s.rows, s.seq - 1, generator=g) * loss_mask  # [B, T]
    return batch


# ---- measuring ----------------------------------------------------------------------------------------------------

def synchronize():
    if CUDA:
        torch.cuda.synchronize()


@contextmanager
def measured(out: dict):
    """Seconds of the block, and on CUDA its peak memory: allocated above the start and in all, and reserved."""
    synchronize()
    if CUDA:
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    yield
    synchronize()
    out["seconds"] = time.perf_counter() - t0
    if CUDA:
        out["peak_allocated_gb"] = (torch.cuda.max_memory_allocated() - start) / GB
        out["max_allocated_gb"] = torch.cuda.max_memory_allocated() / GB
        out["peak_reserved_gb"] = torch.cuda.max_memory_reserved() / GB


@contextmanager
def part(model: str, name: str, seconds: dict):
    print(f"[{model}] {name} ...", flush=True)
    t0 = time.perf_counter()
    yield
    seconds[name] = time.perf_counter() - t0
    print(f"[{model}] {name} done in {seconds[name]:.1f} s", flush=True)


def peak_flops(override_tflops: float) -> tuple[float | None, str]:
    if override_tflops:
        return override_tflops * 1e12, f"--peak-tflops {override_tflops:g}"
    if not CUDA:
        return None, "n/a (CPU)"
    name = torch.cuda.get_device_name()
    key = next((k for k in PEAKS if k in name), None)
    return (PEAKS[key], f"{name}: bf16 dense {PEAKS[key] / 1e12:g} TFLOP/s") if key else \
        (None, f"{name}: unknown peak (pass --peak-tflops)")


@torch.no_grad()
def max_abs_logit(policy: torch.nn.Module, batch: Batch) -> float:
    """The largest |logit| the model gives anywhere in the batch (a row at a time): the scale of the bounds."""
    top = 0.0
    for i in range(len(batch)):
        row = batch.select(torch.tensor([i])).to(device_type())
        logits = policy(input_ids=row.input_ids, attention_mask=row.attention_mask, use_cache=False).logits
        top = max(top, logits.abs().max().item())
    policy.reshard()
    return top


def logprobs_pass(run: SimpleNamespace, batch: Batch, out: dict) -> torch.Tensor:
    """rlcore's no-grad logprobs of the batch [B, T] (rlcore.train.forward.forward_logprobs), measured into `out`."""
    with measured(out):
        logprobs = forward.forward_logprobs(run, run.trainer.policy, batch)
    run.trainer.policy.reshard()  # the root unit stays gathered after a forward without backward
    return logprobs


# ---- the parts ----------------------------------------------------------------------------------------------------

def check_update(run: SimpleNamespace, batch: Batch, s: Settings, params: int, peak: float | None) -> dict:
    """One warm-up and s.steps timed optimizer steps, each a forward + backward of the whole batch and an AdamW step."""
    times, applied, out = [], 0, {}
    with measured(out):  # from before the first step: AdamW's state is allocated there
        for _ in range(1 + s.steps):
            batch.old_logprobs = None  # on-policy: the update's own forward fills them in
            synchronize()
            t0 = time.perf_counter()
            metrics = update.update(run, batch)
            synchronize()
            times.append(time.perf_counter() - t0)
            applied += metrics["optim/steps_applied"]
    tokens = int(batch.attention_mask.sum())
    step_s = statistics.median(times[1:])
    out |= {"tokens_per_step": tokens, "step_seconds": times, "step_s": step_s, "tokens_per_s": tokens / step_s,
            "mfu": 6 * params * tokens / step_s / peak if peak else None, "steps_applied": applied,
            "steps": 1 + s.steps, "grad_norm": metrics["policy/grad_norm"]}
    return out


def check_memory(cfg: Config, update_out: dict) -> dict:
    """The plan's train bar for this config on one rank, without the engine (none runs here), vs the measured peak."""
    gpu_gb = torch.cuda.get_device_properties(0).total_memory / GB if CUDA else None
    bar = launch_plan.build(cfg, nproc_per_node=1, gpu_memory_gb=gpu_gb).train
    parts = {name: b / GB for name, b in bar.parts if not name.startswith("engine")}
    predicted = sum(parts.values())
    if not CUDA:
        with open("/proc/self/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 2**20
        return {"plan_parts_gb": parts, "plan_train_gb": predicted, "measured_gb": rss, "measured_over_plan": None,
                "measured": "peak RSS of the process (VmHWM): not the plan's quantity, not compared"}
    reserved, allocated = update_out["peak_reserved_gb"], update_out["max_allocated_gb"]
    return {"plan_parts_gb": parts, "plan_train_gb": predicted, "measured_gb": reserved,
            "measured": "torch.cuda.max_memory_reserved over the update", "measured_over_plan": reserved / predicted,
            "allocated_gb": allocated, "allocated_over_plan": allocated / predicted}


def check_chunking(run: SimpleNamespace, batch: Batch, s: Settings) -> dict:
    out = {"whole": {}, "chunked": {"chunk_tokens": s.chunk}}
    whole = logprobs_pass(with_train(run, logprob_chunk_tokens=0), batch, out["whole"])  # [B, T]
    chunked = logprobs_pass(with_train(run, logprob_chunk_tokens=s.chunk), batch, out["chunked"])  # [B, T]
    out["max_abs_logit"] = max_abs_logit(run.trainer.policy, batch)
    out["max_abs_diff"] = (whole - chunked).abs().max().item()
    out["bound"] = chunk_bound(models.DTYPES[run.cfg.model.mixed_precision], s.vocab, out["max_abs_logit"],
                               run.cfg.rollout.temperature)
    return out


def check_packing(run: SimpleNamespace, s: Settings, layers: int) -> dict:
    """Rows of s.seq / 4 .. s.seq real tokens: padded (micro_batch_size rows) vs packed into one micro-batch."""
    lengths = torch.randint(s.seq // 4, s.seq + 1, (s.rows,), generator=torch.Generator().manual_seed(1))
    batch = random_batch(s, lengths, seed=1)
    out = {"lengths": lengths.tolist(), "padded": {}, "packed": {"max_tokens": s.rows * s.seq}}
    runs = {"padded": with_train(run, max_tokens_per_micro_batch=0),
            "packed": with_train(run, max_tokens_per_micro_batch=s.rows * s.seq)}
    padded = logprobs_pass(runs["padded"], batch, out["padded"])  # [B, T]
    packed = logprobs_pass(runs["packed"], batch, out["packed"])
    times = {k: [] for k in runs}  # the passes above warmed both paths; now 3 each, alternating
    for _ in range(3):
        for k, r in runs.items():
            synchronize()
            t0 = time.perf_counter()
            logprobs_pass(r, batch, {})
            synchronize()
            times[k].append(time.perf_counter() - t0)
    for k in runs:
        out[k]["median_s"] = sorted(times[k])[1]
    out["real_tokens"], out["padded_tokens"] = int(lengths.sum()), s.rows * int(lengths.max())
    scored = batch.attention_mask[:, 1:].bool()  # [B, T] positions whose next token is real
    out["max_abs_logit"] = max_abs_logit(run.trainer.policy, batch)
    out["max_abs_diff"] = (padded - packed)[scored].abs().max().item()
    out["bound"] = packing_bound(models.DTYPES[run.cfg.model.mixed_precision], layers, s.vocab, s.seq,
                                 out["max_abs_logit"], run.cfg.rollout.temperature)
    return out


def saved(model: torch.nn.Module, folder: Path) -> dict[str, torch.Tensor]:
    """What save_pretrained writes, loaded back from its safetensors files."""
    from safetensors.torch import load_file

    model.save_pretrained(folder)
    return {k: v for file in sorted(folder.glob("*.safetensors")) for k, v in load_file(file).items()}


def compare(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> dict:
    """Tensor by tensor: the same names, shapes, dtypes, bytes and values (torch.equal: bitwise for these dtypes)."""
    def same(a, b):
        return a.shape == b.shape and a.dtype == b.dtype and a.nbytes == b.nbytes and torch.equal(a, b)

    bad = [n for n in sorted(set(ours) | set(theirs))
           if n not in ours or n not in theirs or not same(ours[n].cpu(), theirs[n])]
    return {"tensors": len(theirs), "bytes": sum(t.nbytes for t in theirs.values()), "equal": not bad,
            "missing": sorted(set(theirs) - set(ours)), "extra": sorted(set(ours) - set(theirs)),
            "mismatched": bad[:10]}


def check_gather(run: SimpleNamespace, folder: Path) -> dict:
    """The trained weights through rlcore's gather-and-convert vs through save_pretrained of an unsharded copy."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    policy, cfg = run.trainer.policy, run.cfg.model
    full = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    plain = models.load_causal_lm(cfg, trainable=False)  # on CPU, unsharded
    plain.load_state_dict(full)
    del full
    engine_dtype = models.DTYPES[cfg.mixed_precision]
    out = {"export": compare(dict(weights.checkpoint_weights(policy, master=True)), saved(plain, folder / "fp32"))}
    sync = {name: t.cpu() for name, t in weights.checkpoint_weights(policy, dtype=engine_dtype)}
    out["sync"] = compare(sync, saved(plain.to(engine_dtype), folder / "sync"))
    out["sync"]["dtype"], out["export"]["dtype"] = str(engine_dtype), cfg.dtype
    return out


def check_model(shape: str, s: Settings, mesh, folder: Path, peak: float | None) -> dict:
    r = {"seconds": {}}
    sec = r["seconds"]
    with part(shape, "a. build", sec):
        cfg = run_config(write_model(folder / "model", shape, s.vocab), s)
        run = build_run(cfg, mesh)
        r["params"] = sum(p.numel() for p in run.trainer.policy.parameters())  # tied: the embedding once
    print(f"[{shape}] {r['params'] / 1e6:.1f}M parameters, {s.rows} rows x {s.seq} tokens", flush=True)
    with part(shape, "b. update", sec):
        r["update"] = check_update(run, random_batch(s), s, r["params"], peak)
    with part(shape, "f. memory", sec):
        r["memory"] = check_memory(cfg, r["update"])
        for name, gb in r["memory"]["plan_parts_gb"].items():
            print(f"    plan {gb:8.2f} GB  {name}", flush=True)
    with part(shape, "c. chunking", sec):
        r["chunking"] = check_chunking(run, random_batch(s, seed=2), s)
    with part(shape, "d. packing", sec):
        r["packing"] = check_packing(run, s, SHAPES[shape][1])
    with part(shape, "e. gather", sec):
        r["gather"] = check_gather(run, folder)
    del run
    shutil.rmtree(folder)
    if CUDA:
        torch.cuda.empty_cache()
    return r


# ---- the report ---------------------------------------------------------------------------------------------------

def checks(r: dict) -> list[tuple[str, str, bool]]:
    """(what, value against its bound, ok) for each correctness check of one model."""
    u, c, p, g = r["update"], r["chunking"], r["packing"], r["gather"]
    return [("b. update: steps applied (finite)", f"{u['steps_applied']} of {u['steps']}",
             u["steps_applied"] == u["steps"]),
            *((f"{name}: max |diff|", f"{x['max_abs_diff']:.3g} <= {x['bound']:.3g}", x["max_abs_diff"] <= x["bound"])
              for name, x in (("c. chunked vs whole", c), ("d. packed vs padded", p))),
            *((f"e. {k} ({g[k]['dtype']}) == save_pretrained",
               f"{g[k]['tensors']} tensors, {g[k]['bytes'] / GB:.3f} GB", g[k]["equal"]) for k in ("sync", "export"))]


def table(r: dict) -> list[tuple[str, str]]:
    u, m, c, p = r["update"], r["memory"], r["chunking"], r["packing"]
    mfu = f"{100 * u['mfu']:.1f}%" if u["mfu"] else "n/a"
    ratio = f"reserved, {m['measured_over_plan']:.2f} x plan; allocated {m['allocated_gb']:.2f} GB, " \
        f"{m['allocated_over_plan']:.2f} x plan" if CUDA else "n/a on CPU"

    def cost(x):
        return f"{x['seconds']:.3f} s" + (f", peak +{x['peak_allocated_gb']:.2f} GB" if CUDA else "")

    return [("params", f"{r['params'] / 1e6:.1f}M"),
            ("b. update", f"{u['tokens_per_s']:,.0f} tokens/s, {u['step_s']:.3f} s/step, MFU {mfu}"),
            ("f. memory", f"plan {m['plan_train_gb']:.2f} GB, measured {m['measured_gb']:.2f} GB ({ratio})"),
            ("c. whole / chunked", f"{cost(c['whole'])} / {cost(c['chunked'])}; max|logit| {c['max_abs_logit']:.3g}"),
            ("d. padded / packed", f"{cost(p['padded'])} / {cost(p['packed'])}; warm medians "
                                   f"{p['padded']['median_s']:.3f} / {p['packed']['median_s']:.3f} s for "
                                   f"{p['real_tokens']:,} real of {p['padded_tokens']:,} padded tokens"),
            ("seconds per part", ", ".join(f"{k[0]} {v:.1f}" for k, v in r["seconds"].items()))]


def report(result: dict) -> None:
    for shape, r in result["models"].items():
        print(f"\n== {shape}", flush=True)
        for what, value in table(r):
            print(f"  {what:<22} {value}", flush=True)
    print("\n== checks", flush=True)
    for c in result["checks"]:
        print(f"  {'ok  ' if c['ok'] else 'FAIL'} {c['model']:<5} {c['check']:<46} {c['value']}", flush=True)
    print(f"\n{'all checks passed' if result['ok'] else 'CHECKS FAILED'} in {result['seconds']:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="gpu")
    ap.add_argument("--models", default="", help="comma-separated subset of the size's models, e.g. 0.5B")
    ap.add_argument("--steps", type=int, default=0, help="timed optimizer steps (default: the size's)")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="bf16 peak for MFU (default: from the GPU's name)")
    ap.add_argument("--out", default="", help="write every number here as JSON")
    args = ap.parse_args(argv)
    s = SIZES[args.size]
    s = dataclasses.replace(s, models=tuple(args.models.split(",")) if args.models else s.models,
                            steps=args.steps or s.steps)
    t0, mesh = time.perf_counter(), start_group()
    peak, peak_note = peak_flops(args.peak_tflops)
    result = {"size": args.size, "settings": dataclasses.asdict(s), "torch": torch.__version__,
              "transformers": transformers.__version__, "device": torch.cuda.get_device_name() if CUDA else "cpu",
              "peak_flops": peak, "peak": peak_note, "models": {}}
    print(f"device check: {result['device']}, torch {torch.__version__}, transformers {transformers.__version__}; "
          f"MFU peak: {peak_note}", flush=True)
    with tempfile.TemporaryDirectory(prefix="rlcore-device-check-") as tmp:
        for shape in s.models:
            result["models"][shape] = check_model(shape, s, mesh, Path(tmp) / shape, peak)
    result["checks"] = [{"model": shape, "check": what, "value": value, "ok": ok}
                        for shape, r in result["models"].items() for what, value, ok in checks(r)]
    result["ok"], result["seconds"] = all(c["ok"] for c in result["checks"]), time.perf_counter() - t0
    report(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    torch.distributed.destroy_process_group()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
