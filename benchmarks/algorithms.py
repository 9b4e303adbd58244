"""The algorithms side by side on the demo task: held-out points after 20 and 60 steps and the step time of
GRPO, GSPO, CISPO and on-policy distillation, from the same warm start, the same seeds, on the same machine.

    python benchmarks/algorithms.py                     # seeds 0 and 1, 60 steps, eval every 10
    python benchmarks/algorithms.py --seeds 0 --steps 20

Each run is a real `torchrun --nproc-per-node 2 launch/train.py recipe=<r> seed=<s>`; the contenders alternate
within each seed. Points are held-out greedy accuracy x 100 (256 prompts); the step time is the median of
time/step_s over steps 2.. (step 1 warms the engine). The curve table is the points per step (eval steps),
distillation beside GRPO. Appends its tables to benchmarks/RESULTS.md with the machine and the command.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, median, write_section

CONTENDERS = {"GRPO": "demo", "GSPO": "gspo_tiny", "CISPO": "cispo_tiny", "distillation": "distill_tiny"}


def run(recipe: str, seed: int, steps: int, every: int, out: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(ROOT / "launch" / "train.py"),
           f"recipe={recipe}", f"seed={seed}", f"train.steps={steps}", f"train.eval_every={every}",
           f"output_dir={out}", f"name={recipe}-{seed}"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"{recipe} seed {seed} failed:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (out / f"{recipe}-{seed}" / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=10)
    args = ap.parse_args()
    rows: dict[str, list[list[dict]]] = {name: [] for name in CONTENDERS}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for name, recipe in CONTENDERS.items():  # alternate the contenders within each seed
                rows[name].append(run(recipe, seed, args.steps, args.every, Path(tmp)))
                print(f"{name} seed {seed} done", flush=True)

    def points(name: str, step: int) -> list[float]:
        return [100 * next(r["eval/accuracy"] for r in run_rows if r["step"] == step) for run_rows in rows[name]]

    marks = sorted({0, min(20, args.steps), args.steps})
    grpo_time = median(r["time/step_s"] for run_rows in rows["GRPO"] for r in run_rows[2:])
    lines = [f"| algorithm (recipe) | {' | '.join(f'points at {m}' for m in marks)} | step s (median) | vs GRPO |",
             "|---|" + "---|" * (len(marks) + 2)]
    for name, recipe in CONTENDERS.items():
        step_s = median(r["time/step_s"] for run_rows in rows[name] for r in run_rows[2:])
        cells = [" / ".join(f"{p:.1f}" for p in points(name, m)) for m in marks]
        lines.append(f"| {name} (`{recipe}`) | {' | '.join(cells)} | {step_s:.3f} | {step_s / grpo_time:.2f}x |")
    lines += ["", f"Points: held-out greedy accuracy x 100 per seed ({', '.join(map(str, args.seeds))}).", "",
              "Points per step, distillation vs GRPO (mean over the seeds):", "",
              "| step | " + " | ".join(CONTENDERS) + " |", "|---|" + "---|" * len(CONTENDERS)]
    for step in range(0, args.steps + 1, args.every):
        means = [sum(points(name, step)) / len(args.seeds) for name in CONTENDERS]
        lines.append(f"| {step} | " + " | ".join(f"{m:.1f}" for m in means) + " |")
    write_section(f"algorithms on the demo task: GRPO, GSPO, CISPO, distillation, {args.steps} steps, 2 ranks",
                  "python benchmarks/algorithms.py " + " ".join(sys.argv[1:]), lines)


if __name__ == "__main__":
    main()
