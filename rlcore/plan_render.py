"""The launch plan as text: what `plan=true` (launch/train.py) and launch/plan.py print. The numbers are
rlcore/plan.py's: its Plan.render() calls `render` here, which reads the Plan and its Bars without importing
them (that would be an import circle)."""
from __future__ import annotations

GB = 2**30


def render(plan) -> str:
    cfg, w, k = plan.cfg, plan.world, plan.cfg.rollout.tensor_parallel
    unit = f"{plan.device} GPU" if plan.device == "cuda" else "CPU rank"
    where = (f"{plan.memory / GB:.1f} GB per GPU" if plan.device == "cuda" else
             f"host memory {plan.memory / GB:.1f} GB shared by {plan.nproc_per_node} ranks")
    groups = " ".join("[" + ",".join(map(str, range(g * k, g * k + k))) + "]" for g in range(w // k))
    lines = [f"rlcore plan: {cfg.name} on {plan.nnodes} node(s) x {plan.nproc_per_node} {unit}s; {where}",
             f"mesh: world {w}; FSDP over ranks 0-{w - 1}; {w // k} rollout group(s) x tp={k}: {groups}"]
    for role in ("actor", "critic", "reference"):
        if role == "reference" and cfg.lora.enabled and cfg.algorithm.needs_reference:
            lines.append(f"  {role:<9} the actor with its adapters off (LoRA): no copy")
        elif role not in {m.role for m in plan.models if m.role != "reward"}:
            lines.append(f"  {role:<9} none")
        for m in (m for m in plan.models if m.role == role):
            how = "trained, AdamW" if m.trained else "frozen" + (", offloaded to CPU" if m.offloaded else "")
            if m.adapters:
                how = (f"base frozen; LoRA r={cfg.lora.rank} adapters trained, AdamW: {m.adapters:,} params "
                       f"({100 * m.adapters / m.params:.2f}%)")
            lines.append(f"  {role:<9} {m.path}: {m.params / 1e9:.3f}B params ({m.params:,}), {how}, "
                         f"FSDP over {w} ranks ({m.shapes.layers} layer units + root)")
    lines += [f"  {'reward':<9} model {m.path}: {m.params / 1e9:.3f}B params ({m.params:,}), frozen"
              + (", offloaded to CPU" if m.offloaded else "") for m in plan.models if m.role == "reward"]
    lines += [f"  {'reward':<9} function {s.fn if isinstance(s.fn, str) else getattr(s.fn, '__name__', s.fn)}"
              for s in cfg.rewards if s.fn]
    for bar in (plan.train, plan.generation):
        lines.append(f"{bar.name.upper()} bar per {'GPU' if plan.device == 'cuda' else 'rank'}"
                     + (f" (micro-batch {cfg.train.micro_batch_size} x {plan.seq_len} = {plan.micro_tokens} tokens)"
                        if bar.name == "train" else ""))
        lines += [f"  {name:<58} {b / GB:8.2f} GB" for name, b in bar.parts]
        total = bar.total * bar.ranks_sharing
        verdict = "fits" if bar.fits else f"DOES NOT FIT ({bar.short / GB:.1f} GB short)"
        lines.append(f"  {'total' + (f' x {bar.ranks_sharing} ranks' if bar.ranks_sharing > 1 else ''):<58} "
                     f"{total / GB:8.2f} GB  of {bar.limit / GB:.1f} usable: {verdict}")
    what = (f"LoRA adapters only (lora.sync=adapter; {plan.models[0].adapters:,} of "
            f"{plan.models[0].params:,} params)"
            if cfg.lora.enabled and cfg.lora.sync == "adapter" else
            "full weights, adapters merged (lora.sync=merged)" if cfg.lora.enabled else "full weights")
    lines.append(f"SYNC per step: {plan.sync_bytes / GB:.4f} GB per engine rank before its TP cut, {what}")
    per_engine = cfg.rollout.prompts_per_step // (w // k) * cfg.rollout.group_size
    lines.append(f"KV cache: {plan.kv_per_token:,} B/token per TP rank; {plan.kv_tokens:,} tokens fit = "
                 f"{plan.kv_tokens // plan.seq_len:,} sequences of {plan.seq_len} tokens "
                 f"(a step samples {per_engine} per engine)")
    if not plan.fits:
        lines.append(f"rlcore: does not fit: {plan.error()}")
    return "\n".join(lines)
