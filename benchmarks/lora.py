"""LoRA vs full fine-tuning on the same GRPO work: step time by stage, sync bytes, optimizer state, peak memory.

    python benchmarks/lora.py --report                          # 25M and 50M, 1 round, a RESULTS.md section
    python benchmarks/lora.py --sizes 50M --rounds 2 --json /tmp/lora.json   # keep rows; --report later

Three contenders, each a real `torchrun --nproc-per-node 2 launch/train.py recipe=demo_lora` run (eval off)
on a random-init Qwen2 of benchmarks/common.py with EOS made unsampleable (scaling.no_eos_model), so every
response is --tokens long and the three do exactly the same work:
  full      lora.enabled=false: every weight trained, full weights synced (recipe=demo_lora is recipe=demo + lora)
  adapter   LoRA r=16 (the recipe's), lora.sync=adapter: the engine serves base + an unmerged PEFT adapter
  merged    the same LoRA, lora.sync=merged: W + (alpha/r) B A streamed into an engine without LoRA
The contenders alternate within each round (full, adapter, merged, full, ...) so machine load hits them alike.
Step 1 is warm-up; each number is the median over steps 2..N of all rounds of a contender.

Optimizer state is computed, not measured: AdamW keeps m and v in fp32, 8 bytes per trained parameter (all
P for full fine-tuning, the adapters' r * sum(in + out) per layer with LoRA; rlcore.preflight.plan.Shapes).
Peak memory is the per-rank resident peak (VmHWM) of the train phase (logprobs + update + sync), the larger of
the two ranks, as the trainer logs it (memory/train_peak_gb): the CPU runtime and vLLM's KV cache included.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import SIZES, median, param_count, write_section  # noqa: E402
from benchmarks.scaling import load, no_eos_model, run_cell, save  # noqa: E402

CONTENDERS = {"full": ["lora.enabled=false"], "adapter": ["lora.sync=adapter"], "merged": ["lora.sync=merged"]}
RANK = 16  # recipe=demo_lora's lora.rank; the sync-bytes goal is stated at r=16


def optimizer_bytes(model_dir: Path, lora: bool) -> int:
    """AdamW m + v in fp32 over the trained parameters (all of them, or the LoRA adapters only)."""
    from rlcore.config import LoraConfig
    from rlcore.preflight import plan

    if not lora:
        return 8 * param_count(model_dir)
    shapes = plan.Shapes.from_config(json.loads((model_dir / "config.json").read_text()))
    return 8 * shapes.adapter_params(RANK, LoraConfig().targets)


def summarize(steps: list[dict]) -> dict:
    m = lambda key: median(key(r) if callable(key) else r[key] for r in steps)  # noqa: E731
    return {"step_s": m("time/step_s"), "generate_s": m("time/generate_s"), "train_s": m("time/train_s"),
            "other_s": m(lambda r: r["time/step_s"] - r["time/generate_s"] - r["time/train_s"] - r["time/sync_s"]),
            "sync_s": m("time/sync_s"), "sync_mb": m("sync/gb") * 1e3,
            "train_peak_gb": m("memory/train_peak_gb"), "generate_peak_gb": m("memory/generate_peak_gb"), "tokens": m("tokens/batch")}


def report(rows: list[dict], args) -> list[str]:
    lines = [
        f"GRPO, recipe=demo_lora's task and settings (the demo's addition prompts, group size {args.samples}, "
        f"{args.tokens} new tokens, LoRA r={RANK} alpha=32 on every attention and MLP linear) with "
        f"{args.prompts} prompts a step (the demo's 32 would take ~4x longer), eval off, on random-init Qwen2 "
        f"models of benchmarks/common.py with EOS unsampleable (every response {args.tokens} tokens: the same "
        f"work for all three), 2 CPU ranks (gloo, one fp32 vLLM CPU engine per rank, TP=1). Contenders "
        f"alternate within a round; medians over steps 2..N of all rounds (step 1 is warm-up). Stage seconds "
        f"are rank 0's wall time; other: the rest of the step (reward, which includes waiting for the other rank "
        f"to finish generating, and the engine's sleep and wake); train peak: the larger rank's resident peak of logprobs + update + sync "
        f"(runtime and KV cache included); optimizer: AdamW m + v, 8 B per trained parameter (computed).", "",
        "| model | contender | runs x steps | s/step | generate s | train s | sync s | other s | sync MB | optimizer MB | "
        "train peak GB | generate peak GB |", "|" + "---|" * 12]
    ratios = []
    for size in [s for s in SIZES if any(r["size"] == s for r in rows)]:
        med = {}
        for name in CONTENDERS:
            runs = [r for r in rows if r["size"] == size and r["contender"] == name]
            steps = [st for r in runs for st in r.get("steps", [])]
            errors = "; ".join(r["error"] for r in runs if "error" in r)
            if not steps:
                lines.append(f"| {size} | {name} | failed: {errors or 'not run'} |" + " |" * 9)
                continue
            s = med[name] = summarize(steps) | {"optim_mb": runs[0]["optim_bytes"] / 1e6}
            lines.append(f"| {size} ({runs[0]['params'] / 1e6:.1f}M) | {name} | {len(runs)} x {len(steps) // len(runs)} | "
                         f"{s['step_s']:.2f} | {s['generate_s']:.2f} | {s['train_s']:.2f} | {s['sync_s']:.3f} | {s['other_s']:.2f} | "
                         f"{s['sync_mb']:.2f} | {s['optim_mb']:.1f} | {s['train_peak_gb']:.2f} | "
                         f"{s['generate_peak_gb']:.2f} |" + (f" ({errors})" if errors else ""))
        if "full" in med:
            ratios += [f"- {size}: " + "; ".join(_ratios(med)) + "; " + _per_round(rows, size)]
    return lines + ["", "Against full fine-tuning (x = LoRA / full, medians):", "", *ratios]


def _ratios(med: dict) -> list[str]:
    full, out = med["full"], []
    for name in ("adapter", "merged"):
        if name in med:
            s = med[name]
            out.append(f"{name}: sync bytes {100 * s['sync_mb'] / full['sync_mb']:.2f}% of full, sync time "
                       f"x{s['sync_s'] / full['sync_s']:.2f}, train s x{s['train_s'] / full['train_s']:.2f}, "
                       f"train peak x{s['train_peak_gb'] / full['train_peak_gb']:.3f} "
                       f"({1e3 * (s['train_peak_gb'] - full['train_peak_gb']):+.0f} MB), optimizer "
                       f"x{s['optim_mb'] / full['optim_mb']:.4f}, step x{s['step_s'] / full['step_s']:.2f}")
    if "adapter" in med and "merged" in med:
        out.append(f"generate adapter / merged x{med['adapter']['generate_s'] / med['merged']['generate_s']:.2f}")
    return out


def _per_round(rows: list[dict], size: str) -> str:
    """Step time / full's within each round (the runs next to each other in time): how steady the ratio is
    under a changing machine load."""
    out = []
    for name in ("adapter", "merged"):
        paired = []
        for k in sorted({r["round"] for r in rows if r["size"] == size}):
            step = {r["contender"]: median(st["time/step_s"] for st in r["steps"]) for r in rows
                    if r["size"] == size and r["round"] == k and r.get("steps")}
            if name in step and "full" in step:
                paired.append(f"{step[name] / step['full']:.2f}")
        out.append(f"{name} step / full by round: {', '.join(paired)}")
    return "; ".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="25M,50M", help=f"comma-separated model sizes of {', '.join(SIZES)}")
    parser.add_argument("--steps", type=int, default=4, help="steps per run; step 1 is warm-up and left out")
    parser.add_argument("--prompts", type=int, default=8, help="rollout.prompts_per_step")
    parser.add_argument("--samples", type=int, default=8, help="rollout.group_size (the demo's 8)")
    parser.add_argument("--tokens", type=int, default=8, help="rollout.max_new_tokens (the demo's 8)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds of the three contenders")
    parser.add_argument("--first-round", type=int, default=0, help="number of the first round (runs in pieces)")
    parser.add_argument("--only", default=",".join(CONTENDERS), help="which contenders to run")
    parser.add_argument("--timeout", type=int, default=420, help="seconds a run may take before it is stopped")
    parser.add_argument("--json", type=Path, help="keep the rows in this file (runs in pieces, then --report)")
    parser.add_argument("--report", action="store_true", help="append a section to benchmarks/RESULTS.md")
    parser.add_argument("--note", action="append", default=[], help="a paragraph to add under the table")
    parser.add_argument("--command", default="", help="the command to name in the section (default: this one)")
    args = parser.parse_args()
    args.nproc, args.micro_batch = 2, 0  # what scaling.run_cell reads: all of a rank's rows in one micro-batch
    rows = load(args.json)
    names = [n for n in CONTENDERS if n in args.only.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.first_round, args.first_round + args.rounds):
            for size in [s for s in args.sizes.split(",") if s]:
                model = no_eos_model(size)
                for name in names:
                    t0 = time.time()
                    # The same drift alarm for all three: a random 50M model's engine/trainer gap is reported, not
                    # a reason to stop (the recipe's 1e-3 is set for the trained demo model).
                    extra = [*CONTENDERS[name], "rollout.logprob_diff_threshold=0.05"]
                    out = Path(tmp) / f"{size}-{name}-{k}"
                    row = {"size": size, "params": param_count(model), "variant": name, "contender": name,
                           "tokens": args.tokens, "round": k, "optim_bytes": optimizer_bytes(model, name != "full"),
                           **run_cell(size, args.tokens, args, extra, out, recipe="demo_lora")}
                    save(args.json, rows, row)
                    s = summarize(row["steps"]) if row["steps"] else {"step_s": float("nan")}
                    print(f"{size} {name} round {k}: {row.get('error', 'ok')}, median step {s['step_s']:.2f} s, "
                          f"run {time.time() - t0:.0f} s", flush=True)
    lines = [*report(rows, args), *(line for note in args.note for line in ("", note))]
    if args.report:
        command = args.command or "python benchmarks/lora.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        write_section("LoRA vs full fine-tuning: adapter and merged sync, 2 ranks", command, lines)
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
