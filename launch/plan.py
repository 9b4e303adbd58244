"""Print a recipe's launch plan: the mesh, the four models, and per-GPU train and generation memory bars.

    python launch/plan.py recipe=grpo --nproc-per-node 8                    # this machine's GPU memory
    python launch/plan.py recipe=grpo --nproc-per-node 8 --gpu-memory-gb 80 rollout.tensor_parallel=1
    python launch/plan.py recipe=grpo --nproc-per-node 8 --nnodes 4 --gpu-memory-gb 80 model.path=/models/qwen-7b
    python launch/plan.py recipe=grpo --nproc-per-node 8 --gpu-memory-gb 80 rollout.ranks=4  # split mesh
    python launch/plan.py recipe=demo --nproc-per-node 2                    # no GPU: against host memory
    python launch/plan.py recipe=grpo --help                                # and every config key of the recipe

No process group, no GPU and no weights: each model's sizes come from its class built on the meta device from
its config.json (a local folder or the hub cache; rlcore/preflight/shapes.py); formulas in
rlcore/preflight/plan.py. A split mesh (rollout.ranks=R > 0) has a rollout bar (ranks [0, R)) and a trainer bar
(the other ranks) instead. The same plan from the training entry point:
    torchrun --nproc-per-node 8 launch/train.py recipe=grpo plan=true
Exit codes: 0 the plan fits; 1 a bar does not fit (the last line names it and the levers); 2 bad input.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a checkout runs without `pip install -e .`

from rlcore.config import help as config_help  # noqa: E402
from rlcore.config.cli import parse_argv  # noqa: E402
from rlcore.preflight import plan  # noqa: E402


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False, usage="%(prog)s "
                                     "recipe=NAME [key=value ...] --nproc-per-node N [--nnodes M] [--gpu-memory-gb G]")
    parser.add_argument("--nproc-per-node", type=int, required=True, help="ranks (GPUs) per node")
    parser.add_argument("--nnodes", type=int, default=1, help="nodes")
    parser.add_argument("--gpu-memory-gb", type=float, default=None,
                        help="memory per GPU, GB (2**30 bytes); default: this machine's GPU, else the host (CPU)")
    parser.add_argument("-h", "--help", action="store_true", help="this usage; with recipe=NAME, its config keys")
    if "--help" in argv or "-h" in argv:
        try:
            print(config_help.help_text(argv, ROOT / "recipes", __doc__ + "\n" + parser.format_help()))
        except ValueError as e:
            print(f"rlcore: error: {e}", file=sys.stderr)
            return 2
        return 0
    args, overrides = parser.parse_known_args(argv)
    try:
        for name, value in (("--nproc-per-node", args.nproc_per_node), ("--nnodes", args.nnodes),
                            ("--gpu-memory-gb", args.gpu_memory_gb)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 (got {value})")
        result = plan.build(parse_argv(overrides, ROOT / "recipes"), args.nproc_per_node, args.nnodes,
                            args.gpu_memory_gb)
    except ValueError as e:
        if os.environ.get("RLCORE_DEBUG"):
            traceback.print_exc()
        print(f"rlcore: error: {e}", file=sys.stderr)
        return 2
    print(result.render())
    return 0 if result.fits else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
