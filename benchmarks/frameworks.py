"""Every framework agent of tests/framework_agents.py in every mode: a real run of a few steps each, too slow for
the suite (tests/test_agents.py runs five of the fifteen). Reported per run: its exit code, the steps logged, the
failed agents and the calls per trajectory of each step, whether each step's update was applied, and its seconds.

    python benchmarks/frameworks.py                  # 5 agents x 3 modes, 3 steps each (~12 minutes on 2 cores)
    python benchmarks/frameworks.py --agents smolagents_tools --modes stream

Modes: colocated (2 ranks), split (1 engine rank + 1 trainer), streaming (2 engine ranks + 1 trainer, k=1).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

AGENTS = ["agents_chat", "agents_responses", "langchain_ainvoke", "langchain_astream", "smolagents_tools"]
MODES = {"colocated": (2, []), "split": (2, ["rollout.ranks=1"]),
         "stream": (3, ["rollout.ranks=2", "rollout.stream=true", "rollout.max_staleness=1", "algorithm.tis_cap=2"])}


def run(agent: str, mode: str, steps: int, out: Path) -> str:
    nproc, overrides = MODES[mode]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(common.ROOT / "launch" / "train.py"), "recipe=tests/framework_agents.py", f"train.steps={steps}",
           "data.eval_path=", *overrides, f"output_dir={out}"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(common.ROOT), "AGENT": agent}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=common.ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    rows = [json.loads(line) for f in out.glob("*/metrics.jsonl") for line in f.read_text().splitlines()]
    rows = [r for r in rows if r.get("step", 0) >= 1]
    line = (f"| {agent} | {mode} | {proc.returncode} | {len(rows)} | {[r.get('agent/failed') for r in rows]} | "
            f"{[round(r.get('agent/calls_mean', 0), 2) for r in rows]} | "
            f"{[r.get('optim/steps_applied') for r in rows]} | {seconds:.0f} |")
    print(line, flush=True)
    if proc.returncode:
        print(proc.stderr[-2000:], flush=True)
    return line


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", default=",".join(AGENTS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    lines = ["| agent | mode | exit | steps | failed agents a step | calls a trajectory | update applied | s |",
             "|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for agent in args.agents.split(","):
            for mode in args.modes.split(","):
                lines.append(run(agent, mode, args.steps, Path(tmp) / f"{agent}-{mode}"))
    failed = sum(1 for line in lines[2:] if line.split(" | ")[2] != "0")
    lines += ["", f"{len(lines) - 2} runs, {failed} with a non-zero exit."]
    command = "python benchmarks/frameworks.py" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else "")
    common.write_section("Framework agents in every mode (benchmarks/frameworks.py)", command, lines)


if __name__ == "__main__":
    main()
