"""Peak memory and time of the logprob pass with chunked logits (train.logprob_chunk_tokens) on vs off.

    python benchmarks/logits_memory.py                      # 3M model at vocab 32768, 8 x 512 tokens
    python benchmarks/logits_memory.py --vocab 65536 --rounds 3 --write

Calls rlcore.models.build.token_logprobs directly on a random-init Qwen2 (common.random_model, the vocabulary
widened to --vocab), fp32, sdpa, temperature 1, in one process per measurement:
  forward           no_grad, logprobs only (the trainer's old / reference logprobs pass)
  forward+backward  logprobs and entropy, backward of their sum (the update's pass)
Each process measures its first pass for memory (VmHWM minus the RSS just before the pass: a fresh process,
so no allocator cache from an earlier pass hides anything), then `--repeats` more passes for time.
Contenders alternate (chunk 0, chunk 1024, chunk 0, ...) for `--rounds` rounds; medians.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402

MODES = ("forward", "forward+backward")


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def worker(args) -> None:
    import gc

    import torch

    from rlcore.config import ModelConfig
    from rlcore.models import build as models
    from rlcore.outputs.metrics import reset_peak_memory

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model = models.load_causal_lm(ModelConfig(path=str(common.random_model(args.size, vocab=args.vocab))))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, args.vocab, (args.sequences, args.tokens), generator=g)
    mask = torch.ones_like(ids)

    def one():
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        if args.mode == "forward":
            with torch.no_grad():
                models.token_logprobs(model, ids, mask, 1.0, chunk_tokens=args.chunk)
        else:
            lp, ent = models.token_logprobs(model, ids, mask, 1.0, with_entropy=True, chunk_tokens=args.chunk)
            (lp.sum() + ent.sum()).backward()
            del lp, ent
        return time.perf_counter() - t

    peaks, times = [], []
    for i in range(1 + args.repeats):
        model.zero_grad(set_to_none=True)
        gc.collect()
        reset_peak_memory()
        before = status_kb("VmRSS")
        dt = one()
        peaks.append((status_kb("VmHWM") - before) / 1024)
        times.append(dt)
    print(json.dumps({"peak_mb": peaks[0], "later_peaks_mb": peaks[1:], "first_s": times[0], "times": times[1:],
                      "params": sum(p.numel() for p in model.parameters())}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="3M", choices=list(common.SIZES))
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--sequences", type=int, default=8)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--chunks", default="0,1024", help="logprob_chunk_tokens values, comma-separated (0 = off)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2, help="timed passes per process after the memory pass")
    p.add_argument("--write", action="store_true", help="append a section to benchmarks/RESULTS.md")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="forward", help=argparse.SUPPRESS)
    p.add_argument("--chunk", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    chunks = [int(c) for c in args.chunks.split(",")]
    common.random_model(args.size, vocab=args.vocab)  # build once, outside the measurements
    env = os.environ | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                        "PYTHONPATH": str(common.ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    results = {(m, c): [] for m in MODES for c in chunks}
    for r in range(args.rounds):
        for mode in MODES:
            for c in chunks:
                cmd = [sys.executable, __file__, "--worker", "--mode", mode, "--chunk", str(c), "--size", args.size,
                       "--vocab", str(args.vocab), "--sequences", str(args.sequences), "--tokens", str(args.tokens),
                       "--repeats", str(args.repeats)]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if proc.returncode:
                    sys.exit(f"worker {mode} chunk {c} failed:\n{proc.stderr[-3000:]}")
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                results[mode, c].append(res)
                print(f"round {r} {mode} chunk={c}: peak +{res['peak_mb']:.0f} MB, "
                      f"{[round(t, 2) for t in res['times']]} s", flush=True)
    params = results[MODES[0], chunks[0]][0]["params"]
    n = args.sequences * (args.tokens - 1)
    logits_mb = n * args.vocab * 4 / 2**20
    lines = [f"Model: random-init Qwen2 {args.size} shape at vocab {args.vocab:,} ({params / 1e6:.1f}M parameters, "
             f"untied head), fp32, sdpa, 1 thread. Input: {args.sequences} x {args.tokens} tokens ({n:,} predicted; "
             f"one fp32 [tokens, vocab] tensor is {logits_mb:,.0f} MB). `models.token_logprobs` called directly. "
             f"Peak = VmHWM - RSS before the pass, first pass of a fresh process; time = median of "
             f"{args.repeats} later passes per process; {args.rounds} rounds, contenders alternating, medians.", "",
             "| pass | logprob_chunk_tokens | peak MB | peak / one logits tensor | median s |", "|---|---|---|---|---|"]
    peak = {}
    for mode in MODES:
        for c in chunks:
            rs = results[mode, c]
            peak[mode, c] = common.median(r["peak_mb"] for r in rs)
            t = common.median(t for r in rs for t in r["times"])
            lines.append(f"| {mode} | {c if c else '0 (off)'} | {peak[mode, c]:,.0f} | {peak[mode, c] / logits_mb:.2f} "
                         f"| {t:.2f} |")
    lines.append("")
    for mode in MODES:
        for c in chunks[1:]:
            lines.append(f"- {mode}: chunk {c} peak / unchunked peak = {peak[mode, c] / peak[mode, chunks[0]]:.3f} "
                         f"(goal <= 0.333)")
    command = "python benchmarks/logits_memory.py " + " ".join(sys.argv[1:])
    if args.write:
        common.write_section(f"logits memory, chunked vs unchunked logprobs, vocab {args.vocab:,}", command, lines)
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
