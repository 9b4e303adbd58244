"""Shared test helpers: real torchrun processes on CPU/gloo, and tiny local models."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKERS = Path(__file__).parent / "workers"

FP32_EPS = 2.0 ** -23  # torch.finfo(torch.float32).eps
# Engine (vLLM's CPU kernels) vs trainer (transformers) logprobs of the same tokens, fp32 on both sides, on the tiny
# models: the same arithmetic in other orders. A logit passes through reductions of total length n = 2 layers x
# (6 x 128 [q k v o gate up] + 256 [down] + 64 [keys]) + 128 [head] + 32 [logsumexp] = 2336; independent roundings
# grow as sqrt(n) * eps per unit of |logit|, and the tiny models' logits stay below 15 (the largest |logit| on their
# held-out prompts and answers, measured 2026-11-27: demo 10.2, tooladd 11.5, calculator 13.1, guess 4.6; random
# models ~1): sqrt(2336) * 1.19e-7 * 15 = 8.6e-5 <= 1e-4. (The worst case, n * eps *
# |logit| = 4e-3, is above the runs' own stop at rollout.logprob_diff_threshold=1e-3.)
ENGINE_BOUND = 1e-4
# Set in this process by importing rlcore.engine.rollout_engine (its default level when no entry point chose one); a
# launched run gets the user's environment, so launch/train.py picks the libraries' levels (rlcore/outputs/library_logs.py).
IMPORT_SET = {"VLLM_LOGGING_LEVEL"} - set(os.environ)


def torchrun(script: str | Path, *args: str, nproc: int = 2, timeout: int = 600,
             env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `torchrun --standalone --nproc-per-node nproc script args` and capture its output."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(script), *map(str, args)]
    inherited = {k: v for k, v in os.environ.items() if k not in IMPORT_SET}
    full_env = inherited | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)} | (env or {})
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
    log_launch("fresh", nproc, t0, proc.returncode, forced="forcefully exiting via 9" in proc.stderr)
    return proc


def log_launch(kind: str, nproc: int, t0: float, code: int, forced: bool = False) -> None:
    """With RLCORE_LAUNCH_LOG=FILE, one JSON line per launch of the slow tier (the test, "fresh" / "shared start" /
    "shared", ranks, seconds, exit code, and whether torchrun had to SIGKILL a rank its SIGTERM did not stop, 30 s
    later): where the suite's time goes (benchmarks/RESULTS.md, the suite sections)."""
    if os.environ.get("RLCORE_LAUNCH_LOG"):
        with open(os.environ["RLCORE_LAUNCH_LOG"], "a") as f:
            f.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "kind": kind, "nproc": nproc,
                                "s": round(time.perf_counter() - t0, 2), "code": code, "forced": forced}) + "\n")


def train_cmd(*overrides: str, nproc: int = 2, timeout: int = 600, env: dict | None = None):
    """The real entry point: torchrun launch/train.py with recipe + overrides."""
    return torchrun(ROOT / "launch" / "train.py", *overrides, nproc=nproc, timeout=timeout, env=env)


class RunServer:
    """The slow tier's shared launch: one torchrun job (tests/workers/run_server.py) that runs
    launch/train.py's main(argv) for run after run, each with its own process groups, engines and run folder.
    For runs whose test reads their numbers, files, error lines and exit codes, not the launch itself. A run that
    exits 0 keeps the job; so does one that stops with an error every rank raised together, once it left nothing
    behind on any rank (tests/workers/run_server.py says what is checked). Any other failed run ends the job (the
    next run starts a new one). Signals, kills, torchrun's own report, crashes and startup stay with train_cmd's
    fresh launches. `test_train.py` checks that a run here logs and exports what a fresh
    launch does."""

    def __init__(self, nproc: int):
        self.nproc = nproc
        self.proc: subprocess.Popen | None = None
        self.folder: Path | None = None
        self.n = 0

    def start(self) -> None:
        if self.folder is not None:  # the job before, ended by a failed run that its test has reported
            shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = Path(tempfile.mkdtemp(prefix="rlcore-runs-"))
        self.n = 0
        inherited = {k: v for k, v in os.environ.items() if k not in IMPORT_SET}
        with open(self.folder / "torchrun.txt", "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={self.nproc}",
                 str(WORKERS / "run_server.py"), str(self.folder)], cwd=ROOT, stdout=log, stderr=log,
                start_new_session=True, env=inherited | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})

    def request(self, n: int, body: dict) -> None:
        tmp = self.folder / f"req-{n}.tmp"
        tmp.write_text(json.dumps(body))
        tmp.rename(self.folder / f"req-{n}.json")

    def train(self, *overrides: str, timeout: int = 600, env: dict | None = None,
              script: Path | None = None) -> subprocess.CompletedProcess:
        """As train_cmd(*overrides, env=env), or torchrun(script, *overrides, env=env): the ranks' stdout and stderr,
        returncode 0 when every rank exits 0 (else the first non-zero rank's code; -9 when the job died or ran past
        `timeout`, and was killed)."""
        t0, kind = time.perf_counter(), "shared"
        if self.proc is None or self.proc.poll() is not None:
            self.start()
            kind = "shared start"
        proc = self.run(overrides, timeout, env, script)
        log_launch(kind, self.nproc, t0, proc.returncode)
        return proc

    def run(self, overrides, timeout: int, env: dict | None, script: Path | None) -> subprocess.CompletedProcess:
        n, self.n = self.n, self.n + 1
        self.request(n, {"argv": [str(a) for a in overrides], "env": env or {}, "port": free_port()}
                     | ({"script": str(script)} if script else {}))
        deadline, results = time.monotonic() + timeout, {}
        while len(results) < self.nproc:
            for rank in set(range(self.nproc)) - set(results):
                res = self.folder / f"res-{n}-rank{rank}.json"
                if res.exists():
                    results[rank] = json.loads(res.read_text())
            if len(results) < self.nproc and (self.proc.poll() is not None or time.monotonic() > deadline):
                self.kill()
                break
            time.sleep(0.05)
        codes = {rank: results[rank]["code"] if rank in results else -9 for rank in range(self.nproc)}
        failed = [c for c in codes.values() if c != 0]
        ended = failed and (len(results) < self.nproc or any(r["left"] for r in results.values()))
        if ended:  # the job ends by itself (tests/workers/run_server.py): the next run starts a new one
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()
        read = lambda kind: "".join(p.read_text() for p in sorted(self.folder.glob(f"{kind}-{n}-rank*.txt")))
        left = "".join(f"the shared launch ends: rank {rank} left behind {'; '.join(r['left'])}\n"
                       for rank, r in sorted(results.items()) if ended and r["left"])
        proc = subprocess.CompletedProcess(["run_server", *map(str, overrides)], failed[0] if failed else 0,
                                           read("out"), read("err") + (left + self.log() if ended else ""))
        proc.rank_codes = codes
        return proc

    def log(self) -> str:
        return (self.folder / "torchrun.txt").read_text()[-4000:]

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.request(self.n, {"quit": True})
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.folder is not None:  # what a failed run printed is in its test's report already
            shutil.rmtree(self.folder, ignore_errors=True)


_runs: dict[int, RunServer] = {}


def train_warm(*overrides: str, nproc: int = 2, timeout: int = 600,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """train_cmd in the shared launch of `nproc` ranks (RunServer): for a run that exits 0, or that every rank stops
    together (bad input, a run's own checks)."""
    return _runs.setdefault(nproc, RunServer(nproc)).train(*overrides, timeout=timeout, env=env)


def torchrun_warm(script: str | Path, *args: str, nproc: int = 2, timeout: int = 600,
                  env: dict | None = None) -> subprocess.CompletedProcess:
    """torchrun(script, *args) in the shared launch of `nproc` ranks, as train_warm (the process groups and engines a
    worker leaves are shut by the shared launch, as by the end of a process; what it patches it puts back)."""
    return _runs.setdefault(nproc, RunServer(nproc)).train(*args, timeout=timeout, env=env, script=Path(script))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_exit_codes(proc: subprocess.CompletedProcess) -> set[int]:
    """Exit codes of the ranks that stopped by themselves, from torchrun's failure report (torchrun
    itself exits 1). Ranks torchrun terminated once the first one exited (-15, SIGTERM) are left out.
    A run in the shared launch: the non-zero codes its ranks' main() returned (launch/train.py exits with them)."""
    if hasattr(proc, "rank_codes"):
        return set(proc.rank_codes.values()) - {0}
    return {int(m) for m in re.findall(r"exitcode\s*:\s*(-?\d+)", proc.stderr)} - {-15}


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Random-init tiny Qwen2 / Qwen3 / Llama folders (model + tokenizer), built once per session."""
    from rlcore.tasks import tiny

    root = tmp_path_factory.mktemp("models")
    return {arch: tiny.build_random_model(root / arch, arch=arch, seed=0) for arch in ("qwen2", "qwen3", "llama")}


@pytest.fixture(scope="session")
def demo_model() -> Path:
    """The demo's model folder, built by its prepare step (or by the suite's warm-start process: it waits for it).
    A unit test that needs it takes this fixture, which runs it at the unit tier's end (the suite's order, below)."""
    from rlcore.config.cli import parse_argv
    from rlcore.tasks import tiny

    tiny.prepare(parse_argv(["recipe=demo"], ROOT / "recipes"))
    return tiny.model_dir()


# ---- the suite's order, and the warm starts built ahead -----------------------------------------------------

# The tiny tasks' warm starts (rlcore/tasks/), in the order the slow tier first needs them. Built once into
# RLCORE_CACHE by whichever process gets there first (a file lock: the others wait and read the cache).
WARM_STARTS = ("from rlcore.tasks import calculator, guess, tiny, tooladd; tooladd.prepare(); tiny.prepare(); "
               "tiny.prepare_teacher(); calculator.prepare(); guess.prepare(); tooladd.prepare_columns()")
_builder: subprocess.Popen | None = None
_builder_log: Path | None = None


def pytest_collection_modifyitems(session, config, items):
    """The unit tier first, then the slow tier (each in file order, but the unit tests that may need a warm start
    at the unit tier's end). With slow tests to come, one process builds
    the warm starts meanwhile, on the core the single-threaded unit tier leaves idle: otherwise each build runs
    inside the first run that needs it, on its rank 0, while the other rank waits."""
    global _builder, _builder_log
    slow = [item for item in items if item.get_closest_marker("slow")]
    unit = [item for item in items if not item.get_closest_marker("slow")]
    # The unit tests that need the demo's model (`demo_model`), and those that run launch/train.py in the entry
    # server (whose recipes prepare their warm starts first), wait for the builds: last in their tier, they find
    # them built (the first of them in file order waited ~24-27 s of the tier's ~110-135 s with one core idle).
    waits = [item for item in unit if {"demo_model", "entry"} & set(getattr(item, "fixturenames", ()))]
    items[:] = [item for item in unit if item not in waits] + waits + slow
    if slow and _builder is None:
        log = tempfile.NamedTemporaryFile("w", prefix="rlcore-warm-starts-", suffix=".log", delete=False)
        _builder_log = Path(log.name)
        _builder = subprocess.Popen([sys.executable, "-c", WARM_STARTS], cwd=ROOT, stdout=log, stderr=log,
                                    env=os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})


def pytest_sessionfinish(session, exitstatus):
    for server in _runs.values():
        server.close()
    if _builder is not None and _builder.poll() is None:  # a run stopped early: the cache stays unbuilt, not half-built
        _builder.terminate()
        _builder.wait(timeout=60)
    if _builder is not None and _builder.returncode == 0:  # a failed build's log stays for whoever looks
        _builder_log.unlink(missing_ok=True)


class EntryServer:
    """launch/train.py's main(argv), run in one warm process (tests/workers/entry_server.py) instead of a new
    `python launch/train.py` per case: for runs that stop on bad input before any engine starts."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-u", str(WORKERS / "entry_server.py")], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})

    def train(self, *args, env: dict | None = None, path: list | None = None) -> subprocess.CompletedProcess:
        """As `python launch/train.py ARGS` with `env` added and `path` (PYTHONPATH entries) in front."""
        import json

        self.proc.stdin.write(json.dumps({"argv": [str(a) for a in args], "env": env or {},
                                          "path": [str(p) for p in path or []]}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the entry server died (exit {self.proc.poll()})"
        answer = json.loads(line)
        return subprocess.CompletedProcess(["launch/train.py", *map(str, args)], answer["returncode"],
                                           answer["stdout"], answer["stderr"])

    def close(self):
        if self.proc.poll() is None:  # a server that died was reported by the request it failed
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


@pytest.fixture(scope="session")
def entry():
    server = EntryServer()
    yield server
    server.close()
