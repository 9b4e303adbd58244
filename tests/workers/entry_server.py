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
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "launch"))
import train as entry  # noqa: E402  (launch/train.py)

answers = os.fdopen(os.dup(1), "w")  # the real stdout: a request's own prints are captured below
# Where rlcore, its tests and every installed library live: modules from anywhere else are a request's own
# (a test's recipe or reward file in its tmp_path) and are dropped after it, never a library's.
OURS = (str(ROOT), sys.prefix, sys.base_prefix)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


for line in sys.stdin:
    request = json.loads(line)
    env, path, modules = dict(os.environ), list(sys.path), set(sys.modules)
    os.environ.update(request.get("env", {}))
    os.environ["MASTER_PORT"] = str(free_port())  # a fresh rendezvous per run, as a new process would pick
    sys.path[:0] = request.get("path", [])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = entry.main(request["argv"])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # what would have been an uncaught exception: a traceback and exit 1
            traceback.print_exc()
            code = 1
    os.environ.clear()
    os.environ.update(env)
    sys.path[:] = path
    for name in set(sys.modules) - modules:  # the user's own modules (recipes, rewards) go; libraries stay
        file = getattr(sys.modules[name], "__file__", None) or ""
        if name.startswith("rlcore_recipe_") or (file and not file.startswith(OURS)):
            del sys.modules[name]
    answers.write(json.dumps({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}) + "\n")
    answers.flush()
