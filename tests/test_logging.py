"""The run log as a person reads it: a progress bar over the step lines on a terminal, and one plain line
per logged step (no bar, no redraws) when stdout is a file, as under Slurm or `> log`."""
import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios

from conftest import ROOT

# Three steps logged, every second one shown (and always the last), then the end-of-run lines.
SCRIPT = """
import sys
from pathlib import Path
from rlcore.outputs.metrics import RunLogger
log = RunLogger(Path(sys.argv[1]), total_steps=3, enabled=True, every=2)
log.log(0, {"eval/accuracy": 0.25})
for step in (1, 2, 3):
    log.log(step, {"reward/mean": 0.5 * step, "policy/entropy": 1.25, "rollout/logprob_diff_max": 1e-05,
                   "time/step_s": 0.5})
log.print("eval/accuracy on 8 held-out prompts: start 25.0% -> end 75.0% (+50.0 points)")
log.print("# rlcore run summary: demo")
log.close()
"""
EXPECTED = ["step 0/3: eval_acc=0.25",
            "step 2/3: reward=1 entropy=1.25 lp_diff=1e-05 s=0.5",
            "step 3/3: reward=1.5 entropy=1.25 lp_diff=1e-05 s=0.5",
            "eval/accuracy on 8 held-out prompts: start 25.0% -> end 75.0% (+50.0 points)",
            "# rlcore run summary: demo"]


def test_a_log_file_gets_plain_lines_only(tmp_path):
    log = tmp_path / "log"
    with open(log, "w") as out:
        proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "run")], stdout=out,
                              stderr=subprocess.STDOUT, env=os.environ | {"PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.returncode == 0, log.read_text()
    assert log.read_text() == "\n".join(EXPECTED) + "\n"  # no bar, no carriage returns, nothing re-emitted
    steps = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(steps) == 4  # every step reaches the metrics file, whatever train.log_every shows


def test_the_progress_line_shows_the_alarm_of_the_mode(tmp_path):
    """On-policy the line shows lp_diff (the engine-vs-trainer gap, the drift alarm); off-policy (split k >= 1,
    streaming) that gap is staleness: the line shows the probe's gap after the load and the staleness instead,
    and the behaviour gap stays in metrics.jsonl under its own name."""
    from rlcore.outputs.metrics import RunLogger

    step = {"reward/mean": 0.5, "policy/entropy": 0.25, "rollout/logprob_diff_max": 1.55,
            "async/probe_logprob_diff_max": 9e-06, "async/staleness_mean": 1.0, "async/token_staleness_mean": 0.5,
            "time/step_s": 0.25}
    lines = {}
    for off_policy in (False, True):
        log = RunLogger(tmp_path / str(off_policy), total_steps=1, enabled=True, off_policy=off_policy)
        shown = []
        log.print = shown.append  # the lines rank 0 would print
        log.log(1, step)
        log.close()
        lines[off_policy] = shown
        assert json.loads((tmp_path / str(off_policy) / "metrics.jsonl").read_text())["rollout/logprob_diff_max"] == 1.55
    assert lines[False] == ["step 1/1: reward=0.5 entropy=0.25 lp_diff=1.55 s=0.25"]
    assert lines[True] == ["step 1/1: reward=0.5 entropy=0.25 probe_diff=9e-06 stale=0.5 s=0.25"]  # per token first


def test_a_terminal_gets_the_bar_above_which_the_lines_scroll(tmp_path):
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path / "run")], stdout=follower,
                            stderr=follower, env=os.environ | {"PYTHONPATH": str(ROOT)})
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert proc.wait(timeout=120) == 0
    os.close(leader)
    screen = b"".join(chunks).decode()
    assert "\r" in screen and "rlcore: 100%" in screen and "3/3" in screen  # the bar, drawn and redrawn
    lines = [line.strip("\r") for line in screen.replace("\r\n", "\n").split("\n")]
    for expected in EXPECTED:
        assert any(line.endswith(expected) or line == expected for line in lines), expected


LIBRARY_LOGS = """
import json, logging, os, sys, warnings
from rlcore.outputs import library_logs
library_logs.before_imports(sys.argv[1:])
import datasets.utils  # already loaded when launch/train.py applies the run's choice
library_logs.apply(json.loads(os.environ.get("KEY", "false")))
warnings.warn_explicit("old API", FutureWarning, "dispatcher.py", 1, module="vllm.triton_utils.dispatcher")
warnings.warn_explicit("rlcore's own", FutureWarning, "x.py", 1, module="rlcore.x")
logging.basicConfig()
logging.getLogger("vllm.platforms.cpu").warning("libtcmalloc is not found")
logging.getLogger("vllm.engine").error("a vLLM error")
logging.getLogger("datasets").warning("a datasets warning")
logging.getLogger("rlcore.x").warning("rlcore's warning")
assert datasets.utils.are_progress_bars_disabled() != json.loads(os.environ.get("LOUD", "false"))
print(json.dumps({k: os.environ[k] for k in ("TORCH_CPP_LOG_LEVEL", "VLLM_LOGGING_LEVEL", "TRANSFORMERS_VERBOSITY")}))
"""


def library_log_lines(*argv: str, env: dict | None = None) -> tuple[dict, str]:
    clean = {k: v for k, v in os.environ.items() if k not in
             ("RLCORE_LIBRARY_LOGS", "TORCH_CPP_LOG_LEVEL", "VLLM_LOGGING_LEVEL", "TRANSFORMERS_VERBOSITY")}
    proc = subprocess.run([sys.executable, "-c", LIBRARY_LOGS, *argv], capture_output=True, text=True, timeout=120,
                          env=clean | {"PYTHONPATH": str(ROOT)} | (env or {}))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_other_libraries_keep_their_errors_only_unless_asked():
    """By default (what launch/train.py does before torch and vLLM load): vLLM's warnings and a library's
    deprecation notice are hidden; a vLLM error and rlcore's own warnings are not. The config key (on the
    command line or in the recipe) or RLCORE_LIBRARY_LOGS=1 bring everything back; a level the user set wins."""
    levels, err = library_log_lines()
    assert levels == {"TORCH_CPP_LOG_LEVEL": "ERROR", "VLLM_LOGGING_LEVEL": "ERROR", "TRANSFORMERS_VERBOSITY": "error"}
    assert "a vLLM error" in err and "rlcore's warning" in err and "rlcore's own" in err
    assert "libtcmalloc" not in err and "old API" not in err and "datasets warning" not in err
    loud = {"TORCH_CPP_LOG_LEVEL": "WARNING", "VLLM_LOGGING_LEVEL": "WARNING", "TRANSFORMERS_VERBOSITY": "warning"}
    for argv, env in ((["logging.library_logs=true"], {"KEY": "true"}), ([], {"RLCORE_LIBRARY_LOGS": "1"})):
        env["LOUD"] = "true"  # datasets' progress bars on
        levels, err = library_log_lines(*argv, env=env)
        assert levels == loud
        assert all(s in err for s in ("libtcmalloc", "old API", "a datasets warning", "a vLLM error")), err
    # the key set in a recipe: all but torch's C++ level, which torch fixed at import
    levels, _ = library_log_lines(env={"KEY": "true", "LOUD": "true"})
    assert levels == loud | {"TORCH_CPP_LOG_LEVEL": "ERROR"}
    levels, err = library_log_lines(env={"VLLM_LOGGING_LEVEL": "INFO"})
    assert levels["VLLM_LOGGING_LEVEL"] == "INFO" and "libtcmalloc" in err and "old API" not in err
