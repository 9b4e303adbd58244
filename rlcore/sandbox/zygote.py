"""The sandbox's zygote and the processes of one call: code that never reads call data (stdlib only).

rlcore/sandbox/worker.py (the supervisor: root where allowed, it does all the I/O) forks the zygote once, after
its preloaded imports and before it reads any call. The zygote only forks: per request it receives four fds
(the code, stdout, stderr, a control pipe) and passes them on unread, so every call starts from the same
memory and finds nothing of an earlier call's code or output in its own (/proc/self/mem included). Per call:

    zygote --fork--> starter: unshares the IPC, mount and PID namespaces (those the probe found allowed),
                     forks init, reports init's pid and exits, which hands init to the supervisor
    starter --fork-> init, pid 1 of the call's PID namespace, root: a tmpfs of tmp_mb on /tmp (bound on
                     /var/tmp and /dev/shm), an empty /run (so /var/run), /dev/null over /dev/log, its own
                     /proc (hidepid=2: the code sees only its own processes); forks, reaps, reports the
                     code's exit status on the control pipe and exits
    init --fork----> the code: its own session, the call's uid, the limits, the fds, cwd /tmp, the code

When init exits or the supervisor kills it, the kernel kills every process left in the PID namespace, and the
mount and IPC namespaces (the tmpfs, SysV segments) end with their last process: nothing of the call is left.
The code runs as a uid of its own and never shares it with a process that can clean up: the supervisor and
init stay root (kill(2) lets a uid signal only processes whose real or saved uid is its own).
"""
from __future__ import annotations

import ctypes
import errno
import json
import math
import os
import resource
import signal
import socket
import sys
import tempfile
import traceback

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
       "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # one thread each: numpy starts under RLIMIT_AS
NOFILE = 256  # open files per process in the sandbox
# what isolates a call, each a key of the sandbox's `status` (True where active; status["refused"] says why not)
MECHANISMS = ("network_isolated", "ipc_namespace", "mount_namespace", "pid_namespace", "proc_hidden")
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID = 0x00020000, 0x08000000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 0x4000, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
SETUP_FAILED = 125  # init's exit code when a mount that the probe allowed failed for this call
libc = ctypes.CDLL(None, use_errno=True)


def unshare(flags: int, name: str) -> None:
    if libc.unshare(flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{errno.errorcode.get(code, code)} (unshare {name})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{errno.errorcode.get(code, code)} (mount {fstype or 'bind'} on {target})")


def private_mounts(tmp_mb: int) -> None:
    """In a new mount namespace: nothing propagates back to the host, and the places where calls could leave
    files for each other or find the host's unix sockets are fresh and empty."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    # one tmpfs, one budget of RAM, for the three world-writable places
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmp_mb}m,nr_inodes=16384,mode=1777")
    for place in ("/var/tmp", "/dev/shm"):
        if os.path.isdir(place) and not os.path.islink(place):
            mount("/tmp", place, None, MS_BIND)
    # service sockets live under /run (and /var/run, its link): an empty, root-owned tmpfs hides them
    mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=16k,mode=755")
    if os.path.exists("/dev/log"):  # syslog's socket, when it lives in /dev itself
        mount("/dev/null", "/dev/log", None, MS_BIND)


def private_proc() -> None:
    """By pid 1 of a new PID namespace: a /proc of that namespace; hidepid=2 hides init (root) as well."""
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")


def probe(tmp_mb: int, root: bool) -> dict:
    """Which isolating mechanisms this system allows: {name: None, or why not}. Tried once, at the worker's
    start, in a child of the supervisor that does to itself what every call's processes will do."""
    if not root:  # in a user namespace the code would hold the capabilities to unmount them again
        why = "not attempted: the sandbox is not root"
        return {"ipc_namespace": why, "mount_namespace": why, "pid_namespace": why, "proc_hidden": why}
    read, write = os.pipe()
    if os.fork() == 0:
        found = {}
        for name, flag, label in (("ipc_namespace", CLONE_NEWIPC, "CLONE_NEWIPC"),
                                  ("mount_namespace", CLONE_NEWNS, "CLONE_NEWNS"),
                                  ("pid_namespace", CLONE_NEWPID, "CLONE_NEWPID")):
            try:
                unshare(flag, label)
                found[name] = None
            except OSError as e:
                found[name] = e.strerror
        found["proc_hidden"] = found["pid_namespace"] or found["mount_namespace"]
        if found["proc_hidden"] is None:
            pid = os.fork()  # pid 1 of the new PID namespace: the one that can mount its /proc
            if pid == 0:
                for name, setup in (("mount_namespace", lambda: private_mounts(tmp_mb)), ("proc_hidden", private_proc)):
                    try:
                        setup()
                    except OSError as e:
                        os.write(write, json.dumps({name: e.strerror}).encode() + b"\n")
                        break
                os._exit(0)
            os.waitpid(pid, 0)
        os.write(write, json.dumps(found).encode() + b"\n")
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        lines = [json.loads(line) for line in pipe.read().splitlines()]
    os.wait()
    found = lines[-1]
    if len(lines) == 2:  # a mount failed: without private mounts there is no /proc of our own either
        found.update(lines[0], proc_hidden=found["proc_hidden"] or next(iter(lines[0].values())))
    return found


def zygote(sock: socket.socket, cfg: dict, allowed: dict, uid: int | None) -> None:
    """Serve the supervisor: b"c" + fds starts a call and answers init's pid (0: it could not start);
    b"k" kills every process of `uid` and answers b"k" (the sweep without a PID namespace); EOF exits."""
    parent = os.getppid()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the supervisor's end is ours
    if os.getppid() != parent:
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):  # the trainer's pipes: a dead supervisor must read as EOF to the trainer
        os.dup2(null, fd)
    flags = sum(flag for name, flag in (("ipc_namespace", CLONE_NEWIPC), ("mount_namespace", CLONE_NEWNS),
                                       ("pid_namespace", CLONE_NEWPID)) if allowed[name] is None)
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 1, 4)
        if not msg:
            os._exit(0)
        if msg == b"k":
            _kill_uid(uid)
            sock.send(b"k")
            continue
        read, write = os.pipe()
        try:
            starter = os.fork()
        except OSError:  # e.g. no memory: the pipe stays empty and the answer is pid 0
            starter = None
        if starter == 0:
            os.close(read)
            _start(fds, write, flags, cfg, allowed, uid)
        for fd in fds + [write]:
            os.close(fd)
        with os.fdopen(read, "rb") as pipe:
            pid = pipe.read(4)
        if starter is not None:
            os.waitpid(starter, 0)
        sock.send(pid if len(pid) == 4 else bytes(4))


def _kill_uid(uid: int) -> None:
    """kill(-1) as `uid` from a throwaway child (groups, gid, uid in that order), so no long-lived process
    ever holds that uid: a loop of kill(-1, 9) in the code can only hit the child, which is expendable."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _start(fds: list[int], report: int, flags: int, cfg: dict, allowed: dict, uid: int | None) -> None:
    try:
        if flags:
            unshare(flags, "call namespaces")
        pid = os.fork()
    except OSError:  # answered as pid 0: the supervisor reports that the call could not start
        pid = -1
    if pid == 0:
        os.close(report)
        _init(fds, cfg, allowed, uid)
    os.write(report, max(pid, 0).to_bytes(4, "little"))
    os._exit(0)


def _init(fds: list[int], cfg: dict, allowed: dict, uid: int | None) -> None:
    code_fd, out_w, err_w, control = fds
    try:
        if allowed["mount_namespace"] is None:
            private_mounts(cfg["tmp_mb"])
        if allowed["proc_hidden"] is None:
            private_proc()
        child = os.fork()
        if child == 0:
            os.close(control)
            _child(code_fd, out_w, err_w, cfg, uid)
    except OSError as e:
        os.write(err_w, f"the sandbox could not set up this call: {e}\n".encode())
        os._exit(SETUP_FAILED)
    for fd in (code_fd, out_w, err_w):
        os.close(fd)
    os.write(control, child.to_bytes(4, "little"))  # the pid the supervisor kills without a PID namespace
    while True:  # as pid 1, the reaper of every orphan in the namespace
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            os.write(control, status.to_bytes(4, "little"))
            os._exit(0)


def _child(code_fd: int, out_w: int, err_w: int, cfg: dict, uid: int | None) -> None:
    exit_code = 1
    try:
        os.setsid()
        if uid is not None:  # the supervisor is root: drop for good, before any of the code runs
            os.setgid(uid)
            os.setuid(uid)
            # the drop made us undumpable: /proc/self and our children would be root's, hidden by hidepid.
            # Only the call's own processes have this uid, so they are the only ones this lets in
            libc.prctl(PR_SET_DUMPABLE, 1)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.lseek(code_fd, 0, os.SEEK_SET)
        with os.fdopen(code_fd, "rb") as f:
            call = json.loads(f.read())
        code = call["code"]
        os.closerange(3, 1 << 20)  # the zygote's socket included
        mib, cpu = 1 << 20, math.ceil(cfg["cpu_s"])
        for res, soft, hard in ((resource.RLIMIT_AS, cfg["memory_mb"] * mib, cfg["memory_mb"] * mib),
                                (resource.RLIMIT_FSIZE, cfg["file_mb"] * mib, cfg["file_mb"] * mib),
                                (resource.RLIMIT_NPROC, cfg["max_processes"], cfg["max_processes"]),
                                (resource.RLIMIT_NOFILE, NOFILE, NOFILE), (resource.RLIMIT_CORE, 0, 0),
                                (resource.RLIMIT_CPU, cpu, cpu + 1)):  # CPU: SIGXCPU first, SIGKILL a second later
            now = resource.getrlimit(res)[1]  # never above what the trainer itself may have
            resource.setrlimit(res, (soft, hard) if now == resource.RLIM_INFINITY else (min(soft, now), min(hard, now)))
        os.chdir(call["cwd"])
        os.environ.clear()
        os.environ.update(ENV, HOME=call["cwd"], TMPDIR=call["cwd"])
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
