"""Colocated vs split (batch) vs streaming on a long-tailed workload: samples/s, occupancy, each side's idle share.

    flock /tmp/rlcore-heavy.lock python benchmarks/async_rl.py --rounds 3          # long tail, 2 ranks, pinned
    flock /tmp/rlcore-heavy.lock python benchmarks/async_rl.py --workload agent --rounds 3
    flock /tmp/rlcore-heavy.lock python benchmarks/async_rl.py --workload single    # single-turn long tail
    flock /tmp/rlcore-heavy.lock python benchmarks/async_rl.py --recipe tooladd --steps 12   # a recipe as it is
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=benchmarks/async_rl.py \
        rollout.ranks=1 rollout.stream=true rollout.max_staleness=1 algorithm.tis_cap=2   # the recipe alone

The workload (this file is also its recipe, `config()`): GRPO on a random-init 3M Qwen2 whose EOS cannot be
sampled (benchmarks/scaling.py no_eos_model), so a trajectory's length is set by the environment alone:
LengthEnv lets each prompt run its row's `turns` model turns of rollout.max_new_tokens tokens, answering one
token after each. Every step draws the same 8 prompts (the data file has exactly 8; the shuffle changes their
order) with targets TARGETS (1 to 24 turns, 34 in all): response lengths span 24x inside every batch, and a
batch's engine runs nearly all of its steps for the last few trajectories, the long tail of reasoning
rollouts. The reward is the share of digits in the transcript (digit_share), so advantages are non-zero and
the weights move. `agent`: the same with a tool that sleeps a seeded, log-uniform 20-200 ms after every turn
(benchmarks/agents.py's slow tool): generation time that is tool waiting, not compute. `single`: single-turn,
the random 3M model with its EOS (about 1 in 32 tokens: lengths geometric, 1 to --tokens), no environment.

Contenders (CONTENDERS), on the same ranks (--nproc, default 2): colocated (rollout.ranks=0: both ranks
generate and train), split k=0 / k=1 (rollout.ranks=1: rank 0 generates whole batches, rank 1 trains; k=1
samples one version behind, decoupled-PPO correction algorithm.tis_cap=2), streaming k=1 / k=2 (rollout.stream:
rank 0's engine keeps rollout.max_running = one batch of trajectories in flight and loads versions under them, at
deterministic points; "free": rollout.free_loads, each version the moment it arrives; "continuous": tool answers
join as they arrive).
Rounds alternate the contenders; with --pin (default) each rank is pinned to one core. What is measured per
step and how: benchmarks/async_runner.py.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS = (1, 1, 1, 1, 1, 2, 3, 24)  # model turns per prompt: every step's batch holds all eight
SPLIT = ["rollout.ranks=1", "algorithm.tis_cap=2"]
CONTENDERS = {
    "colocated": ["rollout.ranks=0"],
    "split k=0": ["rollout.ranks=1", "rollout.max_staleness=0"],
    "split k=1": [*SPLIT, "rollout.max_staleness=1"],
    "stream k=1": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=1"],
    "stream k=2": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2"],
    # Half a batch in flight at most: the latency chain of the 24-turn group then fills the engine at k=2.
    "stream k=2 r32": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=32"],
    # Two groups in flight at most: the 24-turn group's chain no longer bounds the engine, its slots do (a GPU
    # batch's shape: a batch's tokens many times the slots x the longest trajectory / (k + 1)).
    "stream k=2 r16": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=16"],
    # ... with the answers (instant here) joining 1 engine step after a turn instead of 2: fewer idle slots.
    "stream k=2 r16 j1": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=16",
                          "rollout.join_steps=1"],
    # ... with a fixed lag of 180 engine steps: 1.25 x the trainers' step at this workload's mean engine step
    "stream k=2 r16 j1 L180": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=16",
                               "rollout.join_steps=1", "rollout.load_lag_steps=180"],
    # ... with auto's lag 1.1 or 1.05 x the trainers' measured step instead of 1.25 (rollout.load_lag_margin), and
    # with free loads: where a batch's engine work outlasts the trainers' step but not the lag, a longer lag drains
    # the engine before each load
    "stream k=2 r16 m1.1": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=16",
                            "rollout.load_lag_margin=1.1"],
    "stream k=2 r16 m1.05": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=16",
                             "rollout.load_lag_margin=1.05"],
    # ... without the shorter lag once admission or the next hand-over waits for the version
    # (rollout.load_lag_margin_blocked at the margin: the rule before it was a setting), or with it at 1.05 or 1.0
    "stream k=2 r16 b1.25": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=16",
                             "rollout.load_lag_margin_blocked=1.25"],
    "stream k=2 r16 b1.05": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=16",
                             "rollout.load_lag_margin_blocked=1.05"],
    "stream k=2 r16 b1.0": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=16",
                            "rollout.load_lag_margin_blocked=1.0"],
    "stream k=2 r16 free": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=16",
                            "rollout.free_loads=true"],
    # ... with the trainers waiting for each load before they take the next batch (rollout.early_handover=false: the
    # protocol before the early hand-over; the same load points and numbers)
    "stream k=2 r16 late": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=16",
                            "rollout.early_handover=false"],
    # ... with 4 or 8 trajectories admitted beyond the 16 while some wait for their tool (rollout.max_waiting): the
    # engine still runs 16 at most, and the slots a tool's wait held run the next trajectories' turns
    "stream k=2 r16 w4": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=16",
                          "rollout.max_waiting=4"],
    "stream k=2 r16 w8": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=16",
                          "rollout.max_waiting=8"],
    "stream k=2 r16 w8 free": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=16",
                               "rollout.max_waiting=8", "rollout.free_loads=true"],
    # ... with the answers joining 8 or 16 engine steps after a turn (the tool's 20-200 ms hidden behind more
    # decoding: fewer waits for a late one) and as many more admitted, to run while they wait
    "stream k=2 r16 j8 w8": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=16",
                             "rollout.join_steps=8", "rollout.max_waiting=8"],
    "stream k=2 r16 j8 w16": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=16",
                              "rollout.join_steps=8", "rollout.max_waiting=16"],
    "stream k=2 r16 j8 w8 free": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=16",
                                  "rollout.join_steps=8", "rollout.max_waiting=8", "rollout.free_loads=true"],
    "stream k=2 r16 j16 w16": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.max_running=16",
                               "rollout.join_steps=16", "rollout.max_waiting=16"],
    # ... with one more version of slack: where the two sides are balanced, how much of the engine's idle share is
    # the other side's step-to-step spread
    "stream k=3 r16": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=3", "rollout.max_running=16"],
    # One batch in flight with the shorter lag: each step of lag lengthens the latency chain; and without the
    # blocked margin
    "stream k=2 m1.1": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.load_lag_margin=1.1"],
    "stream k=1 b1.25": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=1",
                         "rollout.load_lag_margin_blocked=1.25"],
    "stream k=2 b1.25": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2",
                         "rollout.load_lag_margin_blocked=1.25"],
    # Each version loads the moment the trainers have it (not reproducible).
    "stream k=1 free": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=1", "rollout.free_loads=true"],
    "stream k=2 free": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=2", "rollout.free_loads=true"],
    # Tool answers join as they arrive (not reproducible); versions still load at deterministic points.
    "stream k=1 continuous": [*SPLIT, "rollout.stream=true", "rollout.max_staleness=1", "rollout.schedule=continuous"],
}
DEFAULT = ["colocated", "split k=1", "stream k=1", "stream k=2"]  # agent: + stream k=1 continuous


class LengthEnv:
    """Runs the row's `turns` model turns, answering "+" after each (no step reward: digit_share scores).
    With the row's latency_ms = [low, high] each answer first waits a seeded log-uniform time in it."""
    max_turns = max(TARGETS)

    def __init__(self, row):
        self.target, self.key, self.turn = int(row["turns"]), int(row["key"]), 0
        self.low, self.high = (ms / 1e3 for ms in row.get("latency_ms") or (0, 0))

    def step(self, action, action_ids):
        if self.high > 0:
            u = random.Random(self.key * 1000 + self.turn).random()
            time.sleep(self.low * (self.high / self.low) ** u)
        self.turn += 1
        return "+", 0.0, self.turn >= self.target


def digit_share(prompts, completions, transcripts=None, **_) -> list[float]:
    """The share of digits in each response (its whole transcript when multi-turn): "1a+2b" -> 0.4."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in transcripts or completions]


def data_file(latency_ms: tuple[float, float] | None = None) -> Path:
    """The 8 prompts with their turn targets (and tool latency), written once into the rlcore cache."""
    from rlcore.tasks import tiny
    name = f"async-rl-data-t{'-'.join(map(str, TARGETS))}" + (
        f"-{latency_ms[0]:g}-{latency_ms[1]:g}ms" if latency_ms else "")

    def build(out: Path) -> None:
        rows = [{"prompt": f"{10 + 9 * i}+{i * 7 % 90}=", "turns": t, "key": i,
                 "latency_ms": list(latency_ms) if latency_ms else None} for i, t in enumerate(TARGETS)]
        (out / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (out / "meta.json").write_text("{}\n")

    return tiny.prepare_cached(name, build) / "prompts.jsonl"


def config():
    """The long-tail recipe (the runner overrides the model, data, tokens per turn and the contender's layout)."""
    from benchmarks.scaling import no_eos_model
    from rlcore.algorithms.grpo import GRPO
    from rlcore.config import (Config, DataConfig, ModelConfig, OptimConfig, RewardSpec, RolloutConfig,
                               TrainConfig)
    tokens = 16
    return Config(
        name="async_rl", seed=0,
        model=ModelConfig(path=str(no_eos_model("3M"))),
        data=DataConfig(path=str(data_file()), prompt_column="prompt", max_prompt_tokens=16),
        rollout=RolloutConfig(tensor_parallel=1, group_size=8, prompts_per_step=len(TARGETS), max_new_tokens=tokens,
                              max_total_tokens=max(TARGETS) * (tokens + 1), temperature=1.0, cpu_kv_cache_gb=0.25,
                              # one thread per trajectory: 64 tool calls at once on a rank, whatever the layout
                              env=f"{Path(__file__).resolve()}:LengthEnv", env_workers=64),
        optim=OptimConfig(lr=1e-4, max_grad_norm=1.0),
        # Packed micro-batches: the update costs the batch's real tokens, not 64 rows x the longest.
        train=TrainConfig(steps=8, micro_batch_size=64, max_tokens_per_micro_batch=4096, eval_every=1000),
        rewards=[RewardSpec(fn=f"{Path(__file__).resolve()}:digit_share", weight=1.0)],
        algorithm=GRPO(clip_low=0.2, clip_high=0.2, kl_coef=0.0, loss_agg="token-mean"),
    )


def workload(args) -> tuple[list[str], float]:
    """The overrides every contender runs with, and the batch modes' engine occupancy per engine step: in a
    batch, trajectory i runs TARGETS[i] x tokens engine steps, the batch as many as its longest, so the mean
    running sequences over the maximum is sum(TARGETS) / (max(TARGETS) x prompts) (prefills aside). Single-turn
    lengths are random: not known (nan)."""
    from benchmarks.common import random_model
    from benchmarks.scaling import no_eos_model
    if args.recipe:
        return [f"recipe={args.recipe}", "data.eval_path="], float("nan")
    here = [f"recipe={Path(__file__).resolve()}", f"rollout.max_new_tokens={args.tokens}"]
    if args.workload == "single":
        return here + ["rollout.max_total_tokens=0", f"model.path={random_model(args.size)}",
                       f"data.path={data_file()}", "rollout.env="], float("nan")
    latency = (20, 200) if args.workload == "agent" else None
    return here + [f"rollout.max_total_tokens={max(TARGETS) * (args.tokens + 1)}",
                   f"model.path={no_eos_model(args.size)}", f"data.path={data_file(latency)}"], \
        sum(TARGETS) / (max(TARGETS) * len(TARGETS))


def main() -> None:
    from benchmarks.async_runner import command_line, report, run_once
    from benchmarks.common import write_section
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="longtail", choices=["longtail", "agent", "single"])
    parser.add_argument("--recipe", default="", help="run the contenders on this recipe as it is instead (eval off)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--tokens", type=int, default=16, help="tokens per model turn (single: the most new tokens)")
    parser.add_argument("--size", default="3M")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--only", nargs="+", default=None, choices=list(CONTENDERS))
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides for every contender")
    parser.add_argument("--no-pin", dest="pin", action="store_false")
    parser.add_argument("--json", default="", help="also keep every measured step here")
    parser.add_argument("--write", action="store_true", help="append a RESULTS.md section")
    parser.add_argument("--report-from", default="", help="report the steps kept by --json PATH (no runs)")
    parser.add_argument("--on-paper", action="store_true", help="print the 7B on-paper table (no runs)")
    parser.add_argument("--occupancy", type=float, default=1.0,
                        help="on paper: streaming engines' occupancy where the latency chain does not bound it")
    parser.add_argument("--lag", type=float, default=1.25,
                        help="on paper: the load lag in trainer steps (auto: rollout.load_lag_margin, "
                             "1.25; free loads: 1)")
    parser.add_argument("--frozen", type=float, nargs=2, default=[0.0, 0.0],
                        help="on paper: the share of a trainer step the streaming engine waits, k=1 and k=2")
    parser.add_argument("--period", type=float, default=1.0,
                        help="on paper: the trainers' period over their step where something waits for the "
                             "version (a run's report measures it: the load's time after its hand-over; free: 1)")
    args = parser.parse_args()
    args.only = args.only or DEFAULT + (["stream k=1 continuous"] if args.workload == "agent" else [])
    if args.on_paper:
        from benchmarks.async_paper import print_on_paper
        return print_on_paper(args.occupancy, dict(zip((1, 2), args.frozen)), args.lag, args.period)
    overrides, occupancy = workload(args)  # builds the models and data outside the timed runs
    if args.report_from:
        results = json.loads(Path(args.report_from).read_text())
    else:
        results = {c: [] for c in args.only}
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                for c in args.only:
                    out = Path(tmp) / f"{r}-{c.replace(' ', '_')}"
                    out.mkdir()
                    t0 = time.time()
                    run = run_once(overrides + args.extra, CONTENDERS[c], out, args.nproc, args.steps, args.pin)
                    results[c] += run["rows"]
                    if args.json:  # after every run: a series cut short keeps what it measured
                        Path(args.json).write_text(json.dumps(results))
                    walls = sorted(x["wall_s"] for x in run["rows"])
                    print(f"round {r} {c}: {time.time() - t0:.0f} s, pinned {run['pinned']} ranks, median step wall "
                          f"{walls[len(walls) // 2]:.2f} s", flush=True)
    what = f"recipe={args.recipe}" if args.recipe else f"{args.workload} workload, {args.size}"
    title = (f"async RL: {', '.join(results)}; {what}, {args.nproc} ranks, medians of {args.rounds} alternating "
             f"rounds")
    lines = report(results, occupancy)
    if args.write:
        write_section(title, command_line(), lines)


if __name__ == "__main__":
    main()
