"""On paper: colocated vs split vs streaming for a 7B model on 8 and 64 GPUs, from the CPU measurements.

    python benchmarks/async_rl.py --on-paper

The assumptions are RESULTS.md's "on paper" sections: a 100 s colocated 7B step, 60 % generation, 40 %
training; phi = the share of generation that scales with the engines' count (the rest is the long tail's
latency); the transfer on both sides' path every step.
"""
from __future__ import annotations

GB_7B = 15.2  # Qwen2.5-7B in bf16


def on_paper(gen: float, train: float, sync_colocated: dict[int, float], transfer: dict[int, float],
             phis: list[float], occupancy: float = 1.0, frozen: dict[int, float] | None = None, lag: float = 1.25,
             period: float = 1.0):
    """Step seconds of colocated / split k=0 / split k=1 / streaming k on W GPUs from a colocated step of
    gen + train + sync_colocated[W] seconds (all W GPUs generate, then all train). Split with R engine GPUs:
    generation takes gen x (phi x W / R + 1 - phi), training train x W / (W - R), the transfer transfer[W] on
    both sides' path (the lockstep exchange). k=0: gen' + train' + transfer; k=1: max(gen', train') + transfer.

    Streaming refills the tail's slots, so its engines spend gen x phi x W / R / occupancy on a batch
    (`occupancy`: the engines' mean running share where the latency chain does not bound it), and the engine
    waits frozen[k] x train' a step for the weights at its load point (measured: the share of the trainer's step
    the engine waited). The latency chain: a batch's longest sample (latency gen x (1 - phi)) starts once
    the version k + 1 steps back has loaded, `lag` x train' after its hand-over, and must end by its own
    hand-over, so k + 1 steps take at least that latency + lag x train'. The trainers' period: the next
    hand-over comes after the load, so where something waits for the version (the two sides balanced, which is
    where the best R puts them) a step takes at least `period` x train': the load's time after its hand-over over
    the trainers' step (deterministic loads: the blocked margin, as this machine's steps meet auto's prediction;
    free loads: 1). R is the best of 1..W-1 for each. -> rows."""
    frozen = frozen or {1: 0.0, 2: 0.0}
    rows = []
    for W, x in transfer.items():
        colocated = gen + train + sync_colocated[W]
        for phi in phis:
            def split(R, k):
                g, t = gen * (phi * W / R + 1 - phi), train * W / (W - R)
                return (g + t if k == 0 else max(g, t)) + x

            def stream(R, k):
                g, t = gen * phi * W / R / occupancy, train * W / (W - R)
                return max(g + frozen[k] * t, period * t, (gen * (1 - phi) + lag * t) / (k + 1)) + x

            best = {f"k{k}": min(range(1, W), key=lambda R: split(R, k)) for k in (0, 1)}
            best |= {f"s{k}": min(range(1, W), key=lambda R: stream(R, k)) for k in frozen}
            seconds = {key: (split if key[0] == "k" else stream)(R, int(key[1])) for key, R in best.items()}
            rows.append({"W": W, "phi": phi, "colocated": colocated, "transfer": x, **seconds,
                         **{f"R{key}": R for key, R in best.items()}})
    return rows


def print_on_paper(occupancy: float = 1.0, frozen: dict[int, float] | None = None, lag: float = 1.25,
                   period: float = 1.0) -> list[str]:
    """The table (printed and returned): seconds a step (best R in brackets) and samples/s ratios."""
    rows = on_paper(60.0, 40.0, {8: 0.12, 64: 0.5}, {8: 0.12, 64: 6.0}, [1.0, 0.6, 0.25], occupancy, frozen, lag,
                    period)
    lines = ["| GPUs | phi | colocated s | split k=0 s (R) | split k=1 s (R) | stream k=1 s (R) | stream k=2 s (R) "
             "| k=1 / colocated | stream k=1 / split k=1 | stream k=2 / split k=1 | stream k=2 / colocated "
             "| transfer s (GB/s) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = " | ".join(f"{r[key]:.1f} ({r['R' + key]})" for key in ("k0", "k1", "s1", "s2"))
        lines.append(f"| {r['W']} | {r['phi']:.2f} | {r['colocated']:.1f} | {cells} | x{r['colocated'] / r['k1']:.2f} "
                     f"| x{r['k1'] / r['s1']:.2f} | x{r['k1'] / r['s2']:.2f} | x{r['colocated'] / r['s2']:.2f} "
                     f"| {r['transfer']:.2f} ({GB_7B / r['transfer']:.1f}) |")
    for line in lines:
        print(line)
    return lines
