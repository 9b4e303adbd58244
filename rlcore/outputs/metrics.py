"""Rank-0 run logging: TensorBoard events, metrics.jsonl (one object per step), and progress lines under a
progress bar on a terminal, or plain lines (no bar, no redraws) when stdout is a file or a pipe (Slurm,
`> log`)."""
from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import torch
from tqdm import tqdm

# Keys every training step logs (tests check this list).
STEP_KEYS = (
    "reward/mean", "reward/std", "response/length_mean", "policy/kl", "policy/entropy",
    "policy/clip_frac", "policy/grad_norm", "rollout/logprob_diff_mean", "rollout/logprob_diff_max",
    "rollout/logprob_diff_p99",
    "time/generate_s", "time/rollout_s", "time/reward_s", "time/logprobs_s", "time/train_s", "time/sync_s",
    "time/step_s",
    "throughput/generate_tok_s", "throughput/sync_gb_s", "time/sync_share", "memory/peak_gb", "train/skipped_steps",
)
# The short progress line shows these. On-policy, lp_diff is the drift alarm's own number (engine vs trainer on
# the sampled tokens). Off-policy (split at k >= 1, streaming) that gap is the policy's staleness, not a fault:
# the line shows the alarm's number there, the probe's gap after each load, and the staleness instead.
PROGRESS_KEYS = (("reward/mean", "reward"), ("eval/accuracy", "eval_acc"), ("policy/entropy", "entropy"),
                 ("rollout/logprob_diff_max", "lp_diff"), ("agent/failed_frac", "failed"), ("time/step_s", "s"))
OFF_POLICY_KEYS = (("reward/mean", "reward"), ("eval/accuracy", "eval_acc"), ("policy/entropy", "entropy"),
                   ("async/probe_logprob_diff_max", "probe_diff"), ("async/token_staleness_mean", "stale"),
                   ("async/staleness_mean", "stale"), ("agent/failed_frac", "failed"), ("time/step_s", "s"))


def peak_memory_gb() -> float:
    """Peak GPU memory torch allocated in this process, or on CPU its peak resident memory (VmHWM), since the
    last reset_peak_memory()."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 2**20  # KiB
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux, never reset


def reset_peak_memory() -> None:
    """Start a phase's peak from the memory in use now (Linux resets VmHWM on writing 5 to clear_refs)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _turn(key: str) -> int:
    return int(key.removeprefix("env/active_turn")) if key.startswith("env/active_turn") else 0


class RunLogger:
    def __init__(self, run_dir: Path, total_steps: int, enabled: bool, start_step: int = 0,
                 wandb: dict | None = None, every: int = 1, off_policy: bool = False):
        """start_step > 0: a resumed run keeps the log of steps up to it and drops any later lines
        (steps a killed run logged after its last checkpoint are trained again).
        wandb: {"project", "name", "config"} mirrors every logged key and the config to Weights & Biases
        (imported here, only when asked for; WANDB_MODE=offline writes runs/<name>/wandb/ only).
        every: steps between progress lines (the last step always has one); every step goes to the files.
        off_policy: the progress line shows the probe's gap and the staleness (OFF_POLICY_KEYS)."""
        self.enabled, self.wandb, self.total, self.every = enabled, None, total_steps, every
        self.keys = OFF_POLICY_KEYS if off_policy else PROGRESS_KEYS
        if not enabled:
            return
        if wandb is not None:
            import wandb as wandb_lib

            self.wandb = wandb_lib.init(project=wandb["project"], name=wandb["name"], config=wandb["config"],
                                        dir=str(run_dir), resume="allow", id=wandb.get("id"))
        from torch.utils.tensorboard import SummaryWriter

        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / "metrics.jsonl"
        kept = []
        if start_step and path.exists():
            kept = [line for line in path.read_text().splitlines(keepends=True)
                    if line.strip() and json.loads(line)["step"] <= start_step]
        self.jsonl = open(path, "w")  # a fresh run starts its log anew
        self.jsonl.writelines(kept)
        self.tb = SummaryWriter(str(run_dir / "tb"))
        # The bar redraws itself with carriage returns: only where a person watches a terminal.
        self.bar = tqdm(total=total_steps, initial=start_step, desc="rlcore", unit="step", dynamic_ncols=True) \
            if sys.stdout.isatty() and sys.stderr.isatty() else None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        for key, value in metrics.items():
            self.tb.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        self.jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self.jsonl.flush()
        if "time/step_s" in metrics and self.bar is not None:
            self.bar.update(1)
        if step % self.every and step != self.total:
            return
        shown, named = [], set()
        for key, short in self.keys:  # the first key present of each short name
            if key in metrics and short not in named:
                shown.append(f"{short}={metrics[key]:.4g}")
                named.add(short)
        active = [f"{metrics[k]:g}" for k in sorted(metrics, key=_turn) if k.startswith("env/active_turn")]
        if active:  # multi-turn: trajectories still running in turn 1, 2, ...
            shown.append("active=" + "/".join(active))
        self.print(f"step {step}/{self.total}: " + " ".join(shown))

    def print(self, line: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(line)  # above the bar, which is drawn again below it
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self.enabled:
            if self.bar is not None:
                self.bar.close()
            self.tb.close()
            self.jsonl.close()
            if self.wandb is not None:
                self.wandb.finish()
