"""Padded vs packed micro-batches: train tokens/s and peak memory of the real update (rlcore.train.update.update).

    python benchmarks/packing.py                       # 3M model, padded (8 rows) vs packed (4096 tokens)
    python benchmarks/packing.py --size 25M --rounds 2 --budgets 0,4096,4096:onerow --write

One process per measurement, world size 1 (a gloo group of one, no torchrun, no FSDP): the batch is
`--sequences` rows of a ~16-token prompt (12..20) and a response of uniform 8..512 tokens (seed 0), so the
rows are padded to the longest (~530) while the mean is ~280. Each process loads the model, runs one
warm-up update, then `--repeats` timed updates (GRPO, on-policy: one forward+backward over every
micro-batch and one AdamW step); the contenders alternate, A B A B, for `--rounds` rounds.
Budget 0 is the padded path (`--micro-batch-size` rows per micro-batch); any other budget is
train.max_tokens_per_micro_batch. train tok/s = real (non-pad) tokens / seconds of update.update.
Peak memory = the process's VmHWM minus its RSS after loading the model and batch (before any update).
`--profile` prints torch.profiler's top operators of one update per contender instead.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def make_batch(sequences: int, vocab: int, seed: int = 0):
    import torch

    from rlcore.batch import Batch
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(12, 21, (sequences,), generator=g)
    response = torch.randint(8, 513, (sequences,), generator=g)
    lengths = prompt + response
    L = int(lengths.max())
    attention_mask = (torch.arange(L)[None] < lengths[:, None]).long()
    input_ids = torch.randint(3, vocab, (sequences, L), generator=g) * attention_mask
    t = torch.arange(L - 1)[None]
    loss_mask = ((t >= prompt[:, None] - 1) & (t < lengths[:, None] - 1)).float()  # scores response tokens
    batch = Batch(input_ids, attention_mask, loss_mask, rollout_logprobs=torch.zeros(sequences, L - 1),
                  rewards=torch.zeros(sequences), group_size=8, max_model_tokens=512)
    batch.advantages = torch.randn(sequences, L - 1, generator=g) * loss_mask
    return batch


def worker(args) -> None:
    """One contender in this process: warm-up, then timed updates; prints one JSON line."""
    import torch

    from rlcore.algorithms.grpo import GRPO
    from rlcore.config import ModelConfig, OptimConfig, RolloutConfig, TrainConfig, Config
    from rlcore.distributed.parallel import init_distributed
    from rlcore.models import build as models
    from rlcore.run import Trainer
    from rlcore.train import forward, update

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.one_row:  # the packing before split rows: every micro-batch one long packed row
        from rlcore.train import packing
        whole = packing.pack
        packing.pack = lambda input_ids, attention_mask, split=False: whole(input_ids, attention_mask)
    init_distributed()  # world size 1, gloo: update.py's collectives need a group
    path = common.random_model(args.size)
    mcfg = ModelConfig(path=str(path))
    policy = models.load_causal_lm(mcfg)
    optimizer, scheduler = models.build_optimizer(policy, OptimConfig(lr=1e-6, schedule="constant"), 100)
    cfg = Config(model=mcfg, algorithm=GRPO(loss_agg="token-mean"), rollout=RolloutConfig(temperature=1.0),
                 train=TrainConfig(micro_batch_size=args.micro_batch_size, max_tokens_per_micro_batch=args.budget))
    run = SimpleNamespace(cfg=cfg, trainer=Trainer(policy, optimizer, scheduler))
    template = make_batch(args.sequences, policy.config.vocab_size)
    real = int(template.attention_mask.sum())
    base_kb = status_kb("VmRSS")

    def one():
        batch = template.rows(0, len(template))
        batch.old_logprobs = None  # on-policy: the update's own forward fills them (the trainer's default)
        t = time.perf_counter()
        update.update(run, batch)
        return time.perf_counter() - t

    one()  # warm-up
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            one()
        print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=14,
                                                                  max_name_column_width=40, max_shapes_column_width=60))
        return
    times = [one() for _ in range(args.repeats)]
    mbs = forward.micro_batches(run, template)
    print(json.dumps({"budget": args.budget, "times": times, "real_tokens": real, "vocab": policy.config.vocab_size,
                      "padded_tokens": int(template.attention_mask.numel()), "micro_batches": len(mbs),
                      "peak_mb": (status_kb("VmHWM") - base_kb) / 1024, "base_mb": base_kb / 1024}), flush=True)


def name(budget: str, mbs: int) -> str:
    tokens, _, how = budget.partition(":")
    if tokens == "0":
        return f"padded, micro_batch_size={mbs}"
    return f"packed, max_tokens_per_micro_batch={tokens}" + (", one row per micro-batch" if how == "onerow" else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="3M", choices=list(common.SIZES))
    p.add_argument("--sequences", type=int, default=32)
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--budgets", default="0,4096", help="comma-separated; 0 = padded micro-batches; "
                   "BUDGET:onerow = packed into one long row per micro-batch (rlcore.train.packing.pack split=False)")
    p.add_argument("--rounds", type=int, default=3, help="A B A B rounds, one process per contender per round")
    p.add_argument("--repeats", type=int, default=2, help="timed updates per process (after one warm-up)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--write", action="store_true", help="append a section to benchmarks/RESULTS.md")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--budget", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--one-row", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    budgets = args.budgets.split(",")
    common.random_model(args.size)  # build the cached model once, outside the timings
    env = os.environ | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                        "PYTHONPATH": str(common.ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    results: dict[str, list[dict]] = {b: [] for b in budgets}
    for r in range(1 if args.profile else args.rounds):
        for b in budgets:
            cmd = [sys.executable, __file__, "--worker", "--budget", b.partition(":")[0], "--size", args.size,
                   "--sequences", str(args.sequences), "--micro-batch-size", str(args.micro_batch_size),
                   "--repeats", str(args.repeats)] + (["--profile"] if args.profile else []) + \
                (["--one-row"] if b.endswith(":onerow") else [])
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"worker {b} failed:\n{proc.stderr[-3000:]}")
            if args.profile:
                print(f"=== {name(b, args.micro_batch_size)}\n{proc.stdout}", flush=True)
                continue
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            results[b].append(res)
            print(f"round {r} {name(b, args.micro_batch_size)}: {[round(t, 2) for t in res['times']]} s, "
                  f"peak +{res['peak_mb']:.0f} MB", flush=True)
    if args.profile:
        return
    first = results[budgets[0]][0]
    params = common.param_count(common.random_model(args.size))
    lines = [f"Model: random-init Qwen2 {args.size} ({params / 1e6:.1f}M parameters, vocab "
             f"{first.get('vocab', 'tiny')}), fp32, sdpa, world size 1 (no FSDP). Batch: {args.sequences} sequences, "
             f"prompt 12..20 + response 8..512 tokens (seed 0): {first['real_tokens']:,} real tokens, "
             f"{first['padded_tokens']:,} padded ({first['real_tokens'] / first['padded_tokens']:.0%} real). "
             f"{args.rounds} rounds of the contenders in turn (A B C A B C ...), one process each, 1 warm-up + {args.repeats} timed "
             f"`update.update` calls per process (GRPO, on-policy: forward+backward of every micro-batch + 1 "
             f"AdamW step); medians over the {args.rounds * args.repeats} timed calls.", "",
             "| contender | micro-batches | median update s | train tok/s (real) | peak memory MB (VmHWM - RSS before) |",
             "|---|---|---|---|---|"]
    rate = {}
    for b in budgets:
        times = [t for res in results[b] for t in res["times"]]
        med = common.median(times)
        rate[b] = first["real_tokens"] / med
        peak = common.median(res["peak_mb"] for res in results[b])
        lines.append(f"| {name(b, args.micro_batch_size)} | {results[b][0]['micro_batches']} | {med:.2f} | "
                     f"{rate[b]:,.0f} | {peak:,.0f} |")
    lines.append("")
    for b in budgets[1:]:
        lines.append(f"- {name(b, args.micro_batch_size)} vs {name(budgets[0], args.micro_batch_size)}: "
                     f"train tok/s x{rate[b] / rate[budgets[0]]:.2f}")
    command = "python benchmarks/packing.py " + " ".join(sys.argv[1:])
    if args.write:
        common.write_section(f"packed vs padded micro-batches, {args.size}", command, lines)
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
