"""Sandboxed execution of model-written Python, for reward functions and environments.

    sandbox = Sandbox(SandboxConfig(timeout_s=5, workers=2))     # or Sandbox(timeout_s=5)
    result = sandbox.run("print(sum(range(10)))")                  # thread-safe; `await sandbox.arun(code)`
    result.ok, result.stdout, result.status                        # True, "45\n", "ok"
    observation = result.text()                                    # stdout + stderr + "[status ...]" if not ok
    sandbox.run(code, timeout_s=2, cancel=event)                   # a shorter deadline; stop at once on event.set()
    sandbox.status      # {"network_isolated": True, "pid_namespace": True, ..., "refused": {}, "unix_sockets": []}
    sandbox.close()                                                # also at exit

    shared().run(code)   # one sandbox per process (rank) for tools and reward functions, started on first use
                         # with the run config's `sandbox` limits (configure(cfg.sandbox), done by the trainer)

A few warm workers (rlcore/sandbox/worker.py under `python -I`, started once with an empty environment, each
in its own session) read code from a pipe. Each worker is a supervisor that does the I/O and a zygote that
only forks (rlcore/sandbox/zygote.py): every call starts from the zygote's memory, which never held a call's
code or output, in namespaces of its own (PID, mount, IPC), with a private tmpfs as /tmp, /var/tmp, /dev/shm
and cwd, an empty /run, a /proc that shows only its own processes, its own session, uid and limits
(RLIMIT_CPU/AS/FSIZE/NPROC/NOFILE, no core files), /dev/null as stdin and pipes as stdout/stderr. The
supervisor kills the call's init at the wall-clock deadline or when an output passes max_output_bytes (the
kernel then kills every process of the call), and answers one JSON line. The trainer is never forked (no
preexec_fn: it has threads). Every read of the trainer has a deadline; a worker that dies is a "killed"
result and is replaced.

Set up where the system allows it; `status` says what is active, per mechanism, and `status["refused"]` why
not (e.g. {"pid_namespace": "EPERM (unshare CLONE_NEWPID)"} under Docker's default seccomp):
- network_isolated: a new, empty network namespace per worker (as root CLONE_NEWNET; otherwise through a user
  namespace). Refused: the code keeps the host's network.
- user_dropped: as root the supervisor stays root and each call runs as the worker's own uid (no account
  needed), so RLIMIT_NPROC binds and the trainer's files and processes are out of reach; no process that
  cleans up ever takes that uid. Not root: the code runs as the trainer's user.
- ipc_namespace, mount_namespace, pid_namespace, proc_hidden (root only): SysV IPC, the tmpfs and /run, and the
  processes of a call end with it. Without a PID namespace the supervisor kills the code's session and (as
  root) every process of its uid from a throwaway child, and reaps them as the child subreaper.
- unix_sockets: the host's path sockets the code can still connect to (those outside /tmp, /var/tmp, /dev/shm,
  /run and /dev/log, writable by its uid), found by a self-test when the worker starts.

Outcomes are a `Result`, never an exception: status is "ok", "error" (exception or non-zero exit, the
traceback in stderr), "timeout" (wall clock or CPU limit), "memory" (MemoryError under the address-space
limit), "output_truncated", "killed" (a signal, or the worker died; it is replaced) or "cancelled".
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
from rlcore.sandbox.zygote import MECHANISMS  # what isolates a call: each a key of `status`

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
GRACE_S = 5.0  # the trainer gives a worker this long past timeout_s (fork, reaping, cleanup) before killing it
POLL_S = 0.05  # how often a call or a wait for a worker looks at its `cancel` event, seconds


@dataclass
class Result:
    ok: bool  # status == "ok"
    status: str  # ok | error | timeout | memory | output_truncated | killed | cancelled
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
        self.status = {key: all(h[key] for h in hello) for key in MECHANISMS + ("user_dropped", "stdlib_readable")}
        self.status |= {"refused": {k: v for h in hello for k, v in h["refused"].items()},
                        "unix_sockets": sorted({path for h in hello for path in h["unix_sockets"]}),
                        "uid": [h["uid"] for h in hello], "workers": self.config.workers}
        atexit.register(self.close)

    def run(self, code: str, timeout_s: float | None = None, cancel: threading.Event | None = None) -> Result:
        """Run `code` as a fresh call on a free worker (blocks until one is free); never raises for what the
        code does. `timeout_s`: a deadline for this call from now, the wait for a free worker included
        ("timeout" if none frees up in time), the code's wall clock never past config.timeout_s (e.g. what
        is left of a turn). Once `cancel` is set, the call (or the wait) ends at once and the worker is free
        for the next ("cancelled": e.g. a dropped trajectory's)."""
        start = time.monotonic()
        worker = self._wait_for_worker(None if timeout_s is None else start + timeout_s, cancel)
        if not isinstance(worker, _Worker):
            return Result(False, worker, "", "", None, time.monotonic() - start)
        limit = self.config.timeout_s if timeout_s is None else min(start + timeout_s - time.monotonic(),
                                                                     self.config.timeout_s)
        try:
            return worker.call(code, time.monotonic() + limit, cancel)
        finally:
            with self._lock:
                if not worker.alive() and not self._closed:  # it died: the same slot gets a fresh process
                    worker = self._replace(worker)
            self._idle.put(worker)

    def _wait_for_worker(self, deadline: float | None, cancel: threading.Event | None) -> _Worker | str:
        """A free worker, or "timeout" / "cancelled" if none frees up before the deadline / the cancel."""
        while True:
            if cancel is not None and cancel.is_set():
                return "cancelled"
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return "timeout"
            try:  # with a cancel to watch, a little at a time
                worker = self._idle.get(timeout=left if cancel is None else min(POLL_S, left or POLL_S))
            except queue.Empty:
                continue
            if worker is None:  # closed: pass the news on to the next waiter
                self._idle.put(None)
                raise RuntimeError("the sandbox is closed")
            return worker

    def _replace(self, dead: _Worker) -> _Worker:
        dead.stop()
        try:
            fresh = _Worker(self.config, self._root, dead.uid)
            fresh.wait_ready()
        except (OSError, RuntimeError):  # cannot start now: the next call on this slot tries again
            return dead
        self._all = [fresh if w is dead else w for w in self._all]
        return fresh

    async def arun(self, code: str, timeout_s: float | None = None, cancel: threading.Event | None = None) -> Result:
        return await asyncio.to_thread(self.run, code, timeout_s, cancel)

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
        # trainers): RLIMIT_NPROC and same-uid access (signals, ptrace) stay within one call's processes
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

    def call(self, code: str, deadline: float, cancel: threading.Event | None = None) -> Result:
        start = time.monotonic()
        try:
            self._send({"code": code, "timeout_s": max(deadline - start, 0.001)})
            line = self._read_line(deadline + GRACE_S, cancel)
        except (OSError, ValueError):  # the worker is gone (broken pipe, or stopped by close())
            line = None
        if line is None:
            self.stop()
            return Result(False, "killed", "", "the sandbox worker was killed (the code may have killed its "
                          "parent); it is replaced\n", None, time.monotonic() - start)
        answer = json.loads(line)
        return Result(answer["status"] == "ok", answer["status"], answer["stdout"], answer["stderr"],
                      answer["exit_code"], time.monotonic() - start)

    def _send(self, message: dict) -> None:
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def _read_line(self, deadline: float, cancel: threading.Event | None = None) -> bytes | None:
        """One line from the worker, or None on EOF, past the deadline or past a sane size. Once `cancel` is
        set, ask the worker (once) to kill the call: it answers "cancelled" at once."""
        fd, limit = self.proc.stdout.fileno(), 16 * self.config.max_output_bytes + 65536
        while b"\n" not in self.buffer:
            if cancel is not None and cancel.is_set():
                self._send({"cancel": True})  # a call that ended meanwhile answers as it ended: it is ignored
                cancel = None
            left = deadline - time.monotonic()
            if left <= 0 or len(self.buffer) > limit:
                return None
            if not select.select([fd], [], [], min(left, POLL_S) if cancel else left)[0]:
                continue
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
