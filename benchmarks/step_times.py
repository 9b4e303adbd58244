"""Per-stage step times and throughput of a recipe, for several variants side by side in one run.

    python benchmarks/step_times.py recipe=demo
    python benchmarks/step_times.py recipe=demo --steps 8 --variant rollout.tensor_parallel=1 \
        --variant rollout.tensor_parallel=2
    python benchmarks/step_times.py recipe=demo --variant recipe=demo --variant recipe=ppo_tiny \
        --variant recipe=reinforce_pp_tiny      # algorithms side by side (a variant's recipe= replaces the base)
    make bench

Each variant is a real `torchrun launch/train.py` run of K steps (eval off); the first step is
warm-up and left out of the means. Prints a table and appends it to benchmarks/RESULTS.md with the
machine and the command.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = [  # (header, metric key, format)
    ("step s", "time/step_s", "{:.2f}"), ("generate s", "time/generate_s", "{:.2f}"),
    ("reward s", "time/reward_s", "{:.3f}"), ("logprobs s", "time/logprobs_s", "{:.2f}"),
    ("train s", "time/train_s", "{:.2f}"), ("sync s", "time/sync_s", "{:.3f}"),
    ("generate tok/s", "throughput/generate_tok_s", "{:,.0f}"), ("train tok/s", "throughput/train_tok_s", "{:,.0f}"),
    ("sync GB/s", "sync/gb_s", "{:.3f}"), ("peak mem GB", "memory/peak_gb", "{:.2f}"),
]


def run_variant(args, overrides: list[str], out_dir: Path) -> dict[str, float]:
    base = [o for o in args.overrides if not (o.startswith("recipe=") and any(v.startswith("recipe=") for v in overrides))]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           str(ROOT / "launch" / "train.py"), *base, *overrides, f"train.steps={args.steps}",
           "data.eval_path=", f"output_dir={out_dir}", "name=bench"]
    env = os.environ | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"benchmark variant {overrides} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(l) for l in (out_dir / "bench" / "metrics.jsonl").read_text().splitlines()][1:]
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0] if k != "step"}
    mean["sync/gb_s"] = mean["sync/gb"] / max(mean["time/sync_s"], 1e-9)
    return mean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="+", help="recipe=NAME and key=value overrides")
    parser.add_argument("--steps", type=int, default=6, help="steps per variant (first is warm-up)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks per run")
    parser.add_argument("--variant", action="append", default=[],
                        help="space-separated overrides of one variant (repeatable)")
    args = parser.parse_args()
    variants = args.variant or ["rollout.tensor_parallel=1", "rollout.tensor_parallel=2"]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, v in enumerate(variants):
            t0 = time.time()
            results[v] = run_variant(args, v.split(), Path(tmp) / str(i))
            print(f"{v}: done in {time.time() - t0:.0f} s", flush=True)

    header = "| variant | " + " | ".join(h for h, _, _ in COLUMNS) + " |"
    lines = [header, "|" + "---|" * (len(COLUMNS) + 1)]
    for v, m in results.items():
        lines.append(f"| {v} | " + " | ".join(f.format(m[k]) for _, k, f in COLUMNS) + " |")
    base = next(iter(results))
    ratios = [f"- {v} vs {base}: step time x{m['time/step_s'] / results[base]['time/step_s']:.2f}, "
              f"generate tok/s x{m['throughput/generate_tok_s'] / results[base]['throughput/generate_tok_s']:.2f}"
              for v, m in list(results.items())[1:]]
    command = "python benchmarks/step_times.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    machine = f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"
    try:
        import torch
        if torch.cuda.is_available():
            machine += f", {torch.cuda.device_count()} x {torch.cuda.get_device_name()}"
    except ImportError:
        pass
    report = "\n".join([f"## step times: {' '.join(args.overrides)}, {args.nproc} ranks, "
                        f"{args.steps - 1} measured steps ({time.strftime('%Y-%m-%d')})", "",
                        f"Machine: {machine}", f"Command: `{command}`", "", *lines, "", *ratios, ""])
    print(report)
    with open(ROOT / "benchmarks" / "RESULTS.md", "a") as f:
        f.write("\n" + report)


if __name__ == "__main__":
    main()
