"""Peak host memory per rank while the trainer loads and shards a model: whole on every rank, then fully_shard
(meta=False, the old path) vs each rank reading only its shards (meta=True, rlcore/models/load.py).

    python benchmarks/loading.py                      # 151M-parameter Qwen2, fp32, 2 ranks, 3 rounds
    python benchmarks/loading.py --rounds 5 --layers 24

The model is a random-init Qwen2 (hidden 768, 12 layers, vocab 32000, untied head; --layers, --hidden to
change), written once with save_pretrained (safetensors, fp32) into a temporary folder, deleted at the end.
Each measurement is one `torchrun --nproc-per-node 2` launch (fresh processes) that loads the policy as
rlcore.trainer does (models.shard(models.load_causal_lm(cfg))), fp32 on CPU, after a warm-up load of a tiny
Qwen2 the same way (its RSS growth, the imports the first load makes, is reported as the fixed overhead and kept
out of the peak). Peak = VmHWM after the load minus VmRSS just before it (VmHWM reset first by writing 5 to
/proc/self/clear_refs), per rank: resident memory, file pages mapped by the reads included. Contenders
alternate (old, new, old, new, ...) for --rounds rounds; medians over rounds of the larger rank's peak.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402

CONTENDERS = {"old": False, "new": True}  # name -> meta


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def worker(path: str, tiny: str, contender: str) -> None:
    import gc

    import torch.distributed as dist

    from rlcore.config import ModelConfig
    from rlcore.distributed.parallel import ParallelDims, build_meshes, init_distributed
    from rlcore.models import build as models

    init_distributed()
    mesh, _ = build_meshes(ParallelDims(dist.get_world_size(), 1))
    start = status_kb("VmRSS")
    small = ModelConfig(path=tiny, dtype="float32")
    models.shard(models.load_causal_lm(small, meta=CONTENDERS[contender]), mesh, small)  # warm-up: imports
    cfg = ModelConfig(path=path, dtype="float32")
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS now
    before = status_kb("VmRSS")
    t = time.perf_counter()
    policy = models.shard(models.load_causal_lm(cfg, meta=CONTENDERS[contender]), mesh, cfg)
    seconds = time.perf_counter() - t
    mine = {"peak_mb": (status_kb("VmHWM") - before) / 1024, "after_mb": (status_kb("VmRSS") - before) / 1024,
            "overhead_mb": (before - start) / 1024, "seconds": seconds,
            "local_mb": sum(p.to_local().numel() * 4 for p in policy.parameters()) / 2**20}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if dist.get_rank() == 0:
        print(json.dumps(every), flush=True)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--worker", nargs=3, metavar=("PATH", "TINY", "CONTENDER"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(*args.worker)
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    folder = Path(tempfile.mkdtemp(prefix="rlcore-loading-"))
    try:
        def qwen2(vocab, hidden, layers):
            return Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
                               num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=2,
                               tie_word_embeddings=False)

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(qwen2(args.vocab, args.hidden, args.layers))
        params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(folder / "model")
        del model
        AutoModelForCausalLM.from_config(qwen2(256, 128, 1)).save_pretrained(folder / "tiny")
        model_mb = params * 4 / 2**20
        env = os.environ | {"OMP_NUM_THREADS": "1",
                            "PYTHONPATH": str(common.ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        runs = {name: [] for name in CONTENDERS}
        for r in range(args.rounds):
            for name in CONTENDERS:
                cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                       __file__, "--worker", str(folder / "model"), str(folder / "tiny"), name]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if proc.returncode:
                    sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
                ranks = json.loads(proc.stdout.strip().splitlines()[-1])
                runs[name].append(ranks)
                print(f"round {r} {name}: peak per rank " + ", ".join(f"{x['peak_mb']:.0f}" for x in ranks)
                      + " MB, after " + ", ".join(f"{x['after_mb']:.0f}" for x in ranks)
                      + f" MB, {max(x['seconds'] for x in ranks):.1f} s; fixed overhead "
                      + ", ".join(f"{x['overhead_mb']:.0f}" for x in ranks) + " MB", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    peak = {n: common.median(max(x["peak_mb"] for x in ranks) for ranks in runs[n]) for n in CONTENDERS}
    print(f"\nMachine: {common.machine()}")
    print(f"Command: python benchmarks/loading.py {' '.join(sys.argv[1:])}")
    print(f"Model: random-init Qwen2, hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, untied: "
          f"{params / 1e6:.1f}M parameters, {model_mb:.0f} MB in fp32 (1/2 = {model_mb / 2:.0f} MB); world size 2, "
          f"CPU, gloo. Peak = VmHWM - VmRSS before the load, per rank; the larger rank; medians of {args.rounds}.\n")
    print("| path | peak MB per rank | peak / model | RSS after MB | seconds |\n|---|---|---|---|---|")
    for n in CONTENDERS:
        after = common.median(max(x["after_mb"] for x in ranks) for ranks in runs[n])
        seconds = common.median(max(x["seconds"] for x in ranks) for ranks in runs[n])
        print(f"| {n} (meta={CONTENDERS[n]}) | {peak[n]:,.0f} | {peak[n] / model_mb:.2f} | {after:,.0f} | "
              f"{seconds:.1f} |")
    print(f"\nnew / old peak: {peak['new'] / peak['old']:.3f}")


if __name__ == "__main__":
    main()
