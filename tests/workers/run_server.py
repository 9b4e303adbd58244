"""One warm torchrun job that runs launch/train.py's main(argv), or a test's worker script, for run after run: the
slow tier's shared launch.

A fresh `torchrun launch/train.py` costs ~11 s on these 2 cores before its first step and after its last (torchrun,
Python, torch, transformers and vLLM imports, the engine's first build); in this job the second and later runs
start in ~2 s. Each run is the real entry point on every rank: its own process groups (a fresh TCPStore on a port
the request names), its own engines, FSDP2 and run folder, all gone when main() returns, as in a new launch.

Requests are files in the folder given as argv[1]: `req-N.json` ({"argv": [...], "env": {...}, "path": [...],
"port": P}, with "script": a worker to run instead of main(), or {"quit": true}); every rank runs request N with its stdout and stderr (file descriptors 1 and 2, so
C++ and library output too) in `out-N-rankR.txt`, then writes `res-N-rankR.json` ({"code": exit code, "left": what the
run left behind in the process, as `left_behind` says it}).
A run that did not exit 0 keeps the job only when it left nothing behind on any rank that a finished run does not
leave (`left_behind`: no thread, child process, signal handler or process group that was not there before it, and no
more open files of a kind than a finished run of the job left; `cleanup` has shut its engines down): the runs that
stop with one error every rank raised together, as bad input and a run's own checks do. Otherwise (a process group left open, an engine half built,
a thread still waiting) the job ends once every rank has written its result, and the next run starts a new one: a
failed run's state never reaches the next run.
"""
import collections
import gc
import json
import os
import re
import runpy
import signal
import sys
import threading
import time
from pathlib import Path

import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "launch"))
import train as entry  # noqa: E402  (launch/train.py)

from rlcore.engine import support  # noqa: E402
from warm import exit_code, isolated  # noqa: E402  (tests/workers/warm.py)

def wait_for(path: Path) -> dict:
    while not path.exists():
        time.sleep(0.02)
    return json.loads(path.read_text())


def run(request: dict, out: Path, err: Path) -> int:
    """main(argv), or the request's worker script, with the request's environment and import path (tests/workers/
    warm.py), fds 1 and 2 in `out` and `err`; all put back after."""
    # A fresh rendezvous per run, as a new launch has: torchrun's own store would hand this run the previous run's
    # process-group addresses (the group names restart at 0 after destroy_process_group).
    # RLCORE_SHARED_LAUNCH: a worker script that would leave the process at its end (os._exit) returns instead.
    env = request.get("env", {}) | {"TORCHELASTIC_USE_AGENT_STORE": "False", "MASTER_PORT": str(request["port"]),
                                    "RLCORE_SHARED_LAUNCH": "1"}
    path = request.get("path", []) + ([str(Path(request["script"]).parent)] if "script" in request else [])
    saved = os.dup(1), os.dup(2)
    with isolated(env, path):
        sys.stdout.flush()
        sys.stderr.flush()
        with open(out, "w") as o, open(err, "w") as e:
            os.dup2(o.fileno(), 1)
            os.dup2(e.fileno(), 2)
        try:
            code = exit_code(lambda: script(request) if "script" in request else entry.main(request["argv"]))
            # The run's garbage goes now, engines included: vLLM's shutdown of an engine destroys the process groups
            # it finds, which must be this run's (gone already, or left by a worker script), never the next run's.
            cleaned = exit_code(cleanup)
            code = code or cleaned
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    return code


def script(request: dict) -> None:
    """A test's worker script, as `torchrun script argv` would run it."""
    sys.argv = [request["script"], *request["argv"]]
    runpy.run_path(request["script"], run_name="__main__")


def cleanup() -> None:
    support.shut_engines()  # a run that left without leave_process_groups (an error on this rank alone)
    gc.unfreeze()  # what the run's engine build froze (rlcore.engine.rollout_engine): collected, and seen below
    gc.collect()
    shut = shut_stray_engines()
    if dist.is_initialized():
        support.leave_process_groups()
        shut = True
    unlink_own_cpu_shm()
    if shut:  # engines shut down just now: theirs goes before the heap is frozen
        gc.collect()
    gc.freeze()  # the job's long-lived heap: the next run's engine build collects only what is new


def lighter_engine_starts_and_ends() -> None:
    """Two things vLLM does at every engine build or shutdown that a job building one engine a run need not repeat
    (a 2-step demo run in this job, request to result: 5.11 -> 3.34 s, `benchmarks/launch.py --shared 8`):
    - On CPU, vLLM binds its Triton kernels' C++ overrides by scanning every loaded module's namespace at each
      engine build (~0.5-1 s with torch, transformers and vLLM loaded). The job's first build binds them for the
      process; a later one would only wrap the first wrapper.
    - An engine's shutdown unfreezes the heap and collects all of it twice (~0.6 s each). cleanup() collects it
      after the run instead, before anything reads what the run left, and freezes it again."""
    import types

    import vllm.distributed.parallel_state
    import vllm.v1.engine.core
    import vllm.v1.worker.gpu_model_runner
    from vllm.platforms.cpu import CpuPlatform

    bind = CpuPlatform.register_triton_kernel_overrides
    bound = []

    def bind_once(cls) -> None:
        if not bound:
            bind()
            bound.append(True)

    CpuPlatform.register_triton_kernel_overrides = classmethod(bind_once)
    no_collect = types.SimpleNamespace(**{name: getattr(gc, name) for name in dir(gc) if not name.startswith("_")})
    no_collect.collect = lambda generation=2: 0
    for module in (vllm.v1.engine.core, vllm.distributed.parallel_state, vllm.v1.worker.gpu_model_runner):
        module.gc = no_collect


def shut_stray_engines() -> bool:
    """An engine still reachable after its run would be shut down whenever the collector next finds it, maybe in the
    middle of the next run, and vLLM's shutdown destroys the process groups it finds then: the next run's (CI saw
    "world group is not initialized" so). An import made while an engine starts can fail inside a library that
    keeps the error: its traceback keeps the finished frames of that start, and they keep the engine. Each engine still
    alive is shut down now, with its own finalizer, while the groups it finds are this run's. True if there was one."""
    strays = [o for o in gc.get_objects() if type(o).__name__ == "InprocClient"
              and getattr(o, "_finalizer", None) is not None and o._finalizer.alive]
    for client in strays:
        client._finalizer()
    return bool(strays)


def unlink_own_cpu_shm() -> None:
    """vLLM's CPU tensor-parallel segments (/dev/shm/-tp:0-[0-1]-cpushm_0, ...) stay mapped in this process after its
    engine is gone, under names a new launch's first TP=2 engine uses too: one this process maps is no stale one to
    that engine (rlcore.engine.device.remove_stale_cpu_shm), and its creation would fail (errno 17). The names go
    now; the mappings, unused, stay until the job ends."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split(maxsplit=5)[-1]
        if path.startswith("/dev/shm/") and "cpushm" in path and not path.endswith("(deleted)"):
            Path(path).unlink(missing_ok=True)


SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def state() -> dict:
    """What a run could leave behind in this process, each as a set of names. (No engine: cleanup() has shut down
    every one still alive, held or stray, before this is read.)"""
    children = set()
    for task in Path("/proc/self/task").iterdir():
        children |= set((task / "children").read_text().split())
    return {"threads": {f"{t.name} ({t.ident})" for t in threading.enumerate()},
            "child processes": {f"{pid} {command(pid)}" for pid in children},
            "open files": {f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}" for fd in os.listdir("/proc/self/fd")
                           if os.path.exists(f"/proc/self/fd/{fd}")},
            "signal handlers": {f"{s.name}: {signal.getsignal(s)!r}" for s in SIGNALS},
            "process groups": {"the default group"} if dist.is_initialized() else set()}


def command(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:80]
    except OSError:
        return "(gone)"


def added(before: dict) -> dict[str, list[str]]:
    """What this process holds now that it did not before the run, by category."""
    after = state()
    return {what: sorted(after[what] - before[what]) for what in after if after[what] - before[what]}


def kinds(files: list[str]) -> collections.Counter:
    """Open files ("fd -> target") counted by kind: "pipe:", "socket:", "anon_inode:[eventpoll]", a path."""
    return collections.Counter(re.sub(r"\[\d+\]$", "", f.split(" -> ", 1)[1]) for f in files)


def left_behind(new: dict[str, list[str]], usual: collections.Counter) -> list[str]:
    """What a failed run left that a finished run does not: any thread, child process, signal handler or process
    group; open files beyond `usual`, the most of each kind a finished run of this job left. (Each
    finished run leaves a few descriptors: torch keeps a gloo transport's pipe, epoll and socket, and a store's
    socket, after its process groups are destroyed. The job runs on with them.)"""
    left = [f"{what}: {items}" for what, items in new.items() if what != "open files"]
    more = kinds(new.get("open files", [])) - usual
    if more:
        left.append(f"open files: {new['open files']} (beyond a finished run's: {dict(more)})")
    return left


def serve(folder: Path) -> int:
    rank, world = os.environ["RANK"], int(os.environ["WORLD_SIZE"])
    usual = collections.Counter()  # per kind, the most open files a finished run of this job left
    for n in range(1_000_000):
        request = wait_for(folder / f"req-{n}.json")
        if request.get("quit"):
            return 0
        before = state()
        code = run(request, folder / f"out-{n}-rank{rank}.txt", folder / f"err-{n}-rank{rank}.txt")
        new = added(before)
        if code == 0:
            usual |= kinds(new.get("open files", []))
        tmp = folder / f"res-{n}-rank{rank}.tmp"
        tmp.write_text(json.dumps({"code": code, "left": left_behind(new, usual)}))  # read if any rank failed
        tmp.rename(folder / f"res-{n}-rank{rank}.json")
        results = [wait_for(folder / f"res-{n}-rank{r}.json") for r in range(world)]
        if ends_the_job(results):
            return code or 1
    return 0


def ends_the_job(results: list[dict]) -> bool:
    """A run that failed on some rank and left something behind on some rank (each rank's result)."""
    return any(r["code"] != 0 for r in results) and any(r["left"] for r in results)


if __name__ == "__main__":
    lighter_engine_starts_and_ends()
    entry.leave(serve(Path(sys.argv[1])))
