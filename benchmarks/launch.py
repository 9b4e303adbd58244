"""What a launch costs before and after its work: a 1-step demo run (`torchrun --nproc-per-node 2 launch/train.py
recipe=demo train.steps=1`, no eval), timed from the command to its exit, for this checkout and for other
checkouts (e.g. a `git worktree` of an older commit), alternating within each round.

    python benchmarks/launch.py --rounds 3                                  # this checkout only
    python benchmarks/launch.py --rounds 3 --other /tmp/oldtree            # this checkout vs another, alternating
    python benchmarks/launch.py --shared 8 --other /tmp/oldtree             # runs in the test suite's shared launch

Each contender runs with its own tree first on PYTHONPATH and this checkout's interpreter (the same packages). The
step itself is ~0.5 s of the total; the rest is torchrun, imports, the engine's build, the model load and the exit,
which every fresh launch of the test suite pays. Appends a table (medians and every round) to RESULTS.md.

--shared N times instead what a run costs in the test suite's shared launch (tests/workers/run_server.py, one job
per checkout, both alive): N runs of a 2-step demo (no eval) each, the checkouts' runs alternating, from request to
every rank's result; each job's first run (its start) is left out of the medians.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
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


class SharedJob:
    """One checkout's shared launch (2 ranks): runs sent as request files, as tests/conftest.py's RunServer does."""

    def __init__(self, tree: Path, folder: Path):
        self.tree, self.folder, self.n = tree, folder, 0
        folder.mkdir(parents=True)
        env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(tree)}
        self.log = open(folder / "torchrun.txt", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                      "--nproc-per-node=2", str(tree / "tests" / "workers" / "run_server.py"),
                                      str(folder)], cwd=tree, env=env, stdout=self.log, stderr=self.log)

    def run(self, out: Path) -> float:
        n, self.n = self.n, self.n + 1
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        argv = ["recipe=demo", "train.steps=2", f"train.eval_every={10**6}", "data.eval_path=", f"output_dir={out}"]
        t0 = time.perf_counter()
        (self.folder / f"req-{n}.tmp").write_text(json.dumps({"argv": argv, "port": port}))
        (self.folder / f"req-{n}.tmp").rename(self.folder / f"req-{n}.json")
        for rank in range(2):
            res = self.folder / f"res-{n}-rank{rank}.json"
            while not res.exists():
                if self.proc.poll() is not None:
                    raise SystemExit(f"{self.tree}: the shared launch ended; see {self.folder / 'torchrun.txt'}")
                time.sleep(0.01)
            if json.loads(res.read_text())["code"]:
                raise SystemExit(f"{self.tree}: run {n} failed: {self.folder / f'err-{n}-rank{rank}.txt'}")
        return time.perf_counter() - t0

    def quit(self) -> None:
        (self.folder / f"req-{self.n}.json").write_text(json.dumps({"quit": True}))
        self.proc.wait(timeout=120)
        self.log.close()


def shared(trees: list[Path], names: list[str], runs: int, out: Path) -> dict[str, list[float]]:
    jobs = [SharedJob(t, out / f"job-{i}") for i, t in enumerate(trees)]
    times: dict[str, list[float]] = {n: [] for n in names}
    try:
        for r in range(runs + 1):  # run 0: each job's start
            order = list(enumerate(names))
            for i, name in order if r % 2 == 0 else order[::-1]:
                took = jobs[i].run(out / f"run-{r}-{i}")
                if r:
                    times[name].append(took)
                print(f"run {r}: {name} {took:.2f} s{' (the job starts)' if not r else ''}", flush=True)
    finally:
        for job in jobs:
            job.quit()
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--other", type=Path, nargs="*", default=[], help="other checkouts to time beside this one")
    ap.add_argument("--shared", type=int, default=0, metavar="N",
                    help="time N runs each in the test suite's shared launch instead of fresh launches")
    args = ap.parse_args()
    trees = [ROOT, *[p.resolve() for p in args.other]]
    names = [f"{t} ({git_head(t)})" for t in trees]
    times: dict[str, list[float]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="rlcore-launch-") as out:  # the runs' folders, removed at the end
        launch(ROOT, Path(out) / "warm")  # builds the demo's warm start into the cache, if it is not there yet
        if args.shared:
            times = shared(trees, names, args.shared, Path(out))
        for r in range(0 if args.shared else args.rounds):
            order = list(enumerate(zip(trees, names)))
            for i, (tree, name) in order if r % 2 == 0 else order[::-1]:
                times[name].append(launch(tree, Path(out) / f"{r}-{i}"))
                print(f"round {r}: {name} {times[name][-1]:.2f} s", flush=True)
    base = median(times[names[0]])
    each = "each run (s)" if args.shared else "each round (s)"
    lines = [f"| checkout | median s | vs this checkout | {each} |", "|---|---:|---:|---|"]
    lines += [f"| {n} | {median(t):.2f} | x{median(t) / base:.3f} | {', '.join(f'{x:.2f}' for x in t)} |"
              for n, t in times.items()]
    title = ("A 2-step demo run in the test suite's shared launch, request to result, 2 ranks" if args.shared
             else "A 1-step demo launch, start to exit, 2 ranks")
    write_section(title, "python benchmarks/launch.py " + " ".join(sys.argv[1:]), lines)


def git_head(tree: Path) -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    return proc.stdout.strip() or "?"


if __name__ == "__main__":
    main()
