"""The sandbox's worker process, the supervisor: `python -I rlcore/sandbox/worker.py '<json config>'` (stdlib only).

Started by rlcore.sandbox, once per pool slot. Set up once: a new network namespace where allowed, the
preloaded modules, child-subreaper status, a probe of which isolating mechanisms the system allows, and the
zygote (rlcore/sandbox/zygote.py), forked before any call is read. Then, per line of stdin ({"code": ...}):
put the code in a memfd, make pipes for stdout/stderr, hand the fds to the zygote (which forks the call's
processes without reading them), collect the output up to the cap and by the deadline, kill the call's init
(and with it its PID namespace), reap, answer one JSON line on stdout. EOF on stdin: clean up and exit.

The supervisor does all the call's I/O and never changes its uid: the code cannot reach it (another PID
namespace, another uid), and a call cannot find an earlier one in the memory it starts from.
"""
from __future__ import annotations

import ctypes
import errno
import importlib.util
import json
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time

TRUNCATED = "\n[output truncated]\n"
# the zygote's module by path: `python -I` puts neither rlcore nor the script's folder on sys.path
_spec = importlib.util.spec_from_file_location(
    "sandbox_zygote", os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote.py"))
zyg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zyg)
# what the code reports about itself once per worker: what it can import, see in /proc and connect to
SELF_TEST = """import json, os, stat
def reachable(path):
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode) and os.access(path, os.W_OK)
    except OSError:
        return False
print(json.dumps({"stdlib_readable": os.access(os.path.dirname(os.__file__), os.R_OK | os.X_OK),
                  "processes_seen": sum(name.isdigit() for name in os.listdir("/proc")),
                  "unix_sockets": [path for path in %r if reachable(path)]}))
"""


def main(cfg: dict) -> None:
    os.environ.clear()
    os.environ.update(zyg.ENV)  # before the preloaded imports: a preloaded numpy starts one BLAS thread
    libc = ctypes.CDLL(None, use_errno=True)
    root = os.geteuid() == 0
    sockets = _host_unix_sockets()  # read before the network namespace changes what /proc/net shows
    # a new network namespace has only a loopback device, down: every connect fails
    clone_newnet, clone_newuser = 0x40000000, 0x10000000
    refused = {}
    if libc.unshare(clone_newnet if root else clone_newnet | clone_newuser) != 0:
        refused["network_isolated"] = f"{errno.errorcode.get(ctypes.get_errno())} (unshare CLONE_NEWNET)"
    for name in cfg["preload"]:
        __import__(name)
    # As root the supervisor stays root, out of the code's reach, and each call drops to cfg["uid"]; without
    # root everything runs as the trainer's user.
    uid = cfg["uid"] if root else None
    if root:
        os.setgroups([])
    libc.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: each call's init, and without a PID namespace its orphans, are ours
    allowed = zyg.probe(cfg["tmp_mb"], root)
    refused.update({name: why for name, why in allowed.items() if why is not None})
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the zygote: forked before the first call is read, so it holds no call's data
        ours.close()
        zyg.zygote(theirs, cfg, allowed, uid)
    theirs.close()
    box = _Supervisor(cfg, ours, pid, uid, allowed)
    box.sweep()  # what a predecessor in this slot left behind (if it was killed)
    for name in os.listdir(cfg["home"]):
        shutil.rmtree(os.path.join(cfg["home"], name), ignore_errors=True)
    out = os.fdopen(1, "wb")

    def answer(obj: dict) -> None:
        out.write(json.dumps(obj).encode() + b"\n")
        out.flush()

    test = box.execute(SELF_TEST % sockets, cfg["timeout_s"])
    if test["status"] != "ok":
        raise SystemExit(f"the sandbox's self-test failed: {test}")
    seen = json.loads(test["stdout"])
    if seen["processes_seen"] != 1:
        refused.setdefault("proc_hidden", f"the code sees {seen['processes_seen']} processes in /proc")
    answer({**{name: name not in refused for name in zyg.MECHANISMS}, "refused": refused,
            "user_dropped": uid is not None, "uid": os.getuid() if uid is None else uid,
            "stdlib_readable": seen["stdlib_readable"], "unix_sockets": seen["unix_sockets"]})
    for line in sys.stdin.buffer:
        call = json.loads(line)
        if "code" not in call:  # a cancel that came after its call had ended
            continue
        answer(box.execute(call["code"], min(call.get("timeout_s") or cfg["timeout_s"], cfg["timeout_s"])))
    ours.close()  # EOF: the zygote exits
    box.reap_all()


def _host_unix_sockets() -> list[str]:
    """Paths of the unix sockets bound in this network namespace (the trainer's): the self-test says which of
    them the code can still reach (none under the fresh /tmp, /var/tmp, /dev/shm and /run)."""
    try:
        with open("/proc/net/unix") as f:
            rows = [line.split() for line in f.read().splitlines()[1:]]
    except OSError:
        return []
    return sorted({row[7] for row in rows if len(row) > 7 and row[7].startswith("/")})


class _Supervisor:
    """Starts calls through the zygote, collects their output, and leaves nothing of them behind."""

    def __init__(self, cfg: dict, zygote: socket.socket, zygote_pid: int, uid: int | None, allowed: dict):
        self.cfg, self.zygote, self.zygote_pid, self.uid = cfg, zygote, zygote_pid, uid
        self.mounts = allowed["mount_namespace"] is None
        self.pid_namespace = allowed["pid_namespace"] is None

    def execute(self, code: str, timeout_s: float) -> dict:
        # without a private /tmp the call's cwd is a fresh directory of the host's, removed afterwards
        cwd = "/tmp" if self.mounts else tempfile.mkdtemp(dir=self.cfg["home"])
        if self.uid is not None and not self.mounts:
            os.chown(cwd, self.uid, self.uid)
        code_fd = os.memfd_create("code")  # the zygote passes it on unread; the code's process reads it
        os.write(code_fd, json.dumps({"code": code, "cwd": cwd}).encode())
        (out_r, out_w), (err_r, err_w), (control_r, control_w) = os.pipe(), os.pipe(), os.pipe()
        socket.send_fds(self.zygote, [b"c"], [code_fd, out_w, err_w, control_w])
        for fd in (code_fd, out_w, err_w, control_w):
            os.close(fd)
        init = int.from_bytes(self.zygote.recv(4), "little")
        if init == 0:
            status, stdout, stderr, exit_code = "error", "", "the sandbox could not start this call\n", None
        else:
            status, stdout, stderr = self._collect(init, out_r, err_r, timeout_s)
            exit_code = os.waitstatus_to_exitcode(os.waitpid(init, 0)[1])
            with os.fdopen(control_r, "rb") as control:
                child, child_status = control.read(4), control.read(4)
            control_r = None
            if len(child_status) == 4:  # init saw the code's process end: its status is the call's
                exit_code = os.waitstatus_to_exitcode(int.from_bytes(child_status, "little"))
            if not self.pid_namespace:  # no kernel to end the call's processes: we do
                self._end_without_namespace(int.from_bytes(child, "little") if len(child) == 4 else None)
        for fd in (out_r, err_r, control_r):
            if fd is not None:
                os.close(fd)
        if not self.mounts:
            shutil.rmtree(cwd, ignore_errors=True)
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

    def _collect(self, init: int, out_r: int, err_r: int, timeout_s: float) -> tuple[str | None, str, str]:
        """Read stdout and stderr until the code's process ends (init exits right after), the deadline, or the
        cap; then kill init, which ends the call's PID namespace. (status or None, stdout, stderr)."""
        deadline, cap = time.monotonic() + timeout_s, self.cfg["max_output_bytes"]
        bufs, pidfd = {out_r: bytearray(), err_r: bytearray()}, os.pidfd_open(init)
        open_fds, truncated, status = [out_r, err_r], set(), None
        for fd in open_fds:
            os.set_blocking(fd, False)
        while status is None:
            left = deadline - time.monotonic()
            # stdin: the trainer writes nothing during a call but a cancel (or EOF: it is going away)
            ready = select.select(open_fds + [pidfd, 0], [], [], left)[0] if left > 0 else []
            if not ready:
                status = "timeout"
            elif 0 in ready:
                os.read(0, 65536)
                status = "cancelled"
                break
            # once init exits take what the pipes hold; a grandchild holding them open is not waited for
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
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # our child until we reap it: no pid reuse to fear
        os.close(pidfd)
        stdout, stderr = (bufs[fd].decode(errors="replace") + (TRUNCATED if fd in truncated else "")
                          for fd in (out_r, err_r))
        return status, stdout, stderr

    def _end_without_namespace(self, child: int | None) -> None:
        """Kill the code's session, and as root every process of the call's uid (escaped sessions too), then
        reap all: without a PID namespace, orphans come to us as the child subreaper."""
        if child:
            try:
                os.killpg(child, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.sweep()

    def sweep(self) -> None:
        """Without a PID namespace: as root, have the zygote kill every process of the uid (from a throwaway
        child: the supervisor never takes the code's uid) until no child of ours but the zygote is left."""
        while True:
            if self.uid is not None and not self.pid_namespace:
                self.zygote.send(b"k")
                self.zygote.recv(1)
            self.reap_all(block=False)
            if self.uid is None or self.pid_namespace or set(_children()) <= {self.zygote_pid}:
                return

    def reap_all(self, block: bool = True) -> None:
        while True:
            try:
                if os.waitpid(-1, 0 if block else os.WNOHANG)[0] == 0:
                    return
            except ChildProcessError:
                return


def _children() -> list[int]:
    me = os.getpid()
    return [int(p) for task in os.listdir(f"/proc/{me}/task")
            for p in open(f"/proc/{me}/task/{task}/children").read().split()]


def _read(fd: int) -> bytes | None:
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
