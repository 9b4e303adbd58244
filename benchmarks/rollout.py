"""Rollout inside rlcore (rlcore.rollout.collect.collect, as the trainer calls it) vs the bare vLLM engine.

    python benchmarks/rollout.py                         # the demo model and settings
    python benchmarks/rollout.py --size 25M --max-new-tokens 64 --write

One process, world size 1 (a gloo group of one, no torchrun), TP 1: `rlcore.trainer.setup` builds the run
from recipe=demo (its engine, tokenizer, reward function, prompt stream). The prompts are drawn once and
served to every call, and every call is step 1, so both contenders sample the same 32 prompts x 8 samples
with the same seeds:
  bare    run.engine.llm.generate(...) with SamplingParams built here by hand as rlcore builds them
          (n=8, temperature 1, top_p 1, top_k 0, logprobs 0, max_tokens, seed per prompt), nothing else
  rlcore  collect(run, step): trajectories, the engine, Samples, rewards, the padded Batch
After `--warmup` calls of each, `--repeats` calls each alternate (bare, rlcore, bare, ...); medians.
`--profile` runs cProfile over rlcore's calls instead and prints where its time goes.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402


class FixedPrompts:
    """A PromptStream stand-in that serves the same rows at every step."""
    def __init__(self, rows):
        self.rows = rows

    def next_batch(self):
        return self.rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="demo", help="demo (rlcore.tasks.tiny's model) or a common.SIZES name")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--write", action="store_true", help="append a section to benchmarks/RESULTS.md")
    args = p.parse_args()

    import torch
    from vllm import SamplingParams

    from rlcore import trainer
    from rlcore.config.cli import load_recipe
    from rlcore.rollout.collect import collect, rollout_seed

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = load_recipe("demo", common.ROOT / "recipes")
    if args.size != "demo":
        cfg.model.path = str(common.random_model(args.size))
    cfg.rollout.max_new_tokens = args.max_new_tokens
    cfg.data.eval_path = ""
    cfg.output_dir, cfg.name = tempfile.mkdtemp(prefix="rlcore-bench-rollout-"), "bench"
    run = trainer.setup(cfg)
    rows = run.rollout.prompts.next_batch()
    run.rollout.prompts = FixedPrompts(rows)
    G, step = cfg.rollout.group_size, 1
    prompts = [{"prompt_token_ids": row["prompt_ids"]} for row in rows]
    seeds = [rollout_seed(cfg.seed, step, i, G) for i in range(len(rows))]
    params = [SamplingParams(n=G, temperature=cfg.rollout.temperature, top_p=1.0, top_k=0,
                             max_tokens=cfg.rollout.max_new_tokens, logprobs=0, seed=s) for s in seeds]

    def bare():
        t = time.perf_counter()
        outs = run.engine.llm.generate(prompts, params, use_tqdm=False)
        dt = time.perf_counter() - t
        return dt, sum(len(c.token_ids) for o in outs for c in o.outputs), dt, 0.0

    def ours():
        t = time.perf_counter()
        batch, stats = collect(run, step)
        dt = time.perf_counter() - t
        return dt, int(stats["tokens/generated"]), stats["time/generate_s"], stats["time/reward_s"]

    contenders = {"bare vllm.LLM.generate": bare, "rlcore collect()": ours}
    for _ in range(args.warmup):
        for f in contenders.values():
            f()
    if args.profile:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.repeats):
            ours()
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
        return
    results = {k: [] for k in contenders}
    for _ in range(args.repeats):
        for k, f in contenders.items():
            results[k].append(f())
    tokens = {k: {r[1] for r in v} for k, v in results.items()}
    print(tokens, flush=True)
    model = "the demo model (rlcore.tasks.tiny, 0.3M parameters)" if args.size == "demo" else \
        f"random-init Qwen2 {args.size} ({common.param_count(Path(cfg.model.path)) / 1e6:.1f}M parameters)"
    lines = [f"Model: {model}, fp32, vLLM CPU engine (enforce_eager), TP 1, world size 1. {len(rows)} prompts x {G} "
             f"samples, max {cfg.rollout.max_new_tokens} new tokens, temperature {cfg.rollout.temperature}, the same "
             f"seeds and prompts every call (generated tokens per call: "
             + ", ".join(f"{k} {sorted(v)}" for k, v in tokens.items())
             + f"). {args.warmup} warm-up calls each, then {args.repeats} each alternating; medians.", "",
             "| contender | median s | generated tok/s | of which turn loop s | of which reward s |",
             "|---|---|---|---|---|"]
    med = {}
    for k, v in results.items():
        med[k] = common.median(r[0] for r in v)
        lines.append(f"| {k} | {med[k]:.3f} | {common.median(r[1] for r in v) / med[k]:,.0f} | "
                     f"{common.median(r[2] for r in v):.3f} | {common.median(r[3] for r in v):.4f} |")
    a, b = contenders
    lines += ["", f"- {b} / {a} median time: x{med[b] / med[a]:.3f} (goal <= x1.10)",
              "- turn loop s: rlcore's own timer around its engine calls (time/generate_s: requests, "
              "engine.generate, Samples); reward s: time/reward_s (the reward function); the rest of collect() "
              "is trajectories, to_batch, collectives and metrics"]
    command = "python benchmarks/rollout.py " + " ".join(sys.argv[1:])
    if args.write:
        common.write_section(f"rollout: rlcore vs bare engine, {args.size} model, {cfg.rollout.max_new_tokens} "
                             f"new tokens", command, lines)
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
