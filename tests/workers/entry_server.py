"""One warm process that runs launch/train.py's main(argv) again and again, for the tests of bad input.

Each request is a JSON line on stdin: {"argv": [...], "env": {...}, "path": [...]}; each answer is a JSON
line on the real stdout: {"returncode", "stdout", "stderr"}, what `python launch/train.py ARGV` would have
exited with and printed (Python-level output). Between requests the environment, sys.path and the modules
a request imported from its own folders are put back, and every process group is gone (main() leaves
them), so each request starts as a fresh world-size-1 run would. It saves a Python, torch and transformers
start per case: the bad-input tiers run dozens of cases that each stop within a second of starting.
"""
import contextlib
import io
import json
import os
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "launch"))
import train as entry  # noqa: E402  (launch/train.py)

from warm import exit_code, isolated  # noqa: E402  (tests/workers/warm.py)

answers = os.fdopen(os.dup(1), "w")  # the real stdout: a request's own prints are captured below


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


for line in sys.stdin:
    request = json.loads(line)
    out, err = io.StringIO(), io.StringIO()
    # a fresh rendezvous per run, as a new process would pick
    with isolated(request.get("env", {}) | {"MASTER_PORT": str(free_port())}, request.get("path", [])):
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = exit_code(lambda: entry.main(request["argv"]))
    answers.write(json.dumps({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}) + "\n")
    answers.flush()
