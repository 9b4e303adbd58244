"""rlcore.sandbox: the warm pool vs a fresh process per call, same limits, a trivial snippet.

    python benchmarks/sandbox.py                     # prints the table
    python benchmarks/sandbox.py --rounds 5 --write  # and appends it to benchmarks/RESULTS.md

Per round, alternating, each contender runs `--calls` executions of `print(1 + 1)` from 2 threads:
  warm  one Sandbox(workers=2) for the whole run: a call is a fork of a warm worker (the pool's normal path)
  cold  a new Sandbox(workers=1) per call: a fresh `python -I` worker with the same setup (namespaces, user
        drop, limits, the worker's self-test), one execution, close; what a sandbox without a pool pays per call
A warm call is itself a fresh process tree (zygote fork, PID/mount/IPC namespaces, tmpfs, /proc): see
rlcore/sandbox/zygote.py.
executions/s is calls / wall time of the round (median over rounds); latency is each call's wall time as the
caller saw it (p50/p99 over all rounds; with 2 threads on 2 workers, contention included). Every result must
be "2\n", or the benchmark stops. Also one thread on the warm pool: the per-call overhead without contention.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402
from rlcore.sandbox import Sandbox, SandboxConfig  # noqa: E402

SNIPPET = "print(1 + 1)"


def measure(call, calls: int, threads: int) -> tuple[float, list[float]]:
    """(executions per second, per-call seconds) of `calls` calls spread over `threads` threads."""
    latencies: list[float] = []

    def loop(n: int) -> None:
        for _ in range(n):
            start = time.perf_counter()
            result = call()
            latencies.append(time.perf_counter() - start)
            if result.stdout != "2\n":
                raise SystemExit(f"wrong result: {result}")

    workers = [threading.Thread(target=loop, args=(calls // threads,)) for _ in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return len(latencies) / (time.perf_counter() - start), latencies


def cold_call(config: SandboxConfig):
    with Sandbox(config) as sandbox:
        return sandbox.run(SNIPPET)


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=400, help="warm executions per round")
    p.add_argument("--cold-calls", type=int, default=40, help="cold executions per round")
    p.add_argument("--write", action="store_true", help="append a section to benchmarks/RESULTS.md")
    args = p.parse_args()

    config = SandboxConfig(workers=2)
    pool = Sandbox(config)
    one = SandboxConfig(workers=1)
    rows = {"warm pool, 2 workers, 2 threads": ([], []), "cold, fresh process per call, 2 threads": ([], []),
            "warm pool, 1 thread (overhead alone)": ([], [])}
    names = list(rows)
    for r in range(args.rounds):
        for name, call, calls, threads in ((names[0], lambda: pool.run(SNIPPET), args.calls, 2),
                                           (names[1], lambda: cold_call(one), args.cold_calls, 2),
                                           (names[2], lambda: pool.run(SNIPPET), args.calls // 2, 1)):
            rate, latencies = measure(call, calls, threads)
            rows[name][0].append(rate)
            rows[name][1].extend(latencies)
            print(f"round {r + 1}: {name}: {rate:.1f} executions/s", flush=True)
    pool.close()

    status = pool.status
    active = ", ".join(f"{k}={v}" for k, v in status.items() if isinstance(v, bool))
    lines = [f"Sandbox status: {active}; limits as SandboxConfig's defaults (timeout 10 s, 512 MiB address space, "
             f"32 processes).",
             "The machine was shared with a full test-suite run and other work while this ran (load average "
             "above the 2 cores): absolute numbers are pessimistic, the ratio is the point.", "",
             "| path | executions/s (median of rounds) | p50 ms | p99 ms | calls |", "|---|---|---|---|---|"]
    for name, (rates, latencies) in rows.items():
        lines.append(f"| {name} | {common.median(rates):.0f} | {1e3 * percentile(latencies, 50):.1f} | "
                     f"{1e3 * percentile(latencies, 99):.1f} | {len(latencies)} |")
    warm, cold = common.median(rows[names[0]][0]), common.median(rows[names[1]][0])
    lines += ["", f"warm / cold executions/s: x{warm / cold:.1f}; goal >= 100 executions/s warm on 2 cores: "
                  f"{'met' if warm >= 100 else 'missed'} ({warm:.0f})"]
    command = "python benchmarks/sandbox.py " + " ".join(sys.argv[1:])
    title = f"sandbox: warm pool vs fresh process per call, `{SNIPPET}`, {args.rounds} alternating rounds"
    if args.write:
        common.write_section(title, command, lines)
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
