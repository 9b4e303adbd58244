"""Scaling: where a GRPO step's time goes as the model and the responses grow, and tokens/s per stage.

    python benchmarks/scaling.py                                   # the grid, then a RESULTS.md section
    python benchmarks/scaling.py --sizes 3M --tokens 64 --steps 6  # one cell, printed (add --report to append)
    python benchmarks/scaling.py --sizes 50M --tokens 256 --packing 2048 --rounds 2   # packing off vs on

Each cell is a real `torchrun --nproc-per-node 2 launch/train.py recipe=demo` run (eval off) on a
random-init Qwen2 of that size (benchmarks.common.random_model, the demo's character tokenizer, 1024
positions) with EOS made unsampleable (no_eos_model), so every response is TOKENS long, with `--prompts`
prompts x `--samples` samples per step and rollout.max_new_tokens=TOKENS. Step 1 is warm-up; each number is the median
over steps 2..N. A cell that fails or runs past --timeout is recorded with the reason and the grid goes on.

--json PATH keeps the rows in a file (a cell run again replaces its rows), so a long grid can be run in
pieces and reported at the end with `--sizes= --tokens= --json PATH --report`.
With --packing T, each cell is run --rounds times with packing off (train.max_tokens_per_micro_batch=0) and on
(=T), alternating, and the report adds the ratio of their medians.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import ROOT, SIZES, median, param_count, random_model, write_section  # noqa: E402

STAGES = ("generate", "reward", "logprobs", "train", "sync")
OFFSET, EOS_WEIGHT = 10.0, -5.0  # see no_eos_model


def no_eos_model(size: str) -> Path:
    """random_model(size) with EOS made unsampleable, so every response runs to max_new_tokens.

    Over the demo's 32-token vocabulary a random model samples EOS about once in 32 tokens (responses of ~27
    tokens mean whatever the cap). Here every token embedding gets +OFFSET on residual dimension 0, which the
    random layers' small outputs do not flip, and the lm_head's EOS row gets EOS_WEIGHT on that dimension: the
    EOS logit sits tens below the others. Same shapes, parameter count and compute as random_model(size).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from rlcore.tasks import tiny
    source = random_model(size)

    def build(out: Path) -> None:
        model = AutoModelForCausalLM.from_pretrained(source, torch_dtype=torch.float32)
        eos = model.config.eos_token_id
        with torch.no_grad():
            model.get_input_embeddings().weight[:, 0] += OFFSET
            model.get_output_embeddings().weight[eos].zero_()
            model.get_output_embeddings().weight[eos, 0] = EOS_WEIGHT
        tiny._save(model, out)
        (out / "meta.json").write_text((source / "meta.json").read_text())

    return tiny.prepare_cached(f"{source.name}-noeos-o{OFFSET:g}-w{EOS_WEIGHT:g}", build)


def run_cell(size: str, tokens: int, args, extra: list[str], out: Path, recipe: str = "demo") -> dict:
    """One torchrun run of `recipe` (demo, or a copy of it such as demo_lora); -> {"steps": [metrics of
    steps 2..N]} or {"error": why}."""
    model = no_eos_model(size)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           str(ROOT / "launch" / "train.py"), f"recipe={recipe}", f"model.path={model}",
           f"rollout.max_new_tokens={tokens}", f"rollout.prompts_per_step={args.prompts}",
           f"rollout.group_size={args.samples}", f"train.micro_batch_size={micro_batch(args)}",
           f"train.steps={args.steps}", "data.eval_path=", *extra,
           f"output_dir={out}", "name=bench"]
    env = os.environ | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    # A new session, so a timeout can end torchrun and the ranks it started (their process group) together.
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        stderr = None
    metrics = out / "bench" / "metrics.jsonl"
    rows = [json.loads(l) for l in metrics.read_text().splitlines()] if metrics.exists() else []
    steps = [r for r in rows if r.get("step", 0) >= 2 and "time/step_s" in r]
    if stderr is None:
        return {"error": f"timed out after {args.timeout} s ({len(steps) + bool(rows)} of {args.steps} steps done)",
                "steps": steps}
    if proc.returncode:
        lines = [l for l in stderr.splitlines() if l.strip()]
        why = next((l for l in reversed(lines) if any(w in l for w in ("Error", "error:", "rlcore:", "exceeds"))),
                   lines[-1] if lines else f"exit code {proc.returncode}")
        return {"error": f"exit {proc.returncode}: {why.strip()[:300]}", "steps": steps}
    return {"steps": steps}


def micro_batch(args) -> int:
    """All of a rank's sequences in one micro-batch, as the demo's micro_batch_size=128 does for any grid cell;
    set explicitly so the launch plan's memory estimate counts the rows that exist, not 128."""
    return args.micro_batch or args.prompts * args.samples // args.nproc


def summarize(steps: list[dict], params: int) -> dict:
    """Medians over the measured steps of every number the table shows."""
    m = lambda f: median(f(r) for r in steps)  # noqa: E731
    s = {"step_s": m(lambda r: r["time/step_s"])}
    for stage in STAGES:
        s[f"{stage}_s"] = m(lambda r: r[f"time/{stage}_s"])
        s[f"{stage}_share"] = m(lambda r: r[f"time/{stage}_s"] / r["time/step_s"])
    s["generate_tok_s"] = m(lambda r: r["tokens/generated"] / r["time/generate_s"])
    s["train_resp_tok_s"] = m(lambda r: r["response/length_mean"] * r["tokens/sequences"] / r["time/train_s"])
    s["train_all_tok_s"] = m(lambda r: r["tokens/batch"] / r["time/train_s"])
    # Achieved rate counting 2 x params FLOP a sampled token and 6 x params a trained token (attention left out).
    s["generate_gflop_s"] = 2 * params * s["generate_tok_s"] / 1e9
    s["train_gflop_s"] = 6 * params * s["train_all_tok_s"] / 1e9
    s["sync_gb_s"] = m(lambda r: r["sync/gb"] / max(r["time/sync_s"], 1e-9))
    s["peak_gb"] = max(r["memory/peak_gb"] for r in steps)
    s["response_len"] = m(lambda r: r["response/length_mean"])
    s["batch_tokens"] = m(lambda r: r["tokens/batch"])
    return s


def load(path: Path | None) -> list[dict]:
    return json.loads(path.read_text()) if path and path.exists() else []


def save(path: Path | None, rows: list[dict], row: dict) -> None:
    key = lambda r: (r["size"], r["tokens"], r["variant"], r.get("round", 0))  # noqa: E731
    rows[:] = [r for r in rows if key(r) != key(row)] + [row]
    if path:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rows, indent=1))
        tmp.replace(path)


def fmt(v: float, spec: str) -> str:
    return "-" if v != v else spec.format(v)


def report(rows: list[dict], args) -> list[str]:
    grid = [r for r in rows if r["variant"] == "grid"]
    order = lambda r: (list(SIZES).index(r["size"]), r["tokens"])  # noqa: E731
    lines = ["| model | params | new tokens | resp len | s/step | generate s (share) | reward s (share) | logprobs s | train s (share) | "
             "sync s (share) | generate tok/s | train resp tok/s | train all tok/s | generate GFLOP/s | "
             "train GFLOP/s | sync GB/s | peak GB/rank |", "|" + "---|" * 17]
    for r in sorted(grid, key=order):
        if "error" in r and not r.get("steps"):
            lines.append(f"| {r['size']} | {r['params'] / 1e6:.2f}M | {r['tokens']} | failed: {r['error']} |"
                         + " |" * 13)
            continue
        s = summarize(r["steps"], r["params"])
        share = lambda k: f"{fmt(s[k + '_s'], '{:.2f}')} ({s[k + '_share']:.0%})"  # noqa: E731
        lines.append(
            f"| {r['size']} | {r['params'] / 1e6:.2f}M | {r['tokens']} | {s['response_len']:.1f} | {s['step_s']:.2f} | {share('generate')} | {share('reward')} | "
            f"{s['logprobs_s']:.3f} | {share('train')} | {fmt(s['sync_s'], '{:.3f}')} ({s['sync_share']:.0%}) | "
            f"{s['generate_tok_s']:,.0f} | {s['train_resp_tok_s']:,.0f} | {s['train_all_tok_s']:,.0f} | "
            f"{s['generate_gflop_s']:.2f} | {s['train_gflop_s']:.2f} | {s['sync_gb_s']:.3f} | {s['peak_gb']:.2f} |"
            + (f" ({len(r['steps'])} steps: {r['error']})" if "error" in r else ""))
    packed = [r for r in rows if r["variant"] in ("pack-off", "pack-on") and r.get("steps")]
    for size, tokens in sorted({(r["size"], r["tokens"]) for r in packed}, key=lambda c: (list(SIZES).index(c[0]), c[1])):
        cell = [r for r in packed if (r["size"], r["tokens"]) == (size, tokens)]
        med = {}
        lines += ["", f"Packing, {size} x {tokens} new tokens, runs alternating off / on (medians over the "
                      f"measured steps of all runs of each):", "",
                  "| packing | runs | steps | s/step | train s | train all tok/s | peak GB/rank |", "|---|---|---|---|---|---|---|"]
        for variant in ("pack-off", "pack-on"):
            runs = [r for r in cell if r["variant"] == variant]
            steps = [st for r in runs for st in r["steps"]]
            if not steps:
                continue
            s = med[variant] = summarize(steps, runs[0]["params"])
            label = runs[0]["extra"] or "off"
            lines.append(f"| `{label}` | {len(runs)} | {len(steps)} | {s['step_s']:.2f} | {s['train_s']:.2f} | "
                         f"{s['train_all_tok_s']:,.0f} | {s['peak_gb']:.2f} |")
        if len(med) == 2:
            on, off = med["pack-on"], med["pack-off"]
            lines += ["", f"on / off: step time x{on['step_s'] / off['step_s']:.3f}, train time "
                          f"x{on['train_s'] / off['train_s']:.3f}, peak memory x{on['peak_gb'] / off['peak_gb']:.3f}"]
    return lines


def intro(rows: list[dict], args) -> list[str]:
    """What was run, from the rows themselves (a report may gather runs of several invocations)."""
    def one(key, default):
        values = sorted({r.get(key, default) for r in rows}) if rows else [default]
        return "/".join(str(v) for v in values)
    prompts, samples, nproc, steps = (one("prompts", args.prompts), one("samples", args.samples),
                                      one("nproc", args.nproc), one("steps_run", args.steps))
    micro = one("micro_batch", micro_batch(args))
    return [
        f"GRPO `recipe=demo` (eval off) on random-init Qwen2 models of benchmarks/common.py (the demo's "
        f"32-token character tokenizer) with EOS made unsampleable (scaling.py no_eos_model: same shapes and "
        f"compute; a plain random model samples EOS about once in 32 tokens, so its responses average ~27 tokens "
        f"whatever the cap), so every response is max_new_tokens long. {prompts} prompts x {samples} samples per "
        f"step over {nproc} CPU ranks (gloo, vLLM CPU engine per rank, fp32), the demo's prompts (at most 16 "
        f"tokens), train.micro_batch_size={micro}: a rank's sequences in one micro-batch, as the demo's 128 gives, "
        f"set so that the launch plan counts the rows that exist (with 128 it refuses 50M x 256 as 34.5 GB). "
        f"{steps} steps per run; every number is the median over steps 2-{steps} (step 1 is warm-up).",
        "",
        "Columns: resp len: mean response tokens. Stage seconds are rank 0's wall time per step, (share) the "
        "median of stage / step; reward includes waiting, in the reward collective, for the other rank to finish "
        "generating. logprobs: GRPO here is on-policy, so the update's own forward gives the old logprobs and no "
        "separate pass runs. generate tok/s: sampled tokens of both ranks per second of generation. train resp "
        "tok/s: response (loss) tokens of both ranks per second of the update; train all tok/s: prompt + response "
        "tokens. GFLOP/s: 2 x params FLOP per sampled token and 6 x params per trained token, both ranks together "
        "(attention left out): constant if the cost per token per parameter is. sync GB/s: weights pushed into "
        "the engine per second of sync. peak GB: the largest per-rank peak resident memory (VmHWM) of the "
        "generation or train phase, vLLM's 0.5 GiB KV cache and the torch/vLLM runtime included.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0.3M,3M,25M,50M", help=f"comma-separated model sizes of {', '.join(SIZES)}")
    parser.add_argument("--tokens", default="8,64,256", help="comma-separated rollout.max_new_tokens values")
    parser.add_argument("--steps", type=int, default=4, help="steps per run; step 1 is warm-up and left out")
    parser.add_argument("--prompts", type=int, default=8, help="rollout.prompts_per_step")
    parser.add_argument("--samples", type=int, default=4, help="rollout.group_size (samples per prompt)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks per run")
    parser.add_argument("--micro-batch", type=int, default=0,
                        help="train.micro_batch_size; 0 = all of a rank's sequences (prompts x samples / nproc)")
    parser.add_argument("--timeout", type=int, default=420, help="seconds a run may take before it is stopped")
    parser.add_argument("--packing", type=int, default=0,
                        help="compare packing off vs train.max_tokens_per_micro_batch=THIS on every cell, not the grid")
    parser.add_argument("--rounds", type=int, default=2, help="alternating off / on rounds with --packing")
    parser.add_argument("--first-round", type=int, default=0, help="number of the first --packing round")
    parser.add_argument("--only", default="off,on", help="with --packing: which of off,on to run each round")
    parser.add_argument("--json", type=Path, help="keep the rows in this file (runs in pieces, then --report)")
    parser.add_argument("--report", action="store_true", help="append a section to benchmarks/RESULTS.md")
    parser.add_argument("--note", action="append", default=[], help="a paragraph to add under the table")
    parser.add_argument("--command", default="", help="the command to name in the section (default: this one)")
    args = parser.parse_args()
    sizes = [s for s in args.sizes.split(",") if s]
    tokens = [int(t) for t in args.tokens.split(",") if t]
    rows = load(args.json)
    if args.packing:
        runs = [(v, extra, k) for k in range(args.first_round, args.first_round + args.rounds)
                for v, extra in (("pack-off", []), ("pack-on", [f"train.max_tokens_per_micro_batch={args.packing}"]))
                if v.removeprefix("pack-") in args.only]
    else:
        runs = [("grid", [], 0)]
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            params = param_count(no_eos_model(size))
            for n in tokens:
                for variant, extra, k in runs:
                    t0 = time.time()
                    out = Path(tmp) / f"{size}-{n}-{variant}-{k}"
                    row = {"size": size, "params": params, "tokens": n, "variant": variant, "round": k,
                           "extra": " ".join(extra), "prompts": args.prompts, "samples": args.samples,
                           "nproc": args.nproc, "steps_run": args.steps,
                           "micro_batch": micro_batch(args), **run_cell(size, n, args, extra, out)}
                    save(args.json, rows, row)
                    s = summarize(row["steps"], params) if row["steps"] else {"step_s": float("nan")}
                    print(f"{size} x {n} {variant}{' ' + str(k) if args.packing else ''}: "
                          f"{row.get('error', 'ok')}, median step {s['step_s']:.2f} s, run {time.time() - t0:.0f} s",
                          flush=True)
    lines = [*intro(rows, args), "", *report(rows, args), *(["", *args.note] if args.note else [])]
    text = "\n".join(lines)
    if args.report:
        command = args.command or "python benchmarks/scaling.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        write_section(f"scaling: model size x response length, {args.nproc} ranks", command, lines)
    else:
        print(text)


if __name__ == "__main__":
    main()
