"""The launch plan as text: what `plan=true` (launch/train.py) and launch/plan.py print. The numbers are
rlcore/preflight/plan.py's: its Plan.render() calls `render` here, which reads the Plan and its Bars without importing
them (that would be an import circle)."""
from __future__ import annotations

from rlcore.config.roles import models_of

GB = 2**30


def render(plan) -> str:
    cfg, w, k, R = plan.cfg, plan.world, plan.cfg.rollout.tensor_parallel, plan.cfg.rollout.ranks
    unit = f"{plan.device} GPU" if plan.device == "cuda" else "CPU rank"
    where = (f"{plan.memory / GB:.1f} GB per GPU" if plan.device == "cuda" else
             f"host memory {plan.memory / GB:.1f} GB shared by {plan.nproc_per_node} ranks")
    engines = (R or w) // k
    groups = " ".join("[" + ",".join(map(str, range(g * k, g * k + k))) + "]" for g in range(engines))
    lines = [f"rlcore plan: {cfg.name} on {plan.nnodes} node(s) x {plan.nproc_per_node} {unit}s; {where}"]
    if plan.split:
        asleep = "eager, asleep at level 2" if plan.device == "cuda" else "a KV cache, idle"
        lines += [f"mesh: world {w}, split (rollout.ranks={R}): {span(plan, 0, R)} generate{'s' * (R == 1)}, "
                  f"{engines} engine(s) x tp={k}: {groups}",
                  f"      {span(plan, R, w)} train{'s' * (w - R == 1)}, FSDP over them; their engines are dormant "
                  f"(dummy weights, {asleep})"]
    else:
        lines.append(f"mesh: world {w}; FSDP over ranks 0-{w - 1}; {engines} rollout group(s) x tp={k}: {groups}")
    for role in ("actor", "critic", "reference"):
        if role == "reference" and models_of(cfg).reference == "adapters_off":
            lines.append(f"  {role:<9} the actor with its adapters off (LoRA): no copy")
        elif role not in {m.role for m in plan.models if m.role != "reward"}:
            lines.append(f"  {role:<9} none")
        for m in (m for m in plan.models if m.role == role):
            how = "trained, AdamW" if m.trained else "frozen" + (", offloaded to CPU" if m.offloaded else "")
            if m.adapters:
                how = (f"base frozen; LoRA r={cfg.lora.rank} adapters trained, AdamW: {m.adapters:,} params "
                       f"({100 * m.adapters / m.params:.2f}%)")
            lines.append(f"  {role:<9} {m.path}: {m.params / 1e9:.3f}B params ({m.params:,}), {how}, "
                         f"FSDP over {w - R} ranks ({m.shapes.layers} layer units + root)")
    lines += [f"  {'reward':<9} model {m.path}: {m.params / 1e9:.3f}B params ({m.params:,}), frozen"
              + (", offloaded to CPU" if m.offloaded else "") for m in plan.models if m.role == "reward"]
    lines += [f"  {'reward':<9} function {s.fn if isinstance(s.fn, str) else getattr(s.fn, '__name__', s.fn)}"
              for s in cfg.rewards if s.fn]
    for bar in plan.bars:
        lines += bar_lines(plan, bar)
    what = (f"LoRA adapters only (lora.sync=adapter; {plan.models[0].adapters:,} of "
            f"{plan.models[0].params:,} params)"
            if models_of(cfg).engine_lora else
            "full weights, adapters merged (lora.sync=merged)" if cfg.lora.enabled else "full weights")
    where = (f"from rank {R} to the engines on {span(plan, 0, R)}, one FSDP2 unit at a time" if plan.split else
             "per engine rank before its TP cut")
    lines.append(f"SYNC per step: {plan.sync_bytes / GB:.4f} GB {where}, {what}")
    lines.append(checkpoint_line(plan))
    per_engine = cfg.rollout.prompts_per_step // engines * cfg.rollout.group_size
    lines.append(f"KV cache: {plan.kv_per_token:,} B/token per TP rank; {plan.kv_tokens:,} tokens fit = "
                 f"{plan.kv_tokens // plan.seq_len:,} sequences of {plan.seq_len} tokens "
                 f"(a step samples {per_engine} per engine)")
    if not plan.fits:
        lines.append(f"rlcore: does not fit: {plan.error()}")
    return "\n".join(lines)


def bar_lines(plan, bar) -> list[str]:
    """The bar's title, its parts and its total against the usable memory."""
    cfg, R = plan.cfg, plan.cfg.rollout.ranks
    title = f"{bar.name.upper()} bar per {'GPU' if plan.device == 'cuda' else 'rank'}"
    if plan.split:
        title += f", {span(plan, 0, R)}: an engine" if bar.name == "rollout" else \
            f", {span(plan, R, plan.world)}: the models"
    if bar.name in ("train", "trainer"):
        packed = cfg.train.max_tokens_per_micro_batch
        title += (f" (packed micro-batches of {plan.micro_tokens} tokens)" if packed else
                  f" (micro-batch {cfg.train.micro_batch_size} x {plan.seq_len} = {plan.micro_tokens} tokens)")
    lines = [title] + [f"  {name:<58} {b / GB:8.2f} GB" for name, b in bar.parts]
    total = "total" + (f" x {bar.ranks_sharing} ranks" if bar.ranks_sharing > 1 else "")
    others, _ = bar.neighbours
    if others:
        total += f" + {others} {'trainer' if bar.name == 'rollout' else 'rollout'} rank(s)"
    verdict = "fits" if bar.fits else f"DOES NOT FIT ({bar.short / GB:.1f} GB short)"
    return lines + [f"  {total:<58} {bar.used / GB:8.2f} GB  of {bar.limit / GB:.1f} usable: {verdict}"]


def span(plan, first: int, end: int) -> str:
    """ranks first..end-1, and on more than one node the nodes they are on."""
    text = f"ranks {first}-{end - 1}" if end - first > 1 else f"rank {first}"
    if plan.nnodes > 1:
        a, b = first // plan.nproc_per_node, (end - 1) // plan.nproc_per_node
        text += f" (node {a})" if a == b else f" (nodes {a}-{b})"
    return text


def checkpoint_line(plan) -> str:
    """A checkpoint's size and expected write time against the grace a preemption signal leaves (plan.py)."""
    t = plan.cfg.train
    every = f"every {t.save_every} steps and at the end" if t.save_every else "at the end only (train.save_every=0)"
    line = (f"CHECKPOINT {every}: {plan.checkpoint_bytes / 1e9:.1f} GB (trained weights + AdamW), ~"
            f"{plan.save_seconds:.0f} s at an assumed {plan.write_gb_s:g} GB/s per node; a signal leaves "
            f"{plan.grace_s} s (launch/slurm_node.sh) for the step in flight and the save")
    if not plan.save_fits_grace:
        line += (f"\nrlcore: warning: a checkpoint on preemption may not finish inside the grace: raise "
                 f"RLCORE_SHUTDOWN_TIMEOUT and --signal's lead in launch/slurm.sbatch, or rely on train.save_every "
                 f"(a preempted run resumes from the last periodic checkpoint)")
    return line
