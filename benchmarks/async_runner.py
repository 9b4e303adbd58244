"""benchmarks/async_rl.py's runner: one pinned torchrun run of a contender, its per-step numbers, the table.

A run is a real `torchrun launch/train.py` of --steps steps; this script stamps each step's log line as it
arrives (polling metrics.jsonl) and keeps steps 3..N-1 (1-2 are warm-up and the pipeline filling; the last
line may be stamped at exit). Per kept step, from rank 0's metrics:
  step wall s       the time between two consecutive log lines: the pipeline's period; samples/s = a run's
                    sequences over its measured wall time (median over runs; streaming's steps alternate
                    between short and long, so a median step would mislead)
  engine busy       the rollout side's time making a batch over the wall: time/collect_s (split),
                    time/generate_s + time/env_s + time/reward_s (colocated), 1 - time/weights_wait_s /
                    time/wall_s (streaming: the engine loop never stops except to wait for weights)
  trainer busy      (time/step_s + time/sync_s) / wall (colocated: its logprobs + update + sync)
  occupancy         mean running sequences per engine step over the engine's maximum (idle shares and
                    occupancy: over all kept steps together, weighted by wall time or engine steps). Streaming: measured
                    (stream/occupancy); throughput/occupancy_wall weighs each engine step by its wall time
                    (waits count as empty). Batch modes: from the workload (see occupancy_batch), times the
                    engine's busy share for the wall-weighted value.
  sync s            time/sync_s (split, streaming: the engine rank's receive + in-place reload)
  frozen            streaming: throughput/frozen_share, the engine's wall time waiting for weights with requests
                    in flight (over all kept steps, wall-weighted); with the load lag (stream/lag_steps, or auto's
                    stream/lag_s), the engine steps a load came after its hand-over (stream/load_lag) and the
                    prefill tokens a load recomputes (stream/recomputed_tokens), medians; and how many loads came
                    under requests in flight before auto's lag, at its blocked margin (stream/load_blocked)
Medians over the kept steps of all rounds.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def run_once(workload: list[str], overrides: list[str], out_dir: Path, nproc: int, steps: int, pin: bool) -> dict:
    """One torchrun run -> {"rows": the kept steps' metrics with their wall_s, "pinned": ranks pinned}."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "launch/train.py", *workload, *overrides, f"train.steps={steps}", f"output_dir={out_dir}", "name=bench"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    log = open(out_dir / "stdout.txt", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    pinned = pin_ranks(proc, nproc, sorted(os.sched_getaffinity(0)), time.time() + 60) if pin else 0
    metrics, arrivals, seen = out_dir / "bench" / "metrics.jsonl", [], 0
    while proc.poll() is None:  # each step's log line, stamped as it arrives
        if metrics.exists():
            text = metrics.read_text()
            lines = text[:text.rfind("\n") + 1].splitlines()  # whole lines: the run may be writing the next one
            for line in lines[seen:]:
                if line.strip():
                    arrivals.append((json.loads(line), time.perf_counter()))
            seen = len(lines)
        time.sleep(0.02)
    if proc.returncode:
        sys.exit(f"async_rl run {overrides} failed (exit {proc.returncode}): see {out_dir / 'stdout.txt'}\n"
                 + (out_dir / "stdout.txt").read_text()[-3000:])
    auto = re.findall(r"rlcore: rollout.load_lag_steps=auto: each version .*", (out_dir / "stdout.txt").read_text())
    if auto:
        print(f"  {auto[0]}", flush=True)
    stamped = [(m, t) for m, t in arrivals if m["step"] >= 1]
    rows = [m | {"wall_s": t1 - t0} for (_, t0), (m, t1) in zip(stamped, stamped[1:]) if 3 <= m["step"] < steps]
    return {"rows": rows, "pinned": pinned}


def summarise(rows: list[dict], occupancy_batch: float, overlap: bool) -> dict:
    """Medians of the per-step numbers (module docstring); occupancy_batch: the batch modes' per engine step;
    overlap: whether the two sides run at once (split k >= 1, streaming), for the bound."""
    from benchmarks.common import median
    per = []
    for m in rows:
        wall = m["wall_s"]
        split = "time/collect_s" in m or "stream/occupancy" in m  # the trainer ranks' own step
        train = m["time/step_s"] if split else m["time/logprobs_s"] + m["time/train_s"]
        if "stream/occupancy" in m:
            engine = 1 - m["time/weights_wait_s"] / m["time/wall_s"]
            occ, occ_wall = m["stream/occupancy"], m["throughput/occupancy_wall"]
        else:
            making = m.get("time/collect_s", m["time/generate_s"] + m.get("time/env_s", 0.0) + m.get("time/reward_s", 0.0))
            engine = min(1.0, making / wall)
            occ, occ_wall = occupancy_batch, occupancy_batch * engine
        busy_e, busy_t = engine * wall, train + m["time/sync_s"]
        # Both sides at their measured busy times with no wait but the other's (overlapped: the longer side).
        bound = max(busy_e, busy_t) if overlap else busy_e + busy_t
        per.append({"wall": wall, "sps": m["tokens/sequences"] / wall, "bound_sps": m["tokens/sequences"] / bound,
                    "train": train, "sync": m["time/sync_s"],
                    "engine_idle": max(0.0, 1 - engine), "trainer_idle": max(0.0, 1 - (train + m["time/sync_s"]) / wall),
                    "occ": occ, "occ_wall": occ_wall, "dropped": m.get("async/dropped_samples", 0),
                    "len_mean": m["response/length_mean"], "staleness": m.get("async/staleness_mean", 0.0),
                    "token_staleness_max": m.get("async/token_staleness_max", m.get("async/staleness_max", 0.0)),
                    "versions": m.get("async/versions_per_sample", 1.0), "is_mean": m.get("policy/is_weight_mean", 1.0),
                    "wait_s": m.get("time/weights_wait_s", float("nan")), "engine_steps": m.get("stream/engine_steps", 0),
                    "step_ms": 1e3 * busy_e / max(m.get("stream/engine_steps", 0), 1),
                    "wait_of_train": m.get("time/weights_wait_s", float("nan")) / train,
                    "frozen": m.get("throughput/frozen_share", 0.0), "lag": m.get("stream/lag_steps", -1),
                    "lag_s": m.get("stream/lag_s", -1), "load_lag": m.get("stream/load_lag", -1),
                    "recomputed": m.get("stream/recomputed_tokens", 0),
                    # a load under requests in flight before the lag, at the blocked margin's (something waited for it)
                    "early": int(m.get("stream/load_blocked", 0) and m.get("stream/recomputed_tokens", 0) > 0
                                 and 0 <= m.get("stream/lag_spent_s", -1) < m.get("stream/lag_s", -1))})
    med = {k: median(p[k] for p in per) for k in per[0]}
    # A streaming pipeline's steps take turns being short and long, so samples/s is each run's sequences over its
    # measured wall time (the median over runs), and the step wall that run's mean.
    runs, run = [], []
    for m in rows:
        if run and m["step"] <= run[-1]["step"]:
            runs.append(run)
            run = []
        run.append(m)
    runs.append(run)
    med["sps"] = median(sum(m["tokens/sequences"] for m in r) / sum(m["wall_s"] for m in r) for r in runs)
    # Shares and occupancy over all kept steps together (time-weighted), for the same reason.
    wall = sum(p["wall"] for p in per)
    med["engine_idle"] = sum(p["engine_idle"] * p["wall"] for p in per) / wall
    med["trainer_idle"] = sum(p["trainer_idle"] * p["wall"] for p in per) / wall
    med["occ_wall"] = sum(p["occ_wall"] * p["wall"] for p in per) / wall
    med["frozen"] = sum(p["frozen"] * p["wall"] for p in per) / wall
    if any(p["engine_steps"] for p in per):
        med["occ"] = sum(p["occ"] * p["engine_steps"] for p in per) / sum(p["engine_steps"] for p in per)
        med["step_ms"] = sum(p["step_ms"] * p["engine_steps"] for p in per) / sum(p["engine_steps"] for p in per)
        # engine steps a batch: loads and hand-overs alternate, so the steps between two loads take turns being
        # few and many (181, 427, ...); their mean is the steps a batch costs in steady state
        med["engine_steps"] = sum(p["engine_steps"] for p in per) / len(per)
    med["wall"] = median(sum(m["wall_s"] for m in r) / len(r) for r in runs)
    med["dropped"] = sum(p["dropped"] for p in per)
    med["early"] = sum(p["early"] for p in per)
    med["n"] = len(per)
    # auto's step model against this machine: the measured time of the steps before each load over their prediction
    taken = [m["time/lag_taken_s"] / m["stream/lag_spent_s"] for m in rows
             if "time/lag_taken_s" in m and m.get("stream/lag_spent_s", -1) > 0]
    med["taken_of_spent"] = median(taken) if taken else -1
    # the trainers' period where something waited for the version: the next hand-over follows the load, which came
    # these seconds after its hand-over, while the trainers took time/step_s (the on-paper table's --period)
    period = [m["time/lag_taken_s"] / m["time/step_s"] for m in rows
              if m.get("stream/load_blocked") and m.get("stream/lag_spent_s", -1) >= 0 and m.get("time/step_s")]
    med["period"] = median(period) if period else -1
    # the early hand-over: the trainers' step plus their wait at the engine's load point that they joined inside it,
    # over their step (the transfer itself is the on-paper table's own term)
    joined = [m for m in rows if "time/load_join_wait_s" in m and m.get("time/step_s")]
    med["join_wait"] = median(m["time/load_join_wait_s"] for m in joined) if joined else -1
    med["period_early"] = median(1 + m["time/load_join_wait_s"] / m["time/step_s"] for m in joined) if joined else -1
    med["joined"] = len(joined)
    return med


def table(meds: dict[str, dict]) -> list[str]:
    lines = ["| contender | steps | samples/s | step wall s | train s | engine idle | trainer idle | occupancy "
             "(per step) | occupancy (wall) | dropped | sync s | resp len mean | staleness mean / token max "
             "| versions per sample | IS weight mean | bound samples/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c, m in meds.items():
        lines.append(f"| {c} | {m['n']} | {m['sps']:.2f} | {m['wall']:.2f} | {m['train']:.2f} | {m['engine_idle']:.0%} | "
                     f"{m['trainer_idle']:.0%} | {pct(m['occ'])} | {pct(m['occ_wall'])} | {m['dropped']:.0f} | "
                     f"{m['sync']:.3f} | {m['len_mean']:.0f} | {m['staleness']:.2f} / {m['token_staleness_max']:.0f} "
                     f"| {m['versions']:.2f} | {m['is_mean']:.4f} | {m['bound_sps']:.2f} |")
    return lines


def command_line() -> str:
    return "flock /tmp/rlcore-heavy.lock python benchmarks/async_rl.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def pct(x: float) -> str:
    return "-" if x != x else f"{x:.0%}"


def report(results: dict[str, list[dict]], occupancy_batch: float) -> list[str]:
    """The table, the ratios to split k=1 and colocated, and the synchronous step's shares; printed and returned."""
    meds = {c: summarise(rows, occupancy_batch, overlap=c not in ("colocated", "split k=0"))
            for c, rows in results.items() if rows}
    lines = table(meds) + [""]
    for base in ("split k=1", "colocated"):
        if base in meds:
            lines += [f"- {c} / {base} samples/s: x{m['sps'] / meds[base]['sps']:.2f}" for c, m in meds.items() if c != base]
    for c, m in meds.items():
        if m["engine_steps"]:
            lines.append(f"- {c}: the engine waited {m['wait_s']:.2f} s a step for the weights at its load point "
                         f"({m['wait_of_train']:.0%} of the trainer's step), frozen (waiting with requests in flight) "
                         f"{m['frozen']:.1%} of its wall time; {m['engine_steps']:.0f} engine steps a step, "
                         f"{m['step_ms']:.1f} ms each; {lag(m)}, {m['recomputed']:.0f} prefill tokens recomputed a "
                         f"load; {steady(c, results[c])}")
    if "colocated" in meds:
        m = meds["colocated"]
        lines.append(f"- shares of the synchronous (colocated) step: generation {m['trainer_idle']:.0%} (everything "
                     f"but its logprobs + update + sync), training {1 - m['trainer_idle']:.0%}")
    for line in lines:
        print(line)
    return lines


def steady(contender: str, rows: list[dict]) -> str:
    """Streaming's occupancy in steady state, and its slots held (trajectories in flight, running or waiting for
    their environment's answer): per engine step, over the kept steps v with v + k <= the run's steps.
    The row of step v covers the engine steps from load v - 1 to load v, when admission may start batches up to
    v + k; past the run's last batch the engine drains (the pipeline's end, not its steady state)."""
    k, last = int(re.search(r"k=(\d+)", contender)[1]), max(r["step"] for r in rows)  # run_once keeps 3..steps-1
    kept = [r for r in rows if r["step"] + k <= last + 1]
    if not kept:
        return "occupancy in steady state: no kept step before the drain (more --steps)"
    steps = sum(r["stream/engine_steps"] for r in kept)
    occ = sum(r["stream/occupancy"] * r["stream/engine_steps"] for r in kept) / steps
    held = sum(r.get("stream/slots_held", float("nan")) * r["stream/engine_steps"] for r in kept) / steps
    first = min(r["step"] for r in kept)
    return (f"occupancy in steady state {occ:.0%}, slots held {held:.0%} (running or waiting for their tool; steps "
            f"{first}-{last + 1 - k}: the drain left out)")


def lag(m: dict) -> str:
    """The load point of a streaming contender, as its medians say it."""
    if m["lag_s"] > 0:
        took = f", its steps took x{m['taken_of_spent']:.2f} their predicted time" if m["taken_of_spent"] > 0 else ""
        if m["period"] > 0:
            took += (f"; where something waited for the version it loaded x{m['period']:.2f} the trainers' step after "
                     f"its hand-over (--period on paper)")
        if m["period_early"] > 0:
            took += (f"; the trainers joined {m['joined']:.0f} loads inside their next step and waited "
                     f"{m['join_wait'] * 1e3:.0f} ms there, a period of x{m['period_early']:.3f} their step (--period "
                     f"on paper)")
        return (f"auto's lag {m['lag_s']:.2f} s of predicted engine time, loads {m['load_lag']:.0f} engine steps after "
                f"({m['early']:.0f} of {m['n']} under requests in flight before it, at the blocked margin){took}")
    if m["lag"] >= 0:
        return f"load lag {m['lag']:.0f} engine steps"
    return "loads on arrival (free) or at the earliest point (auto measuring)"
