"""The sandbox's worker process: `python -I rlcore/sandbox_worker.py '<json config>'` (stdlib only).

Started by rlcore.sandbox, once per pool slot. Set up once: a new network namespace where allowed, the
preloaded modules, and child-subreaper status so that every process the code leaves behind becomes ours to
kill and reap. Then, per line of stdin ({"code": ..., "timeout_s": this call's wall clock}): fork a child
that takes its own session, (as root) the slot's uid, the limits, a fresh scratch directory and pipes for
stdout/stderr, and runs the code; collect its output up to the cap and by the deadline; kill and reap
everything; remove the scratch directory; answer one JSON line on stdout. EOF on stdin: clean up and exit.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import resource
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
       "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # one thread each: numpy starts under RLIMIT_AS
NOFILE = 256  # open files per process in the sandbox
TRUNCATED = "\n[output truncated]\n"


def main(cfg: dict) -> None:
    os.environ.clear()
    os.environ.update(ENV)  # before the preloaded imports: a preloaded numpy starts one BLAS thread
    libc = ctypes.CDLL(None, use_errno=True)
    root = os.geteuid() == 0
    # a new network namespace has only a loopback device, down: every connect fails
    clone_newnet, clone_newuser = 0x40000000, 0x10000000
    isolated = libc.unshare(clone_newnet if root else clone_newnet | clone_newuser) == 0
    for name in cfg["preload"]:
        __import__(name)
    # As root the worker stays root, out of the code's reach (it cannot signal or trace us), and each child
    # drops to cfg["uid"]; without root everything runs as the trainer's user.
    uid, readable = (cfg["uid"] if root else None), None
    if root:
        os.setgroups([])
        try:
            readable = _as_user(uid, lambda: os.access(os.path.dirname(os.__file__), os.R_OK | os.X_OK))
        except OSError:  # e.g. a user namespace without that uid mapped: no drop
            uid = None
    libc.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: the code's orphans become our children, to reap
    _reap(None, uid)  # what a predecessor in this slot left behind (if it was killed)
    for name in os.listdir(cfg["home"]):
        shutil.rmtree(os.path.join(cfg["home"], name), ignore_errors=True)
    out = os.fdopen(1, "wb")

    def answer(obj: dict) -> None:
        out.write(json.dumps(obj).encode() + b"\n")
        out.flush()  # an empty buffer before every fork: the child must not inherit pending bytes

    answer({"network_isolated": isolated, "user_dropped": uid is not None, "uid": os.getuid() if uid is None
            else uid, "stdlib_readable": True if uid is None else readable})
    for line in sys.stdin.buffer:
        request = json.loads(line)
        answer(_execute(request["code"], cfg | {"timeout_s": request.get("timeout_s", cfg["timeout_s"])}, uid))
    _reap(None, uid)


def _as_user(uid: int, fn):
    """fn() with real and effective uid/gid `uid`; the saved ids stay 0, so root comes back after."""
    os.setresgid(uid, uid, 0)
    os.setresuid(uid, uid, 0)
    try:
        return fn()
    finally:
        os.setresuid(0, 0, 0)
        os.setresgid(0, 0, 0)


def _kill_all(uid: int) -> None:
    # kill(-1) as `uid` reaches exactly that user's processes (the code's, escaped sessions too), never
    # ours or anyone else's. While we are `uid` the code could signal us too: a worker lost in that moment
    # is replaced like any other.
    try:
        _as_user(uid, lambda: os.kill(-1, signal.SIGKILL))
    except ProcessLookupError:
        pass


def _execute(code: str, cfg: dict, uid: int | None) -> dict:
    scratch = tempfile.mkdtemp(dir=cfg["home"])
    if uid is not None:
        os.chown(scratch, uid, uid)
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        _child(code, scratch, out_w, err_w, cfg, uid)
    os.close(out_w)
    os.close(err_w)
    deadline, cap = time.monotonic() + cfg["timeout_s"], cfg["max_output_bytes"]
    bufs, pidfd = {out_r: bytearray(), err_r: bytearray()}, os.pidfd_open(pid)
    open_fds, truncated, status = [out_r, err_r], set(), None
    for fd in open_fds:
        os.set_blocking(fd, False)
    while status is None:
        left = deadline - time.monotonic()
        ready = select.select(open_fds + [pidfd], [], [], left)[0] if left > 0 else []
        if not ready:
            status = "timeout"
        # once the child exits take what its pipes hold; a grandchild holding them open is not waited for
        for fd in list(open_fds) if pidfd in ready else [fd for fd in ready if fd != pidfd]:
            while chunk := _read(fd):
                bufs[fd] += chunk
                if len(bufs[fd]) > cap:
                    del bufs[fd][cap:]
                    truncated.add(fd)
                    status = "output_truncated"
                    break
            if chunk == b"":
                open_fds.remove(fd)
        if pidfd in ready:
            break
    _reap(pid, uid)
    exit_code = _exit_codes.pop(pid, None)
    for fd in (out_r, err_r, pidfd):
        os.close(fd)
    shutil.rmtree(scratch, ignore_errors=True)
    stdout, stderr = (bufs[fd].decode(errors="replace") + (TRUNCATED if fd in truncated else "")
                      for fd in (out_r, err_r))
    if status is None:
        if exit_code == -signal.SIGXCPU:
            status = "timeout"  # RLIMIT_CPU
        elif exit_code is not None and exit_code < 0:
            status = "killed"
        elif exit_code and stderr.rstrip().rsplit("\n", 1)[-1].startswith("MemoryError"):
            status = "memory"
        else:
            status = "ok" if exit_code == 0 else "error"
    return {"status": status, "stdout": stdout, "stderr": stderr, "exit_code": exit_code}


def _read(fd: int) -> bytes | None:
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None


_exit_codes: dict[int, int] = {}


def _reap(pid: int | None, uid: int | None) -> None:
    """Kill the child and its group (with a uid: every process of that uid) and reap all; keep exit codes."""
    if pid is not None:
        for kill, target in ((os.killpg, pid), (os.kill, pid)):  # the child may have left its group
            try:
                kill(target, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _exit_codes[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    while True:
        if uid is not None:  # again after each reap, in case one was forking
            _kill_all(uid)
        try:
            done, status = os.waitpid(-1, 0 if uid is not None else os.WNOHANG)
        except ChildProcessError:
            return
        if done == 0:
            return
        _exit_codes[done] = os.waitstatus_to_exitcode(status)


def _child(code: str, scratch: str, out_w: int, err_w: int, cfg: dict, uid: int | None) -> None:
    exit_code = 1
    try:
        os.setsid()
        if uid is not None:  # the worker is root: drop for good, before any of the code runs
            os.setgid(uid)
            os.setuid(uid)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 1 << 20)  # the worker's pipes to the trainer included
        mib, cpu = 1 << 20, math.ceil(cfg["cpu_s"])
        for res, soft, hard in ((resource.RLIMIT_AS, cfg["memory_mb"] * mib, cfg["memory_mb"] * mib),
                                (resource.RLIMIT_FSIZE, cfg["file_mb"] * mib, cfg["file_mb"] * mib),
                                (resource.RLIMIT_NPROC, cfg["max_processes"], cfg["max_processes"]),
                                (resource.RLIMIT_NOFILE, NOFILE, NOFILE), (resource.RLIMIT_CORE, 0, 0),
                                (resource.RLIMIT_CPU, cpu, cpu + 1)):  # CPU: SIGXCPU first, SIGKILL a second later
            now = resource.getrlimit(res)[1]  # never above what the trainer itself may have
            resource.setrlimit(res, (soft, hard) if now == resource.RLIM_INFINITY else (min(soft, now), min(hard, now)))
        os.chdir(scratch)
        os.environ.clear()
        os.environ.update(ENV, HOME=scratch, TMPDIR=scratch)
        tempfile.tempdir = None
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)
        sys.argv = ["<sandbox>"]
        import linecache
        linecache.cache["<sandbox>"] = (len(code), None, code.splitlines(True), "<sandbox>")  # source in tracebacks
        exec(compile(code, "<sandbox>", "exec"), {"__name__": "__main__"})
        exit_code = 0
    except SystemExit as e:
        exit_code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException as e:  # the code's own exception: its traceback, without this frame, is the output
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed or broken by the code
                pass
        os._exit(exit_code & 0xFF)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
