"""The run summary: where the time went, per stage, and the peak memory per phase next to the plan.

Written when a run ends, and also when it stops on an error or a signal, to runs/<name>/summary.md and
printed on rank 0. Built from the metrics each step logged (already reduced over ranks), so writing it
needs no collective: a run stopping on one rank's error still gets its summary.

Stages, per step: generate (engine calls), environment (env.step calls), reward, logprobs (the trainer's
forward passes before the update), train (the update), sync (weights into the engines), then eval and
checkpoint, which run every few steps and are shown as their mean over all steps. Each stage's share is of
the step's wall time including eval and checkpoint; "other" is the rest of the step (batching, collectives).
The bottleneck is the stage with the largest share.
"""
from __future__ import annotations

import os
from pathlib import Path

# (stage, its time key, how its rate is computed: (numerator key, unit) or None)
STAGES = (
    ("generate", "time/generate_s", ("tokens/generated", "tok/s")),
    ("environment", "time/env_s", None),
    ("reward", "time/reward_s", ("tokens/sequences", "seq/s")),
    ("logprobs", "time/logprobs_s", ("tokens/batch", "tok/s")),
    ("train", "time/train_s", ("tokens/batch", "tok/s")),
    ("sync", "time/sync_s", ("sync/gb", "GB/s")),
    ("eval", "time/eval_s", None),
    ("checkpoint", "time/checkpoint_s", None),
)
IN_STEP = ("generate", "environment", "reward", "logprobs", "train", "sync")


class Summary:
    def __init__(self):
        self.steps: list[dict[str, float]] = []
        self.extra: dict[str, float] = {}  # eval before the first step, checkpoints: time outside step metrics
        self.mesh = ""  # the layout's first line: which ranks generate, which train

    def add(self, metrics: dict[str, float]) -> None:
        self.steps.append(dict(metrics))

    def stages(self) -> list[tuple[str, float, float, str]]:
        """[(stage, mean seconds per step, share of the step's wall time, rate)] for stages that ran."""
        steps = self.timed()
        n = len(steps)
        if not n:
            return []
        total = lambda key: sum(m.get(key, 0.0) for m in steps) + self.extra.get(key, 0.0) * n / len(self.steps)  # noqa: E731
        wall = total("time/step_s") + total("time/eval_s") + total("time/checkpoint_s")
        rows = []
        for stage, key, rate in STAGES:
            seconds = total(key)
            if not any(key in m for m in steps) and key not in self.extra:
                continue
            shown = ""
            if rate and seconds > 0:
                ran = [m for m in steps if m.get(key, 0.0) > 0 and rate[0] in m]
                amount, spent = sum(m[rate[0]] for m in ran), sum(m[key] for m in ran)
                # a stage that took under a millisecond a step (e.g. logprobs taken inside the update) has no rate
                shown = (f"{amount / spent:,.{3 if rate[1] == 'GB/s' else 0}f} {rate[1]}"
                         if spent > 1e-3 * len(ran) else "")
            rows.append((stage, seconds / n, seconds / max(wall, 1e-12), shown))
        inside = sum(s * n for name, s, _, _ in rows if name in IN_STEP)
        other = total("time/step_s") - inside
        if other > 0:
            rows.append(("other", other / n, other / max(wall, 1e-12), ""))
        return rows

    def timed(self) -> list[dict[str, float]]:
        """The steps the time table averages: all but the first when there are more than two (the first
        step warms up the engine and the allocator)."""
        return self.steps[1:] if len(self.steps) > 2 else self.steps

    def bottleneck(self) -> str:
        rows = [r for r in self.stages() if r[0] != "other"]
        return max(rows, key=lambda r: r[1])[0] if rows else ""

    def render(self, name: str, status: str) -> str:
        n, rows = len(self.steps), self.stages()
        last = self.steps[-1] if self.steps else {}
        lines = [f"# rlcore run summary: {name}", "", f"status: {status}", f"steps run: {n}"]
        lines += [f"mesh: {self.mesh.removeprefix('rlcore: ')}", ""] if self.mesh else [""]
        walls = [m for m in self.timed() if "time/wall_s" in m]
        if walls:  # a split mesh (rlcore/modes/split.py): the two sides overlap, each busy part of the wall time
            wall = sum(m["time/wall_s"] for m in walls)
            rollout = sum(m.get("time/collect_s", 0.0) for m in walls) / wall
            train = sum(m.get("time/step_s", 0.0) for m in walls) / wall
            frozen = sum(m.get("throughput/frozen_share", 0.0) * m["time/wall_s"] for m in walls) / wall
            lines += [f"split: {wall / len(walls):.3f} s of wall time per step; rollout ranks busy {100 * rollout:.0f}% "
                      f"(idle {100 * max(1 - rollout, 0):.0f}%), trainer ranks busy {100 * train:.0f}% (idle "
                      f"{100 * max(1 - train, 0):.0f}%)" + (f"; the engine frozen at its loads {100 * frozen:.1f}% "
                      f"(waiting for weights with requests in flight)" if any("throughput/frozen_share" in m
                                                                               for m in walls) else "")
                      + "; the stage shares below are of the trainer's step", ""]
        if rows:
            lines += ["| stage | mean s/step | share | rate |", "|---|---:|---:|---:|"]
            lines += [f"| {stage} | {s:.3f} | {100 * share:.1f}% | {rate} |" for stage, s, share, rate in rows]
            timed = self.timed()
            step = sum(m.get("time/step_s", 0.0) for m in timed) / len(timed)
            over = f"steps 2-{n}" if len(timed) < n else f"all {n} steps"
            lines += ["", f"step time: {step:.3f} s mean over {over}; bottleneck: **{self.bottleneck()}**", ""]
        peaks = [("generation", "memory/generate_peak_gb", "memory/plan_generation_gb"),
                 ("train", "memory/train_peak_gb", "memory/plan_train_gb")]
        measured = [(phase, max(m.get(k, 0.0) for m in self.steps), last.get(p)) for phase, k, p in peaks
                    if any(k in m for m in self.steps)]
        if measured:
            lines += ["| phase | peak GB (max over ranks and steps) | plan GB |", "|---|---:|---:|"]
            lines += [f"| {phase} | {peak:.2f} | {'' if plan is None else f'{plan:.2f}'} |"
                      for phase, peak, plan in measured]
            lines.append("")
        evals = {k: v for k, v in self.extra.items() if k.startswith("eval/")}
        evals |= {k: v for k, v in last.items() if k.startswith("eval/")}
        if evals:
            lines.append("eval: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(evals.items())))
        return "\n".join(lines).rstrip() + "\n"

    def write(self, run_dir: Path, name: str, status: str) -> str:
        """Write summary.md (atomically) and return its text."""
        text = self.render(name, status)
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / ".summary.md.tmp"
        tmp.write_text(text)
        os.replace(tmp, run_dir / "summary.md")
        return text
