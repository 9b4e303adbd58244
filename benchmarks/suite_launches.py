"""Where the slow tier's time goes, launch by launch: a summary of the log `RLCORE_LAUNCH_LOG=FILE make test` writes
(tests/conftest.py: one JSON line per launch with its test, kind, ranks, seconds, exit code, and whether torchrun
had to SIGKILL a rank its SIGTERM did not stop).

    RLCORE_LAUNCH_LOG=/tmp/launches.jsonl make test ARGS=--durations=0
    python benchmarks/suite_launches.py /tmp/launches.jsonl [--top 10]

Kinds: "fresh" (a new torchrun job: train_cmd / torchrun), "shared start" (a run that starts the shared launch of its
rank count first), "shared" (a run in the shared launch already up). Prints markdown tables.
"""
import argparse
import collections
import json
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log", type=Path)
    p.add_argument("--top", type=int, default=10, help="the longest fresh launches to list")
    args = p.parse_args()
    rows = [json.loads(line) for line in args.log.read_text().splitlines() if line.strip()]
    groups = collections.defaultdict(list)
    for r in rows:
        groups[(r["kind"], r["nproc"])].append(r["s"])
    print("| kind | ranks | launches | seconds | mean s |\n|---|---:|---:|---:|---:|")
    for (kind, nproc), times in sorted(groups.items()):
        print(f"| {kind} | {nproc} | {len(times)} | {sum(times):.1f} | {sum(times) / len(times):.1f} |")
    total = sum(r["s"] for r in rows)
    fresh = [r for r in rows if r["kind"] == "fresh"]
    print(f"\n{len(rows)} launches, {total:.1f} s; fresh {len(fresh)} ({sum(r['s'] for r in fresh):.1f} s, "
          f"{sum(r['code'] == 0 for r in fresh)} of them exit 0); torchrun forced a rank in "
          f"{sum(r.get('forced', False) for r in rows)}")
    print(f"\n| the {args.top} longest fresh launches | ranks | s | exit |\n|---|---:|---:|---:|")
    for r in sorted(fresh, key=lambda r: -r["s"])[:args.top]:
        test = r["test"].split("::", 1)[-1].removesuffix(" (call)")
        print(f"| `{test[:90]}` | {r['nproc']} | {r['s']:.1f} | {r['code']} |")


if __name__ == "__main__":
    main()
