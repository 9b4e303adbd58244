"""What per-request seeds cost the engine's sampler: R running requests, each with its own seed vs none.

    python benchmarks/sampler.py --size 10M --requests 64 256 --max-new-tokens 64 --write

rlcore seeds every request (rlcore.rollout.collect.rollout_seed: from the run seed, the step and the prompt), so
a sample is the same whatever else the engine runs beside it: the same run twice, a resume, another number of
engines or TP. vLLM draws the noise of seeded requests one request at a time (v1/sample/ops/topk_topp_sampler.py
`random_sample`: a Python loop of `exponential_(generator=...)` over the requests that carry a generator) and
the rest in one batched call; on CUDA seeded requests also leave FlashInfer's fused sampling path.

One process, world size 1, TP 1, the engine rlcore builds (`rlcore.trainer.setup` from recipe=demo, the model
swapped for a random-init one of --size). For each R: R prompts of the task, n=1, temperature 1, exactly
--max-new-tokens tokens each (ignore_eos), so both contenders decode the same number of steps with R requests
running; `seeded` gives each request its own seed, `engine` none (the engine's generator). After one warm-up
call each, --repeats calls alternate (seeded, engine, seeded, ...); medians, and the time per decode step.
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="10M", help="a common.SIZES name")
    p.add_argument("--requests", type=int, nargs="+", default=[64, 256])
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--write", action="store_true", help="append a section to benchmarks/RESULTS.md")
    args = p.parse_args()

    import torch
    from vllm import SamplingParams

    from rlcore import trainer
    from rlcore.config.cli import load_recipe

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = load_recipe("demo", common.ROOT / "recipes")
    cfg.model.path = str(common.random_model(args.size))
    cfg.data.eval_path = ""
    cfg.rollout.cpu_kv_cache_gb = 2.0  # room for 256 requests of prompt + max_new_tokens
    cfg.rollout.max_new_tokens = args.max_new_tokens  # the engine's max_model_len follows it
    cfg.output_dir, cfg.name = tempfile.mkdtemp(prefix="rlcore-bench-sampler-"), "bench"
    run = trainer.setup(cfg)
    rows = run.rollout.prompts.next_batch()
    llm = run.engine.llm

    def call(requests: int, seeded: bool) -> tuple[float, int]:
        prompts = [{"prompt_token_ids": rows[i % len(rows)]["prompt_ids"]} for i in range(requests)]
        params = [SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=0, max_tokens=args.max_new_tokens,
                                 min_tokens=args.max_new_tokens, ignore_eos=True, logprobs=0,
                                 seed=1000 + i if seeded else None) for i in range(requests)]
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t, sum(len(o.outputs[0].token_ids) for o in outs)

    table = ["| running requests | per-request seeds: median s | engine seed: median s | ratio | "
             "per decode step: seeded ms | engine ms | extra ms per seeded request per step |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for requests in args.requests:
        times = {True: [], False: []}
        tokens = set()
        for seeded in (True, False):
            call(requests, seeded)  # warm-up
        for _ in range(args.repeats):
            for seeded in (True, False):
                dt, n = call(requests, seeded)
                times[seeded].append(dt)
                tokens.add(n)
        assert tokens == {requests * args.max_new_tokens}, tokens  # the same work on both sides
        s, e = common.median(times[True]), common.median(times[False])
        step_s, step_e = s / args.max_new_tokens * 1e3, e / args.max_new_tokens * 1e3
        table.append(f"| {requests} | {s:.3f} | {e:.3f} | {s / e:.2f}x | {step_s:.2f} | {step_e:.2f} | "
                     f"{(step_s - step_e) / requests * 1e3:.1f} us |")
        print(table[-1], flush=True)
    model = f"random-init Qwen2 {args.size} ({common.param_count(Path(cfg.model.path)) / 1e6:.1f}M parameters)"
    lines = [f"Model: {model}, fp32, the vLLM CPU engine rlcore builds (TP 1, world size 1, OMP_NUM_THREADS="
             f"{os.environ.get('OMP_NUM_THREADS', '1')}). R requests of n=1, exactly {args.max_new_tokens} new tokens "
             f"each (ignore_eos), temperature 1; one warm-up call each, then {args.repeats} each alternating; "
             f"medians.", "", *table]
    if args.write:
        common.write_section("Sampler: per-request seeds vs the engine's seed", "OMP_NUM_THREADS="
                             f"{os.environ.get('OMP_NUM_THREADS', '1')} python benchmarks/sampler.py --size {args.size} "
                             f"--requests {' '.join(map(str, args.requests))} --max-new-tokens {args.max_new_tokens}",
                             lines)
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
