"""The weight sync against a plain copy of the same bytes, with the all-gather overlapped and not.

    python benchmarks/sync.py                        # 25M and 50M random-init Qwen2, 2 ranks, TP=1 engines
    python benchmarks/sync.py --sizes 50M --repeats 9 --nproc 2 --tp 2

Relaunches itself under torchrun. Per size, in one run and alternating, each repeat times:
  copy          a plain copy of the model's bytes (every full tensor into a preallocated buffer, one rank):
                the machine's memory bandwidth for exactly these tensors, the yardstick
  gather        one all-gather of the same bytes (each rank holding 1/W) over the training process group:
                the transport's own floor (gloo over loopback on CPU, NCCL on GPUs)
  stream        the trainer side alone: all-gather every FSDP2 unit and copy it out (no engine)
  sync          RolloutEngine.sync_weights, overlapped (the default): stream + the engine's load + reprocessing
  sync-serial   the same with each unit's all-gather started only after the previous unit was handed over
Bandwidth is the model's bytes over the seconds; medians over the repeats. Writes a RESULTS.md section.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from rlcore import models
    from rlcore.config import Config, ModelConfig, RolloutConfig
    from rlcore.parallel import ParallelDims, build_meshes, init_distributed
    from rlcore.rollout import RolloutEngine
    from rlcore.weights import checkpoint_weights

    init_distributed()
    rank = dist.get_rank()
    results = {}
    for size in args.sizes:  # main() passes one
        path = common.random_model(size, max_positions=256)
        cfg = Config(model=ModelConfig(path=str(path)), rollout=RolloutConfig(tensor_parallel=args.tp,
                                                                               cpu_kv_cache_gb=0.25))
        fsdp_mesh, _ = build_meshes(ParallelDims(dist.get_world_size(), args.tp))
        engine = RolloutEngine(cfg, max_model_len=64)
        policy = models.shard(models.load_causal_lm(cfg.model), fsdp_mesh, cfg.model)
        full = [p.full_tensor().detach().clone() for p in policy.parameters()]
        nbytes = sum(t.numel() * t.element_size() for t in full)
        buffers = [torch.empty_like(t) for t in full]

        def copy():
            for src, dst in zip(full, buffers):
                dst.copy_(src)

        world = dist.get_world_size()
        shard = torch.empty(nbytes // 4 // world)
        gathered = torch.empty(shard.numel() * world)

        def gather():  # the transport alone: the model's bytes, all-gathered in one collective
            dist.all_gather_into_tensor(gathered, shard)

        def stream():
            for _ in checkpoint_weights(policy, dtype=engine.dtype):
                pass

        contenders = {"copy": copy, "gather": gather, "stream": stream, "sync": lambda: engine.sync_weights(policy),
                      "sync-serial": lambda: engine.sync_weights(policy, overlap=False)}
        times = {k: [] for k in contenders}
        for name, fn in contenders.items():  # warm-up
            fn()
        for _ in range(args.repeats):
            for name, fn in contenders.items():
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                dist.barrier()
                times[name].append(time.perf_counter() - t0)
        results[size] = {"params": common.param_count(path), "bytes": nbytes, "times": times}
        if args.profile:  # where one overlapped sync spends its time, by function (rank 0's view)
            import cProfile
            import io
            import pstats
            prof = cProfile.Profile()
            prof.runcall(engine.sync_weights, policy)
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
            if rank == 0:
                results[size]["profile"] = text.getvalue()
    if rank == 0:
        Path(args.out).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["25M", "50M"], choices=list(common.SIZES))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--out", default="")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one sync per size")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    for size in args.sizes:  # build outside the timed ranks
        common.random_model(size, max_positions=256)
    results = {}
    for size in args.sizes:  # one torchrun per size: a process holds one vLLM engine
        out = Path(args.out or f"/tmp/rlcore-sync-bench-{os.getpid()}.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
               __file__, "--worker", "--out", str(out), "--repeats", str(args.repeats), "--tp", str(args.tp),
               "--sizes", size, *(["--profile"] if args.profile else [])]
        env = os.environ | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        proc = subprocess.run(cmd, cwd=common.ROOT, env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"sync benchmark failed for {size}:\n{proc.stderr[-3000:]}")
        results |= json.loads(out.read_text())
        if args.profile:
            print(results[size]["profile"])
    lines = ["| model | params | MB | copy s | copy GB/s | gather s | stream s | sync s | sync GB/s "
             "| sync / copy bandwidth | sync / (gather + copy) bandwidth | sync-serial s | overlap saves |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for size, r in results.items():
        med = {k: common.median(v) for k, v in r["times"].items()}
        gb = r["bytes"] / 1e9
        lines.append(f"| {size} | {r['params'] / 1e6:.1f}M | {r['bytes'] / 1e6:.0f} | {med['copy']:.4f} | "
                     f"{gb / med['copy']:.2f} | {med['gather']:.4f} | {med['stream']:.4f} | {med['sync']:.4f} | "
                     f"{gb / med['sync']:.2f} | {med['copy'] / med['sync']:.0%} | "
                     f"{(med['gather'] + med['copy']) / med['sync']:.0%} | {med['sync-serial']:.4f} | "
                     f"{1 - med['sync'] / med['sync-serial']:+.0%} |")
    command = "python benchmarks/sync.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    common.write_section(f"weight sync vs a plain copy, {args.nproc} ranks, TP={args.tp}, "
                         f"medians of {args.repeats} alternating repeats", command, lines)


if __name__ == "__main__":
    main()
