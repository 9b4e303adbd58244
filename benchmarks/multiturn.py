"""Multi-turn rollout costs, and single-turn GRPO before and after the turn loop, side by side in one run.

    python benchmarks/multiturn.py                                   # demo step time: HEAD vs 0a8f62d
    python benchmarks/multiturn.py --before 0a8f62d --rounds 3 --steps 10 --task recipe=guess \
        --task recipe=calculator

Part 1 runs `recipe=demo` (eval off) from this checkout and from a temporary git worktree of --before,
alternating the two for --rounds rounds, and compares the median step time over steps 3..N of all rounds.
Part 2 runs each --task recipe once and splits the time of one turn into generate and environment
(per step: time/generate_s and time/env_s divided by the turns that ran; medians over steps 3..N).
Prints a report and appends it to benchmarks/RESULTS.md with the machine and the command.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def train(tree: Path, overrides: list[str], steps: int, out: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(tree / "launch" / "train.py"), *overrides, f"train.steps={steps}", "data.eval_path=",
           f"output_dir={out}", "name=bench"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(tree)}
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(overrides)} in {tree} failed:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (out / "bench" / "metrics.jsonl").read_text().splitlines()][2:]


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="0a8f62d", help="git ref of the single-turn rollout to compare with")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of before / after")
    parser.add_argument("--steps", type=int, default=10, help="steps per run (steps 1-2 are warm-up)")
    parser.add_argument("--task", action="append", default=[], help="a multi-turn recipe's overrides (repeatable)")
    args = parser.parse_args()
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        before_tree = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(before_tree), args.before], cwd=ROOT,
                       check=True)
        try:
            runs = {"before": [], "after": []}
            for r in range(args.rounds):
                for name, tree in (("before", before_tree), ("after", ROOT)):
                    runs[name] += train(tree, ["recipe=demo"], args.steps, Path(tmp) / f"{name}{r}")
                    print(f"round {r + 1} {name}: median step {median(runs[name], 'time/step_s'):.3f} s", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before_tree)], cwd=ROOT)
        lines += ["| single-turn GRPO (`recipe=demo`) | steps | median step s | median generate s | median train s |",
                  "|---|---|---|---|---|"]
        for name, rows in runs.items():
            ref = args.before if name == "before" else "this commit"
            lines.append(f"| {name} ({ref}) | {len(rows)} | {median(rows, 'time/step_s'):.3f} | "
                         f"{median(rows, 'time/generate_s'):.3f} | {median(rows, 'time/train_s'):.3f} |")
        ratio = median(runs["after"], "time/step_s") / median(runs["before"], "time/step_s")
        lines += ["", f"after / before median step time: x{ratio:.3f}", ""]
        if args.task:
            lines += ["| task | turns/trajectory | median generate s per turn | median env s per turn | "
                      "median step s |", "|---|---|---|---|---|"]
        for i, task in enumerate(args.task):
            rows = train(ROOT, task.split(), args.steps, Path(tmp) / f"task{i}")
            per_turn = [(r["time/generate_s"] / n, r["time/env_s"] / n) for r in rows
                        if (n := sum(1 for k in r if k.startswith("env/active_turn") and r[k] > 0))]
            lines.append(f"| `{task}` | {median(rows, 'env/turns_mean'):.2f} | "
                         f"{statistics.median(g for g, _ in per_turn):.3f} | "
                         f"{statistics.median(e for _, e in per_turn):.4f} | {median(rows, 'time/step_s'):.3f} |")
    command = "python benchmarks/multiturn.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report = "\n".join([f"## multi-turn rollouts ({time.strftime('%Y-%m-%d')})", "", f"Machine: {machine()}",
                        f"Command: `{command}`", "", *lines])
    print(report)
    with open(ROOT / "benchmarks" / "RESULTS.md", "a") as f:
        f.write("\n" + report + "\n")


if __name__ == "__main__":
    main()
