"""The step skeleton: what every mode does around a step, written once.

A mode (rlcore/modes/: colocated.py, split.py, stream/) decides who generates, who trains and where the
two meet; everything else about a step lives here and reads the same in every mode:

    loop.begin(trained)              resume (models, optimizers, prompts, RNG, this state) or eval step 0
    for step ...:
        metrics = <the mode's step>  collect -> logprobs -> advantages -> update -> sync
        loop.count(metrics)          the non-finite guard's counters (train/skipped_steps)
        loop.evaluate(metrics)       held-out eval every train.eval_every steps and at the end
        loop.record(step, metrics)   progress line, summary, run report
        loop.check_skipped(step)     stop after train.max_skipped_steps non-finite steps in a row
        loop.save(...) / export(...) when due (train.save_every / export_every, the end, a signal)

`Loop.state` is what a checkpoint saves of the loop (trainer.pt), with the same keys in every mode, so a
resume restores the same things whichever mode wrote it.
"""
from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rlcore.distributed.collectives import Preempted, RunError
from rlcore.outputs import checkpoint, export
from rlcore.rollout.collect import evaluate

if TYPE_CHECKING:
    from rlcore.outputs.summary import Summary
    from rlcore.run import Run


class Loop:
    def __init__(self, run: Run, report: Summary, stop: checkpoint.StopSignal):
        self.run, self.cfg, self.report, self.stop = run, run.cfg, report, stop
        # The loop's counters: with the RNG states and the prompt streams, all a resumed run needs.
        self.state: dict = {"step": 0, "skipped_steps": 0, "skipped_in_a_row": 0}
        self.summary: dict[str, float] = {}  # the last value of every metric (the run's return value)

    # ---- start ------------------------------------------------------------------------------------------

    def begin(self, trained: dict) -> int:
        """Collective: load the checkpoint (`trained`: this rank's models, optimizers and schedulers) or
        evaluate the starting policy (ranks with an engine). Returns the step to continue after."""
        run = self.run
        if run.resume_from is not None:
            loaded, notes = checkpoint.load(run.resume_from, trained, *self._stream())
            for line in notes:
                run.logger.print(line)
            self.state |= loaded  # a checkpoint older than a counter keeps its default
            self.summary = {k: v for k, v in self.state.items() if k.startswith("eval/")}
            return self.state["step"]
        if run.rollout is not None and run.rollout.eval_rows:
            t = time.perf_counter()
            self.summary["eval/accuracy_start"] = self.state["eval/accuracy_start"] = evaluate(run)["eval/accuracy"]
            self.report.extra |= {"time/eval_s": time.perf_counter() - t,
                                  "eval/accuracy_start": self.summary["eval/accuracy_start"]}
            run.logger.log(0, {"eval/accuracy": self.summary["eval/accuracy_start"]})
        return 0

    def _stream(self) -> tuple:
        """(this rank's prompt stream, its rollout group): (None, 0) on a trainer rank of a split mesh."""
        r = self.run.rollout
        return (r.prompts, r.group) if r is not None else (None, 0)

    # ---- each step --------------------------------------------------------------------------------------

    def count(self, step: int, metrics: dict) -> None:
        """The non-finite guard (rlcore/train/update.py) skipped the step or not: count it."""
        skipped = metrics.pop("train/skipped")
        s = self.state
        s["step"], s["skipped_steps"] = step, s["skipped_steps"] + int(skipped)
        s["skipped_in_a_row"] = s["skipped_in_a_row"] + 1 if skipped else 0
        metrics["train/skipped_steps"] = s["skipped_steps"]

    def check_skipped(self, step: int) -> None:
        if self.state["skipped_in_a_row"] >= self.cfg.train.max_skipped_steps:
            raise RunError(f"{self.state['skipped_in_a_row']} steps in a row had a non-finite loss or gradient "
                           f"(train.max_skipped_steps={self.cfg.train.max_skipped_steps}); stopped at step {step} "
                           f"with the weights of the last finite step")

    def evaluate(self, step: int, metrics: dict) -> None:
        """Held-out eval every train.eval_every steps and at the last (ranks with an engine)."""
        t = self.cfg.train
        if self.run.rollout.eval_rows and (step % t.eval_every == 0 or step == t.steps):
            t0 = time.perf_counter()
            metrics |= evaluate(self.run)
            metrics["time/eval_s"] = time.perf_counter() - t0

    def plan_metrics(self) -> dict[str, float]:
        """The launch plan's memory bars (per GPU, or per CPU rank), logged beside the measured peaks."""
        plan = self.run.plan
        return {} if plan is None else {"memory/plan_generation_gb": plan.generation.total / 2**30,
                                        "memory/plan_train_gb": plan.train.total / 2**30}

    def record(self, step: int, metrics: dict) -> None:
        self.run.logger.log(step, metrics)
        self.summary |= metrics
        self.report.add(metrics)

    # ---- checkpoints, exports, signals ------------------------------------------------------------------

    def save_due(self, step: int) -> bool:
        t = self.cfg.train
        return step == t.steps or bool(t.save_every and step % t.save_every == 0)

    def export_due(self, step: int) -> bool:
        t = self.cfg.train
        return step == t.steps or bool(t.export_every and step % t.export_every == 0)

    def save(self, step: int, trained: dict, extra: dict | None = None, writer: int = 0) -> Path:
        """Collective: checkpoint step `step` with this loop's state. A save that fails stops the run (every
        rank) and names the checkpoint that is still intact."""
        run, t0 = self.run, time.perf_counter()
        root = run.run_dir / "checkpoints"
        try:
            path = checkpoint.save(root, step, trained, self._stream()[0], self.state, run.meta,
                                   self.cfg.train.keep_checkpoints, run.tokenizer, extra=extra, writer=writer)
        except checkpoint.SaveError as e:
            raise self._failed(e) from None
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20
        run.logger.print(f"checkpoint {path} ({size:.1f} MiB, {time.perf_counter() - t0:.1f} s)")
        return path

    def export(self, step: int, group=None, writer: int = 0) -> None:
        """Collective over the trainer ranks: the policy as a Hugging Face folder, hf/step_<step>."""
        run = self.run
        try:
            export.export_hf(run.run_dir / "hf" / f"step_{step}", run.trainer.policy, self.cfg.model.path,
                             run.tokenizer, merged=self.cfg.lora.export_merged, group=group, writer=writer)
        except checkpoint.SaveError as e:
            raise self._failed(e) from None

    def _failed(self, e: checkpoint.SaveError) -> RunError:
        complete = checkpoint.scan(self.run.run_dir / "checkpoints")[0]
        return RunError(f"{e}; " + (f"{complete[-1]} is intact" if complete else "there is no earlier checkpoint"))

    def preempted(self, step: int, path: Path | None) -> Preempted:
        """The error every rank raises after a signal's checkpoint (exit 75: requeue and resume)."""
        name = signal.Signals(self.stop.received).name if self.stop.received else "a signal to another rank"
        if path is None:  # before the first step: nothing trained, nothing to save
            return Preempted(f"{name} before step 1; nothing to checkpoint; start again")
        return Preempted(f"{name} after step {step}; checkpoint {path} written; continue with resume=auto")
