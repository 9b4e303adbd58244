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
With --split (the split mesh, rlcore/modes/split.py, rollout.ranks = nproc - 1: ranks [0, R) engines, rank R the
trainer, here holding the whole model in its own one-rank FSDP group), also:
  bcast         one broadcast of the same bytes from rank R to the rollout ranks (the transfer group): the floor
  xfer          transfer.send_weights / receive_weights with the engine's load replaced by draining the stream:
                per-unit headers (gloo, pickled) + one broadcast per dtype per unit, no reload
  split         transfer.send_weights / receive_weights into the live engines (the split mesh's transfer)
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

    from rlcore.config import Config, ModelConfig, RolloutConfig
    from rlcore.distributed.parallel import ParallelDims, build_meshes, init_distributed
    from rlcore.engine import RolloutEngine
    from rlcore.models import build as models
    from rlcore.models.weights import checkpoint_weights

    init_distributed()
    rank = dist.get_rank()
    world = dist.get_world_size()
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

        shard = torch.empty(nbytes // 4 // world)
        gathered = torch.empty(shard.numel() * world)

        def gather():  # the transport alone: the model's bytes, all-gathered in one collective
            dist.all_gather_into_tensor(gathered, shard)

        def stream():
            for _ in checkpoint_weights(policy, dtype=engine.dtype):
                pass

        contenders = {"copy": copy, "gather": gather, "stream": stream, "sync": lambda: engine.sync_weights(policy),
                      "sync-serial": lambda: engine.sync_weights(policy, overlap=False)}
        if args.split:
            contenders |= split_contenders(cfg, engine, nbytes, world, rank)
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


def split_contenders(cfg, engine, nbytes: int, world: int, rank: int) -> dict:
    """The split mesh's transfer on the same ranks: rollout ranks [0, world - 1), trainer rank world - 1."""
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist

    from rlcore.distributed.parallel import ParallelDims, build_meshes
    from rlcore.models import build as models
    from rlcore.modes import transfer
    R = world - 1
    trainer_mesh, _ = build_meshes(ParallelDims(world, 1, R))  # collective: the trainers' own FSDP group
    link = transfer.Link.make(R, world)
    trains = rank >= R
    policy = models.shard(models.load_causal_lm(cfg.model), trainer_mesh, cfg.model) if trains else None
    run = SimpleNamespace(trainer=SimpleNamespace(policy=policy) if trains else None, engine=engine)
    drain = SimpleNamespace(load=lambda weights: [None for _ in weights], version=0, dtype=engine.dtype)
    buf = torch.empty(nbytes // 4)
    header = {"version": 1, "metrics": {}, "probe": None, "error": None}

    def transfer(into):
        if trains:
            transfer.send_weights(run, link, header)
        else:
            transfer.receive_weights(SimpleNamespace(engine=into), link)

    return {"bcast": lambda: dist.broadcast(buf, src=R, group=link.weights),
            "xfer": lambda: transfer(drain), "split": lambda: transfer(engine)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["25M", "50M"], choices=list(common.SIZES))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--out", default="")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one sync per size")
    parser.add_argument("--split", action="store_true", help="also the split mesh's transfer (see the docstring)")
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
               "--sizes", size, *(["--profile"] if args.profile else []), *(["--split"] if args.split else [])]
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
    if args.split:  # the split mesh's transfer against the colocated sync and a bare broadcast, same bytes
        lines += ["", f"Split mesh ({args.nproc - 1} rollout rank(s) + trainer rank {args.nproc - 1}):", "",
                  "| model | MB | bcast s | bcast GB/s | xfer s | xfer GB/s | split s | split GB/s | colocated sync s "
                  "| split / sync time | split / bcast time | xfer / bcast time |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for size, r in results.items():
            med = {k: common.median(v) for k, v in r["times"].items()}
            gb = r["bytes"] / 1e9
            lines.append(f"| {size} | {r['bytes'] / 1e6:.0f} | {med['bcast']:.4f} | {gb / med['bcast']:.2f} | "
                         f"{med['xfer']:.4f} | {gb / med['xfer']:.2f} | {med['split']:.4f} | {gb / med['split']:.2f} | "
                         f"{med['sync']:.4f} | x{med['split'] / med['sync']:.2f} | x{med['split'] / med['bcast']:.2f} | "
                         f"x{med['xfer'] / med['bcast']:.2f} |")
    command = "python benchmarks/sync.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    common.write_section(f"weight sync vs a plain copy, {args.nproc} ranks, TP={args.tp}, "
                         f"medians of {args.repeats} alternating repeats", command, lines)


if __name__ == "__main__":
    main()
