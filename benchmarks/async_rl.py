"""Colocated vs split k=0 vs split k=1 on a long-tailed workload: samples/s, each role's idle time, the transfer.

    flock /tmp/rlcore-heavy.lock python benchmarks/async_rl.py --rounds 3          # long tail, 2 ranks, pinned
    flock /tmp/rlcore-heavy.lock python benchmarks/async_rl.py --workload agent --rounds 3
    flock /tmp/rlcore-heavy.lock python benchmarks/async_rl.py --recipe tooladd --steps 12   # a recipe as it is
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=benchmarks/async_rl.py \
        rollout.ranks=1 rollout.max_staleness=1 algorithm.tis_cap=2          # the recipe alone (this file)

The workload (this file is also its recipe, `config()`): GRPO on a random-init 3M Qwen2 whose EOS cannot be
sampled (benchmarks/scaling.py no_eos_model), so a trajectory's length is set by the environment alone:
LengthEnv lets each prompt run its row's `turns` (1 to 10) model turns of rollout.max_new_tokens tokens,
answering one token after each. Every step draws the same 8 prompts (the data file has exactly 8; the
shuffle changes their order) with targets 1, 1, 2, 2, 3, 5, 7, 10 turns: response lengths span 10x inside
every batch and the engine's batch shrinks turn by turn, the long tail of reasoning rollouts. The reward is
the share of digits the model writes (the environment's), so advantages are non-zero and the weights move.
The agent workload is the same with a tool that sleeps a seeded, log-uniform 20-200 ms after every turn
(benchmarks/agents.py's slow tool): generation time that is tool waiting, not compute.

Contenders, on the same ranks (--nproc, default 2): colocated (rollout.ranks=0: both ranks generate and
train), split k=0 (rollout.ranks=1: rank 0 generates, rank 1 trains, on-policy) and split k=1 (the engines
sample one version behind, with the decoupled-PPO correction algorithm.tis_cap=2). Each run is a real
`torchrun launch/train.py` of --steps steps; rounds alternate the contenders. With --pin (default) each rank
is pinned to one core (rank r to core r mod cores, every thread of it, as soon as torchrun starts it).

Measured per run, from rank 0's metrics.jsonl, steps 3..N (1-2 are warm-up and the pipeline filling):
  step wall s       the time between two consecutive steps' log lines (this script polls the file): the
                    pipeline's period; samples/s = sequences per step / that
  rollout idle      1 - time making a batch (time/collect_s split; time/generate_s + time/env_s +
                    time/reward_s colocated) / step wall: the engine ranks' time not generating
  trainer wait      1 - (time/step_s + time/sync_s) / step wall: trainer ranks waiting for a batch
                    (colocated: the same, its rollout is what it waits through)
  sync s, GB/s      time/sync_s (split: the rollout ranks' receive + in-place reload; colocated: the sync),
                    and 4 B x parameters (the fp32 weights sent) over it
Medians over the measured steps of all rounds. Writes a RESULTS.md section.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS = (1, 1, 2, 2, 3, 5, 7, 10)  # model turns per prompt: every step's batch holds all eight
CONTENDERS = {
    "colocated": ["rollout.ranks=0"],
    "split k=0": ["rollout.ranks=1", "rollout.max_staleness=0"],
    "split k=1": ["rollout.ranks=1", "rollout.max_staleness=1", "algorithm.tis_cap=2"],
}


class LengthEnv:
    """Runs the row's `turns` model turns, answering "+" after each; reward: the share of digits written.
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
        digits = sum(c.isdigit() for c in action) / max(len(action), 1)
        return "+", digits / self.target, self.turn >= self.target


def data_file(latency_ms: tuple[float, float] | None = None) -> Path:
    """The 8 prompts with their turn targets (and tool latency), written once into the rlcore cache."""
    from rlcore import tiny
    name = "async-rl-data" + (f"-{latency_ms[0]:g}-{latency_ms[1]:g}ms" if latency_ms else "")

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
    from rlcore.config import Config, DataConfig, ModelConfig, OptimConfig, RolloutConfig, TrainConfig
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
        rewards=[],
        algorithm=GRPO(clip_low=0.2, clip_high=0.2, kl_coef=0.0, loss_agg="token-mean"),
    )


# ---- the runner ---------------------------------------------------------------------------------------------

def pin_ranks(proc: subprocess.Popen, nproc: int, cores: list[int], deadline: float) -> int:
    """Pin every thread of each rank torchrun starts (found by its RANK environment) to core rank % cores."""
    pinned: set[int] = set()
    while len(pinned) < nproc and time.time() < deadline and proc.poll() is None:
        for pid in _descendants(proc.pid):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                rank = next((int(e[5:]) for e in env if e.startswith(b"RANK=")), None)
                if rank is None or pid in pinned:
                    continue
                # Early, while the rank imports: threads it starts later inherit their creator's core.
                for tid in os.listdir(f"/proc/{pid}/task"):
                    os.sched_setaffinity(int(tid), {cores[rank % len(cores)]})
                pinned.add(pid)
            except (OSError, ValueError):
                continue
        time.sleep(0.01)
    return len(pinned)


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


def run_once(args, overrides: list[str], out_dir: Path) -> dict:
    workload = ([f"recipe={args.recipe}", "data.eval_path="] if args.recipe else [
        f"recipe={Path(__file__).resolve()}", f"rollout.max_new_tokens={args.tokens}",
        f"rollout.max_total_tokens={max(TARGETS) * (args.tokens + 1)}", f"model.path={args.model}",
        f"data.path={args.data}"])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           "launch/train.py", *workload, *overrides, f"train.steps={args.steps}", f"output_dir={out_dir}", "name=bench"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    log = open(out_dir / "stdout.txt", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    pinned = pin_ranks(proc, args.nproc, sorted(os.sched_getaffinity(0)), time.time() + 60) if args.pin else 0
    metrics, arrivals, seen = out_dir / "bench" / "metrics.jsonl", [], 0
    while proc.poll() is None:  # each step's log line, stamped as it arrives
        if metrics.exists():
            lines = metrics.read_text().splitlines()
            for line in lines[seen:]:
                if line.strip():
                    arrivals.append((json.loads(line), time.perf_counter()))
            seen = len(lines)
        time.sleep(0.02)
    if proc.returncode:
        sys.exit(f"async_rl run {overrides} failed (exit {proc.returncode}): see {out_dir / 'stdout.txt'}\n"
                 + (out_dir / "stdout.txt").read_text()[-3000:])
    lines = [l for l in metrics.read_text().splitlines() if l.strip()][seen:]
    arrivals += [(json.loads(l), time.perf_counter()) for l in lines]  # the last lines: stamped late (unused)
    steps = [(m, t) for m, t in arrivals if m["step"] >= 1]
    rows = []
    for (prev, t0), (m, t1) in zip(steps, steps[1:]):
        if m["step"] >= 3 and m["step"] < args.steps:  # the last line may be stamped at exit: left out
            rows.append(m | {"wall_s": t1 - t0})
    return {"rows": rows, "pinned": pinned}


def summarise(rows: list[dict], params: int) -> dict:
    from benchmarks.common import median
    per = []
    for m in rows:
        wall = m["wall_s"]
        making = m.get("time/collect_s", m["time/generate_s"] + m.get("time/env_s", 0.0) + m.get("time/reward_s", 0.0))
        training = m["time/step_s"] if "time/collect_s" in m else (
            m["time/logprobs_s"] + m["time/train_s"])
        per.append({"wall": wall, "sps": m["tokens/sequences"] / wall, "gen": making, "train": training,
                    "sync": m["time/sync_s"], "rollout_idle": max(0.0, 1 - making / wall),
                    "trainer_wait": max(0.0, 1 - (training + m["time/sync_s"]) / wall),
                    "gen_share": making / wall, "train_share": training / wall,
                    "len_min": m.get("response/length_min", float("nan")), "len_mean": m["response/length_mean"],
                    "staleness": m.get("async/staleness_mean", 0.0), "is_mean": m.get("policy/is_weight_mean", 1.0)})
    med = {k: median(p[k] for p in per) for k in per[0]}
    med["gbps"] = 4 * params / 1e9 / med["sync"]
    med["n"] = len(per)
    return med


ROOT = Path(__file__).resolve().parents[1]


# ---- on paper: 7B on 8 and 64 GPUs ---------------------------------------------------------------------------

def on_paper(gen: float, train: float, sync_colocated: dict[int, float], transfer: dict[int, float],
             phis: list[float]):
    """Step seconds of colocated / split k=0 / split k=1 on W GPUs from a colocated step of gen + train +
    sync_colocated[W] seconds (all W GPUs generate, then all train). Split with R engine GPUs: generation takes
    gen x (phi x W / R + 1 - phi) (phi: the share of generation time that scales with the engines' count; the
    rest is the long tail's latency, the same on any count), training train x W / (W - R) (linear FSDP), the
    transfer transfer[W] on the critical path of both sides (rlcore's lockstep exchange). k=0: gen' + train' +
    transfer; k=1: max(gen', train') + transfer. R is the best of 1..W-1 for each. -> rows."""
    rows = []
    for W, x in transfer.items():
        colocated = gen + train + sync_colocated[W]
        for phi in phis:
            def split(R, k):
                g, t = gen * (phi * W / R + 1 - phi), train * W / (W - R)
                return (g + t if k == 0 else max(g, t)) + x
            best = {k: min(range(1, W), key=lambda R: split(R, k)) for k in (0, 1)}
            rows.append({"W": W, "phi": phi, "colocated": colocated, "transfer": x,
                         **{f"k{k}": split(R, k) for k, R in best.items()}, **{f"R{k}": R for k, R in best.items()}})
    return rows


def main() -> None:
    from benchmarks.common import param_count, write_section
    from benchmarks.scaling import no_eos_model
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="longtail", choices=["longtail", "agent"])
    parser.add_argument("--recipe", default="", help="run the contenders on this recipe as it is instead (eval off)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--tokens", type=int, default=16, help="tokens per model turn")
    parser.add_argument("--size", default="3M")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--only", nargs="+", default=list(CONTENDERS), choices=list(CONTENDERS))
    parser.add_argument("--no-pin", dest="pin", action="store_false")
    parser.add_argument("--json", default="", help="also keep every measured step here")
    parser.add_argument("--write", action="store_true", help="append a RESULTS.md section")
    parser.add_argument("--on-paper", action="store_true", help="print the 7B on-paper table (no runs)")
    parser.add_argument("--report-from", default="", help="report the steps kept by --json PATH (no runs)")
    args = parser.parse_args()
    if args.on_paper:
        return print_on_paper()
    if args.report_from:
        from benchmarks.common import param_count, write_section
        from benchmarks.scaling import no_eos_model
        results = json.loads(Path(args.report_from).read_text())
        params = recipe_params(args.recipe) if args.recipe else param_count(no_eos_model(args.size))
        return report(args, results, params, write_section if args.write else None)
    args.model = no_eos_model(args.size)  # built outside the timed runs (as the recipe's warm start, below)
    args.data = data_file((20, 200) if args.workload == "agent" else None)
    params = param_count(args.model) if not args.recipe else recipe_params(args.recipe)
    results = {c: [] for c in args.only}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for c in args.only:
                out = Path(tmp) / f"{r}-{c.replace(' ', '_')}"
                out.mkdir()
                t0 = time.time()
                run = run_once(args, CONTENDERS[c], out)
                results[c] += run["rows"]
                print(f"round {r} {c}: {time.time() - t0:.0f} s, pinned {run['pinned']} ranks, median step wall "
                      f"{sorted(x['wall_s'] for x in run['rows'])[len(run['rows']) // 2]:.2f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results))
    report(args, results, params, write_section if args.write else None)


def print_on_paper() -> None:
    """The assumptions are RESULTS.md's ("on paper" section): a 100 s colocated 7B step, 60 % generation."""
    gb = 15.2  # Qwen2.5-7B in bf16
    rows = on_paper(60.0, 40.0, {8: 0.12, 64: 0.5}, {8: 0.12, 64: 6.0}, [1.0, 0.6, 0.25])
    print("| GPUs | phi (generation that scales with engines) | colocated s | split k=0 s (R) | split k=1 s (R) "
          "| k=0 / colocated samples/s | k=1 / colocated samples/s | k=1 / k=0 samples/s | transfer s (GB/s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['W']} | {r['phi']:.2f} | {r['colocated']:.1f} | {r['k0']:.1f} ({r['R0']}) | {r['k1']:.1f} ({r['R1']}) "
              f"| x{r['colocated'] / r['k0']:.2f} | x{r['colocated'] / r['k1']:.2f} | x{r['k0'] / r['k1']:.2f} "
              f"| {r['transfer']:.2f} ({gb / r['transfer']:.1f}) |")


def recipe_params(recipe: str) -> int:
    """Parameters of a recipe's model, from its safetensors headers (the recipe's prepare has built it)."""
    from safetensors import safe_open

    from rlcore.cli import load_recipe
    cfg = load_recipe(recipe, ROOT / "recipes")
    if cfg.prepare:
        module, _, fn = cfg.prepare.partition(":")
        getattr(__import__(module, fromlist=[fn]), fn)(cfg)
    total = 0
    for f in Path(cfg.model.path).glob("*.safetensors"):
        with safe_open(f, "pt") as st:
            total += sum(_prod(st.get_slice(k).get_shape()) for k in st.keys())
    return total


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def report(args, results: dict, params: int, write) -> None:
    meds = {c: summarise(rows, params) for c, rows in results.items()}
    lines = ["| contender | steps | samples/s | step wall s | rollout s (share) | train s (share) | rollout idle "
             "| trainer wait | sync s | sync GB/s | resp len mean | staleness | IS weight mean |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c, m in meds.items():
        lines.append(f"| {c} | {m['n']} | {m['sps']:.2f} | {m['wall']:.2f} | {m['gen']:.2f} ({m['gen_share']:.0%}) | "
                     f"{m['train']:.2f} ({m['train_share']:.0%}) | {m['rollout_idle']:.2f} | {m['trainer_wait']:.2f} | "
                     f"{m['sync']:.3f} | {m['gbps']:.2f} | {m['len_mean']:.0f} | {m['staleness']:.2f} | "
                     f"{m['is_mean']:.4f} |")
    ratios = []
    if "split k=0" in meds:
        for c in meds:
            if c != "split k=0":
                ratios.append(f"- {c} / split k=0 samples/s: x{meds[c]['sps'] / meds['split k=0']['sps']:.2f}")
    for line in lines + ratios:
        print(line)
    if write:
        command = "flock /tmp/rlcore-heavy.lock python benchmarks/async_rl.py " + " ".join(
            shlex.quote(a) for a in sys.argv[1:])
        what = f"recipe={args.recipe}" if args.recipe else f"{args.workload} workload, {args.size}"
        write(f"async RL: colocated vs split k=0 vs split k=1, {what}, {args.nproc} ranks, medians of "
              f"{args.rounds} alternating rounds", command, lines + [""] + ratios)


if __name__ == "__main__":
    main()
