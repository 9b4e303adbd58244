"""What a launch costs before and after its work: a 1-step demo run (`torchrun --nproc-per-node 2 launch/train.py
recipe=demo train.steps=1`, no eval), timed from the command to its exit, for this checkout and for other
checkouts (e.g. a `git worktree` of an older commit), alternating within each round.

    python benchmarks/launch.py --rounds 3                                  # this checkout only
    python benchmarks/launch.py --rounds 3 --other /tmp/oldtree            # this checkout vs another, alternating

Each contender runs with its own tree first on PYTHONPATH and this checkout's interpreter (the same packages). The
step itself is ~0.5 s of the total; the rest is torchrun, imports, the engine's build, the model load and the exit,
which every fresh launch of the test suite pays. Appends a table (medians and every round) to RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, median, write_section


def launch(tree: Path, out: Path) -> float:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(tree / "launch" / "train.py"),
           "recipe=demo", "train.steps=1", f"train.eval_every={10**6}", "data.eval_path=", f"output_dir={out}"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{tree}: the launch failed:\n{proc.stderr[-3000:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--other", type=Path, nargs="*", default=[], help="other checkouts to time beside this one")
    args = ap.parse_args()
    trees = [ROOT, *[p.resolve() for p in args.other]]
    names = [f"{t} ({git_head(t)})" for t in trees]
    times: dict[str, list[float]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="rlcore-launch-") as out:  # the runs' folders, removed at the end
        launch(ROOT, Path(out) / "warm")  # builds the demo's warm start into the cache, if it is not there yet
        for r in range(args.rounds):
            order = list(enumerate(zip(trees, names)))
            for i, (tree, name) in order if r % 2 == 0 else order[::-1]:
                times[name].append(launch(tree, Path(out) / f"{r}-{i}"))
                print(f"round {r}: {name} {times[name][-1]:.2f} s", flush=True)
    base = median(times[names[0]])
    lines = ["| checkout | median s | vs this checkout | each round (s) |", "|---|---:|---:|---|"]
    lines += [f"| {n} | {median(t):.2f} | x{median(t) / base:.3f} | {', '.join(f'{x:.2f}' for x in t)} |"
              for n, t in times.items()]
    write_section("A 1-step demo launch, start to exit, 2 ranks",
                  "python benchmarks/launch.py " + " ".join(sys.argv[1:]), lines)


def git_head(tree: Path) -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    return proc.stdout.strip() or "?"


if __name__ == "__main__":
    main()
