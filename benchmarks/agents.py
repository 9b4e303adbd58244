"""Continuous vs lockstep multi-turn rollouts (rollout.schedule) on tools whose latency spans 10x.

    python benchmarks/agents.py                                   # 3M model, 1 rank, 16 trajectories x 4 turns
    python benchmarks/agents.py --nproc 2 --tp 2 --rounds 5       # one TP=2 engine over two ranks

Relaunches itself under torchrun; one engine serves every round. Each trajectory (--prompts x --group) runs
exactly --turns model turns of --tokens tokens (a random-init model, no stop token); after each turn a tool
sleeps a seeded, log-uniform time in [--latency-min, --latency-max] (the same draw for a (trajectory, turn)
in both schedules), then answers two tokens. A second workload with no latency shows the schedule's own
overhead. Rounds alternate lockstep / continuous; reported are medians of the rollout's wall time, the
engine's idle fraction (time with no live request while trajectories wait on tools; in lockstep, the time
spent in tool calls) and tool calls per second, plus how many trajectories came out token-identical.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


class SlowTool:
    """A tool with a seeded latency per (trajectory, turn); answers "+-" and ends after `turns` turns."""
    turns, low, high = 4, 0.02, 0.2
    max_turns = 64  # the rollout's max_turns is the real limit

    def __init__(self, row):
        self.key, self.turn = row["key"], 0

    def step(self, action, action_ids):
        if self.high > 0:
            u = random.Random(self.key * 1000 + self.turn).random()
            time.sleep(self.low * (self.high / self.low) ** u)
        self.turn += 1
        return "+-", 0.0, self.turn == self.turns


def worker(args) -> None:
    import torch.distributed as dist
    from transformers import AutoTokenizer

    from rlcore.config import Config, ModelConfig, RolloutConfig
    from rlcore.distributed.parallel import ParallelDims, build_meshes, init_distributed
    from rlcore.engine import RolloutEngine
    from rlcore.rollout import continuous
    from rlcore.rollout.envs import make_envs
    from rlcore.rollout.turns import Trajectory, rollout

    init_distributed()
    if args.steps_while_calling:
        continuous.STEPS_WHILE_CALLING = args.steps_while_calling
    path = common.random_model(args.size, max_positions=256)
    total = args.turns * (args.tokens + 2)
    cfg = Config(model=ModelConfig(path=str(path)), rollout=RolloutConfig(
        tensor_parallel=args.tp, cpu_kv_cache_gb=0.25, max_new_tokens=args.tokens, max_total_tokens=total,
        max_turns=args.turns, env=SlowTool, env_workers=args.prompts * args.group))
    _, rollout_mesh = build_meshes(ParallelDims(dist.get_world_size(), args.tp))
    tp_rank, tp_group = rollout_mesh.get_local_rank("tp"), rollout_mesh.get_group("tp")
    engine = RolloutEngine(cfg, max_model_len=total + 16)
    tokenizer = AutoTokenizer.from_pretrained(path)
    envs = make_envs(cfg, tokenizer, {"key": 0}, vocab_size=common.model_shape(args.size).vocab_size)
    G, share = args.group, args.prompts // args.tp
    prompts = [tokenizer(f"{i}+{i * 7 % 100}=").input_ids for i in range(args.prompts)]

    def run(schedule: str, latency: tuple[float, float]):
        SlowTool.turns, (SlowTool.low, SlowTool.high) = args.turns, latency
        trajs = [Trajectory(p, {"key": i * G + j}, seed=1000 * i + j, owner=i // share)
                 for i, p in enumerate(prompts) for j in range(G)]
        dist.barrier()
        t0 = time.perf_counter()
        if schedule == "lockstep":
            stats = rollout(engine, trajs, envs, args.tokens, total, G, 1.0, tp_rank, tp_group)
            idle, ticks, agree_s = stats.env_s, args.turns, 0.0
        else:
            stats = continuous.rollout(engine, trajs, envs, args.tokens, total, 1.0, tp_rank, tp_group)
            idle, ticks, agree_s = stats.idle_s, stats.ticks, stats.sync_s
        seconds = time.perf_counter() - t0
        calls = sum(len(x.turns) for x in trajs)  # every turn's tool call (the group's, stepped by owners)
        return {"s": seconds, "idle": idle / seconds, "calls_s": calls / seconds, "tokens": [x.tokens for x in trajs],
                "ticks": ticks, "agree_s": agree_s, "generate_s": stats.generate_s}

    workloads = {"10x": (args.latency_min, args.latency_max), "none": (0.0, 0.0)}
    results = {w: {"lockstep": [], "continuous": []} for w in workloads}
    run("lockstep", (0.0, 0.0)), run("continuous", (0.0, 0.0))  # warm-up: the engine's first steps are slow
    for _ in range(args.rounds):
        for w, latency in workloads.items():
            for schedule in ("lockstep", "continuous"):
                results[w][schedule].append(run(schedule, latency))
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="3M", choices=list(common.SIZES))
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=8, help="tokens per model turn")
    parser.add_argument("--latency-min", type=float, default=0.02, help="seconds")
    parser.add_argument("--latency-max", type=float, default=0.2, help="seconds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--steps-while-calling", type=int, default=0,
                        help="engine steps per TP agreement while a tool call runs (default: the module's)")
    parser.add_argument("--out", default="")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    common.random_model(args.size, max_positions=256)  # built outside the timed ranks
    out = Path(args.out or f"/tmp/rlcore-agents-bench-{os.getpid()}.json")
    passed = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("out", "worker", "nproc")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           __file__, "--worker", "--out", str(out), *passed]
    env = os.environ | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run(cmd, cwd=common.ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"agents benchmark failed:\n{proc.stderr[-3000:]}")
    results = json.loads(out.read_text())
    lines = ["| tool latency | schedule | median rollout s | engine s | engine idle frac | tool calls/s | speed-up "
             "| loop ticks | s agreeing (TP) | trajectories token-identical to lockstep |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for w, by in results.items():
        base = common.median(r["s"] for r in by["lockstep"])
        for schedule, runs in by.items():
            med = common.median(r["s"] for r in runs)
            same = [sum(a == b for a, b in zip(r["tokens"], lock["tokens"])) for r, lock in zip(runs, by["lockstep"])]
            label = (f"{args.latency_min * 1e3:.0f}-{args.latency_max * 1e3:.0f} ms, log-uniform" if w == "10x"
                     else "none")
            lines.append(f"| {label} | {schedule} | {med:.3f} | {common.median(r['generate_s'] for r in runs):.3f} | "
                         f"{common.median(r['idle'] for r in runs):.2f} | "
                         f"{common.median(r['calls_s'] for r in runs):.0f} | x{base / med:.2f} | "
                         f"{common.median(r['ticks'] for r in runs):.0f} | "
                         f"{common.median(r['agree_s'] for r in runs):.3f} | {min(same)}/{len(runs[0]['tokens'])} |")
    command = "python benchmarks/agents.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    common.write_section(f"agent rollouts: continuous vs lockstep, {args.size}, {args.prompts}x{args.group} "
                         f"trajectories x {args.turns} turns x {args.tokens} tokens, {args.nproc} ranks, TP={args.tp}, "
                         f"medians of {args.rounds} alternating rounds", command, lines)


if __name__ == "__main__":
    main()
