"""Sandboxed execution of model-written Python, for reward functions and environments.

    sandbox = Sandbox(SandboxConfig(timeout_s=5, workers=2))     # or Sandbox(timeout_s=5)
    result = sandbox.run("print(sum(range(10)))")                  # thread-safe; `await sandbox.arun(code)`
    result.ok, result.stdout, result.status                        # True, "45\n", "ok"
    sandbox.run(code, timeout_s=2)      # a shorter deadline for this call (a tool's, within its turn)
    observation = result.text()                                    # stdout + stderr + "[status ...]" if not ok
    sandbox.status      # {"network_isolated": True, "user_dropped": True, "stdlib_readable": True, ...}
    sandbox.close()                                                # also at exit

    shared().run(code)   # one sandbox per process (rank) for tools and reward functions, started on first use
                         # with the run config's `sandbox` limits (configure(cfg.sandbox), done by the trainer)

A few warm workers (rlcore/sandbox_worker.py under `python -I`, started once with an empty environment, each
in its own session) read code from a pipe and fork a fresh child per call. The child takes its own session,
the limits (RLIMIT_CPU/AS/FSIZE/NPROC/NOFILE, no core files), a fresh scratch directory as cwd, HOME and
TMPDIR, /dev/null as stdin and pipes as stdout/stderr, and runs the code. The worker kills the child's group
at the wall-clock deadline or when an output passes max_output_bytes, reaps everything, removes the scratch
directory and answers one JSON line. The trainer is never forked (no preexec_fn: it has threads). Every read
of the trainer has a deadline; a worker that dies (without root the code can kill it) is a "killed" result
and is replaced.

Set up once per worker, where the system allows it (`status` says what is active):
- network: a new, empty network namespace (unshare CLONE_NEWNET as root; CLONE_NEWUSER|CLONE_NEWNET
  otherwise). Where it is refused (Docker's default seccomp, many k8s pods) the code keeps the host's network
  and `status["network_isolated"]` is False.
- user: as root the worker stays root and each child drops to the worker's own uid (setgid/setuid, no
  account needed) before any code runs: RLIMIT_NPROC binds, the trainer's files and processes and the
  worker are out of the code's reach, and after each call kill(-1) as that uid ends every process the code
  left, escaped sessions included. Not root: the code runs as the trainer's user, only the child's process
  group is killed, and max_processes counts all of that user's processes.

Outcomes are a `Result`, never an exception: status is "ok", "error" (exception or non-zero exit, the
traceback in stderr), "timeout" (wall clock or CPU limit), "memory" (MemoryError under the address-space
limit), "output_truncated", or "killed" (a signal, or the worker died; it is replaced).
"""
from __future__ import annotations

import asyncio
import atexit
import itertools
import json
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from rlcore.config import SandboxConfig  # the limits: the run config's `sandbox` section

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_worker.py")
GRACE_S = 5.0  # the trainer gives a worker this long past timeout_s (fork, reaping, cleanup) before killing it


@dataclass
class Result:
    ok: bool  # status == "ok"
    status: str  # ok | error | timeout | memory | output_truncated | killed
    stdout: str
    stderr: str
    exit_code: int | None  # the child's exit code; -N for signal N; None when there was no exit to read
    seconds: float  # wall time of the call as the trainer saw it

    def text(self) -> str:
        """What an observation shows the model: stdout, stderr, and one line unless the run was clean."""
        tail = "" if self.ok else f"[{self.status}, exit code {self.exit_code}, {self.seconds:.2f} s]"
        return "".join(s if s.endswith("\n") or not s else s + "\n" for s in (self.stdout, self.stderr)) + tail


class Sandbox:
    def __init__(self, config: SandboxConfig | None = None, **overrides):
        self.config = config or SandboxConfig(**overrides)
        # 0o711: the code's users may pass through to their own scratch directories but not list this one
        self._root = tempfile.mkdtemp(prefix="rlcore-sandbox-")
        os.chmod(self._root, 0o711)
        self._lock = threading.Lock()
        self._closed = False
        self._idle: queue.Queue[_Worker | None] = queue.Queue()  # None: closed
        self._all = [_Worker(self.config, self._root) for _ in range(self.config.workers)]
        try:
            for w in self._all:
                w.wait_ready()
                self._idle.put(w)
        except RuntimeError:  # one did not start: leave nothing behind
            for w in self._all:
                w.stop()
            shutil.rmtree(self._root, ignore_errors=True)
            raise
        hello = [w.hello for w in self._all]
        self.status = {"network_isolated": all(h["network_isolated"] for h in hello),
                       "user_dropped": all(h["user_dropped"] for h in hello),
                       "stdlib_readable": all(h["stdlib_readable"] for h in hello),
                       "uid": [h["uid"] for h in hello], "workers": self.config.workers}
        atexit.register(self.close)

    def run(self, code: str, timeout_s: float | None = None) -> Result:
        """Run `code` in a fresh child of a free worker (blocks until one is free); never raises for what the
        code does. `timeout_s` (at most the config's) bounds this call, the wait for a free worker included:
        a caller with a deadline of its own (a tool within its turn's) passes what is left of it."""
        start, limit = time.monotonic(), None if timeout_s is None else min(timeout_s, self.config.timeout_s)
        try:
            worker = self._idle.get(timeout=limit)
        except queue.Empty:
            worker = False
        if worker is None:  # closed: pass the news on to the next waiter
            self._idle.put(None)
            raise RuntimeError("the sandbox is closed")
        left = None if limit is None else limit - (time.monotonic() - start)
        if worker is False or left is not None and left <= 0:
            if worker:
                self._idle.put(worker)
            return Result(False, "timeout", "", "", None, time.monotonic() - start)  # never started
        try:
            return worker.call(code, left)
        finally:
            with self._lock:
                if not worker.alive() and not self._closed:  # it died: the same slot gets a fresh process
                    worker = self._replace(worker)
            self._idle.put(worker)

    def _replace(self, dead: _Worker) -> _Worker:
        dead.stop()
        try:
            fresh = _Worker(self.config, self._root, dead.uid)
            fresh.wait_ready()
        except (OSError, RuntimeError):  # cannot start now: the next call on this slot tries again
            return dead
        self._all = [fresh if w is dead else w for w in self._all]
        return fresh

    async def arun(self, code: str, timeout_s: float | None = None) -> Result:
        return await asyncio.to_thread(self.run, code, timeout_s)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # calls in flight end by their own deadline; then every worker is stopped and reaped
        deadline = time.monotonic() + self.config.timeout_s + GRACE_S + 1
        for _ in self._all:
            try:
                self._idle.get(timeout=max(deadline - time.monotonic(), 0)).stop()
            except queue.Empty:
                break
        for w in self._all:
            w.stop()
        self._idle.put(None)
        shutil.rmtree(self._root, ignore_errors=True)
        atexit.unregister(self.close)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- one sandbox per process ------------------------------------------------------------------------------
# For tools and reward functions that need no pool of their own (e.g. rlcore.rollout.tools.python). A run sets
# its limits from the config's `sandbox` section at startup (rlcore.trainer); its workers start on first use.
_shared: Sandbox | None = None
_shared_config = SandboxConfig()
_shared_lock = threading.Lock()


def configure(config: SandboxConfig) -> None:
    """The limits of `shared()`. A shared sandbox already running with other limits is closed; the next call
    to shared() starts one with these."""
    global _shared, _shared_config
    with _shared_lock:
        stale = _shared if _shared is not None and _shared.config != config else None
        _shared_config = config
        if stale is not None:
            _shared = None
    if stale is not None:
        stale.close()


def shared() -> Sandbox:
    """This process's sandbox, started on the first call (from any thread) with the limits given to
    configure(), SandboxConfig()'s defaults if none were."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared._closed:
            _shared = Sandbox(_shared_config)
        return _shared


_slots = itertools.count()


class _Worker:
    """The trainer's side of one worker process: start it, send code, read the answer by a deadline."""

    def __init__(self, config: SandboxConfig, root: str, uid: int | None = None):
        # a uid of its own per worker (2^30 + pid * 256 + slot: used by no account, unique among live
        # trainers), so that the worker's kill(-1) as that uid reaches only its own code's processes
        self.uid = uid or 2**30 + (os.getpid() % 2**22) * 256 + next(_slots) % 256
        self.config, self.home = config, os.path.join(root, str(self.uid))
        os.makedirs(self.home, mode=0o711, exist_ok=True)  # the worker's, not the code's: it cannot write here
        args = json.dumps(vars(config) | {"home": self.home, "uid": self.uid})
        self.proc = subprocess.Popen([sys.executable, "-I", WORKER, args], env={},
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=root,
                                     start_new_session=True)
        self.buffer = b""

    def wait_ready(self) -> None:
        line = self._read_line(time.monotonic() + 60)
        if line is None:
            self.stop()
            raise RuntimeError(f"a sandbox worker did not start (exit code {self.proc.returncode})")
        self.hello = json.loads(line)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, code: str, timeout_s: float | None = None) -> Result:
        start, timeout_s = time.monotonic(), self.config.timeout_s if timeout_s is None else timeout_s
        try:
            self.proc.stdin.write(json.dumps({"code": code, "timeout_s": timeout_s}).encode() + b"\n")
            self.proc.stdin.flush()
            line = self._read_line(start + timeout_s + GRACE_S)
        except (OSError, ValueError):  # the worker is gone (broken pipe, or stopped by close())
            line = None
        if line is None:
            self.stop()
            return Result(False, "killed", "", "the sandbox worker was killed (the code may have killed its "
                          "parent); it is replaced\n", None, time.monotonic() - start)
        answer = json.loads(line)
        return Result(answer["status"] == "ok", answer["status"], answer["stdout"], answer["stderr"],
                      answer["exit_code"], time.monotonic() - start)

    def _read_line(self, deadline: float) -> bytes | None:
        """One line from the worker, or None on EOF, past the deadline or past a sane size."""
        fd, limit = self.proc.stdout.fileno(), 16 * self.config.max_output_bytes + 65536
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or len(self.buffer) > limit or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line

    def stop(self) -> None:
        """EOF asks the worker to clean up and exit; a worker that does not is killed with its group."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.proc.stdout.close()
