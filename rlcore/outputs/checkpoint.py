"""Long runs: sharded checkpoints, exact resume, and stopping cleanly on a signal.

On disk, under runs/<name>/:

    checkpoints/step_<N>/          one complete checkpoint, renamed into place only once complete
        .metadata, __<r>_0.distcp  torch.distributed.checkpoint (DCP): every trained model and its
                                   optimizer, as sharded while training (loads onto any world size);
                                   with LoRA the adapters and their optimizer state only
        trainer.pt                 rank 0: LR schedulers and the loop's counters (step, skipped steps)
        rank_<r>.pt                rank r: RNG states (python, numpy, torch CPU, device), prompt stream
        model_files/               config.json, generation_config.json, tokenizer: what an export needs
        COMPLETE.json              written last: step, world size, model, algorithm, config fingerprint
    checkpoints/.step_<N>.tmp/     a save in progress, or one a crash cut short: ignored (and reported),
                                   removed by the next save
    hf/step_<N>/                   consolidated safetensors + config + tokenizer (rlcore/outputs/export.py)

A save writes everything into the temporary sibling, then COMPLETE.json, then renames: a directory
named step_<N> is always whole. Rollout seeds derive from (run seed, step, prompt index), so the
step, the RNG states and the prompt stream's position are all a resumed run needs to make the same
decisions. Checkpoints and exports must be on a file system every rank sees.

Why one file of ~350 lines: saving, resolving, loading and the stop signal share one on-disk layout (step_<N>/,
COMPLETE.json, rank files), kept in one place.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from rlcore.distributed import watchdog
from rlcore.distributed.collectives import first_error

MARKER = "COMPLETE.json"
# What a checkpoint saved before a key resolve() keeps existed ran with.
SAVED_BEFORE = {"rollout.load_lag_steps": "auto"}
# Keys a resumed run may change without a note (they say how long or how often, not what is trained).
VOLATILE = ("resume", "plan.show", "plan.strict", "logging.wandb", "logging.wandb_project", "name", "output_dir",
            "train.steps", "train.save_every", "train.keep_checkpoints", "train.export_every", "train.eval_every",
            "train.log_every", "train.max_skipped_steps", "train.watchdog_s", "lora.export_merged")


class SaveError(RuntimeError):
    """A checkpoint or export could not be written (every rank raises it together)."""


def _agree(error: str | None, group=None) -> None:
    """Collective (over `group`, default the world): if any rank failed, every rank raises SaveError with the
    first message."""
    first = first_error(error, group)
    if first:
        raise SaveError(first)


# ---------------------------------------------------------------------------------------------- identity

def flat_config(cfg) -> dict:
    from rlcore.config.cli import config_to_dict

    def walk(value, prefix):
        if isinstance(value, dict):
            for k, v in value.items():
                yield from walk(v, f"{prefix}.{k}" if prefix else k)
        else:
            yield prefix, value
    return dict(walk(config_to_dict(cfg), ""))


def describe(cfg, world_size: int, rollout_groups: int) -> dict:
    """What COMPLETE.json records about the run (the step is added at save time)."""
    flat = flat_config(cfg)
    kept = {k: v for k, v in flat.items() if k not in VOLATILE}
    model = os.path.abspath(cfg.model.path) if os.path.exists(cfg.model.path) else cfg.model.path
    return {"name": cfg.name, "model_path": model, "algorithm": flat.get("algorithm._target", ""),
            "world_size": world_size, "rollout_groups": rollout_groups,
            "fingerprint": hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16],
            "config": kept}


def scan(root: Path) -> tuple[list[Path], list[Path]]:
    """(complete checkpoints oldest first, incomplete ones: temporaries and step dirs without a marker)."""
    if not root.is_dir():
        return [], []
    steps = sorted((p for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit()),
                   key=lambda p: int(p.name[5:]))
    partial = sorted(root.glob(".step_*.tmp")) + [p for p in steps if not (p / MARKER).is_file()]
    return [p for p in steps if (p / MARKER).is_file()], partial


def resolve(cfg, run_dir: Path, meta: dict) -> tuple[Path | None, list[str]]:
    """cfg.resume -> (checkpoint dir or None, lines to print). Cheap (reads JSON only), so it runs
    before anything loads; a missing, incomplete or foreign checkpoint raises a one-line ValueError."""
    if not cfg.resume:
        return None, []
    notes = []
    if cfg.resume == "auto":
        root = run_dir / "checkpoints"
        complete, partial = scan(root)
        if partial:
            notes.append(f"resume=auto: ignoring incomplete checkpoint(s) (a save was cut short): "
                         f"{', '.join(p.name for p in partial)}")
        if not complete:
            return None, notes + [f"resume=auto: no complete checkpoint in {root}; starting fresh"]
        path = complete[-1]
    else:
        path = Path(cfg.resume).expanduser()
        if not path.is_dir():
            raise ValueError(f"resume='{cfg.resume}' does not exist (expected a checkpoints/step_<N> directory "
                             f"or resume=auto)")
        if not (path / MARKER).is_file():
            raise ValueError(f"resume='{cfg.resume}' is not a complete checkpoint (no {MARKER}: its save was "
                             f"cut short, or it is not a checkpoint directory)")
    saved = json.loads((path / MARKER).read_text())
    for key, field in (("model_path", "model.path"), ("algorithm", "algorithm")):
        if saved[key] != meta[key]:
            raise ValueError(f"resume: checkpoint {path} was saved by a run with {field} '{saved[key]}', "
                             f"but this run has {field} '{meta[key]}'")
    # A split mesh's checkpoint holds its batches in flight, sampled ahead by its staleness; a colocated one
    # holds none. They do not convert into each other. A split one's rollout ranks continue as they were (prompt
    # streams, batches in flight): only the trainer count may change. Streaming's load points follow
    # rollout.load_lag_steps: another lag would load versions at other engine steps.
    split, stream = saved["config"].get("rollout.ranks", 0), saved["config"].get("rollout.stream")
    kept = ["rollout.ranks", "rollout.max_staleness", "rollout.stream"] + \
        ["rollout.tensor_parallel"] * bool(split or stream) + ["rollout.load_lag_steps"] * bool(stream)
    for key in kept:
        before, now = saved["config"].get(key, SAVED_BEFORE.get(key, 0)), meta["config"].get(key, 0)
        if before != now:
            raise ValueError(f"resume: checkpoint {path} was saved with {key}={before}, but this run has {key}={now}; "
                             f"resume with the same layout")
    # A LoRA checkpoint holds adapters of one shape only (and a full one no adapters): they must match.
    for key in ("lora.enabled", "lora.rank", "lora.targets") if meta["config"].get("lora.enabled") or \
            saved["config"].get("lora.enabled") else ():
        if saved["config"].get(key) != meta["config"].get(key):
            raise ValueError(f"resume: checkpoint {path} was saved with {key}={saved['config'].get(key)}, but this "
                             f"run has {key}={meta['config'].get(key)}")
    changed = sorted(k for k in set(saved["config"]) | set(meta["config"])
                     if saved["config"].get(k) != meta["config"].get(k))
    if changed:
        notes.append(f"resume: config differs from the checkpoint's in {', '.join(changed[:8])}"
                     + (" ..." if len(changed) > 8 else ""))
    return path, notes + [f"resume: continuing after step {saved['step']} from {path}"]


class RunComplete(Exception):
    """resume: the checkpoint is already at train.steps: nothing to do. Every rank raises it together, before any
    engine or model loads, and launch/train.py prints its one line and exits 0."""


def check_not_complete(cfg, run_dir: Path, path: Path | None) -> None:
    """Raise RunComplete when the checkpoint to resume from is at (or past) train.steps."""
    step = saved_step(path)
    if path is None or step < cfg.train.steps:
        return
    export = run_dir / "hf" / f"step_{step}"
    where = (f"its export is {export}" if export.is_dir() else
             f"no export at step {step} (python launch/convert.py {path} OUT writes one)")
    raise RunComplete(f"run '{cfg.name}' is complete: checkpoint {path} is at step {step} (train.steps="
                      f"{cfg.train.steps}); {where}. Raise train.steps to train longer")


def saved_step(path: Path | None) -> int:
    return json.loads((path / MARKER).read_text())["step"] if path is not None else 0


def saved_world(path: Path) -> int:
    return json.loads((path / MARKER).read_text())["world_size"]


# ---------------------------------------------------------------------------------------------- save / load

def _model_state(trained: dict) -> dict:
    """{name: {"model": ..., "optim": ...}} of DTensor shards; get_state_dict also creates empty
    optimizer state on a fresh optimizer, so DCP has tensors to load into."""
    state = {}
    for name, (model, optimizer, _) in trained.items():
        model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(model))
        state[name] = {"model": model_sd, "optim": optim_sd}
    return state


def _options(model) -> StateDictOptions:
    """A LoRA model (rlcore/models/lora.py) saves and loads its adapters only: the frozen base is model.path's,
    which COMPLETE.json records and resume checks."""
    from rlcore.models.lora import has_lora

    frozen = has_lora(model)
    return StateDictOptions(ignore_frozen_params=frozen, strict=not frozen)


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _write(obj, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def write_model_files(model_path: str, tokenizer, dest: Path) -> None:
    """config.json, generation_config.json (if the model has one) and the tokenizer, beside weights."""
    from transformers import AutoConfig, GenerationConfig

    AutoConfig.from_pretrained(model_path).save_pretrained(dest)
    try:
        GenerationConfig.from_pretrained(model_path).save_pretrained(dest)
    except OSError:  # the model ships none
        pass
    tokenizer.save_pretrained(dest)


@watchdog.stage("checkpoint")
def save(root: Path, step: int, trained: dict, prompts, loop: dict, meta: dict, keep: int,
         tokenizer, extra: dict | None = None, writer: int = 0) -> Path:
    """Collective: write checkpoints/step_<step> atomically and keep the newest `keep`. Any rank's
    failure (unwritable directory, full disk) raises SaveError on every rank; the temporary is
    removed and earlier checkpoints are untouched. A split mesh (rlcore/modes/split.py) passes each rank's
    batches in flight as `extra` (into rank_<r>.pt), no prompt stream on the trainer ranks and no models on
    the rollout ranks; `writer`, the first rank that trains, writes trainer.pt and the marker (rank 0 otherwise)."""
    rank, final, tmp = dist.get_rank(), root / f"step_{step}", root / f".step_{step}.tmp"
    error = None
    if rank == writer:
        try:
            root.mkdir(parents=True, exist_ok=True)
            for stale in root.glob(".step_*.tmp"):  # left by a save that was cut short
                shutil.rmtree(stale)
            tmp.mkdir()
        except OSError as e:
            error = f"cannot write checkpoint {final}: {e}"
    _agree(error)
    t0 = time.perf_counter()
    try:
        try:
            dcp.save(_model_state(trained), checkpoint_id=tmp)
            _write({"rng": rng_state(), "prompts": prompts.state_dict() if prompts is not None else None,
                    **(extra or {})}, tmp / f"rank_{rank}.pt")
            if rank == writer:
                _write({"schedulers": {n: s.state_dict() for n, (_, _, s) in trained.items()}, "loop": loop},
                       tmp / "trainer.pt")
                write_model_files(meta["model_path"], tokenizer, tmp / "model_files")
        except Exception as e:  # an OSError, or DCP's wrapper around one
            error = f"cannot write checkpoint {final}: {_first_line(e)}"
        _agree(error)
        if rank == writer:
            try:
                marker = meta | {"step": step, "trained": sorted(trained), "seconds": time.perf_counter() - t0,
                                 "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
                with open(tmp / MARKER, "w") as f:
                    json.dump(marker, f, indent=2)
                    f.flush()
                    os.fsync(f.fileno())
                _replace(tmp, final)
                for old in scan(root)[0][:-keep]:
                    shutil.rmtree(old)
            except OSError as e:
                error = f"cannot complete checkpoint {final}: {_first_line(e)}"
        _agree(error)
    except SaveError:
        if rank == writer:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else repr(e)


def _replace(tmp: Path, final: Path) -> None:
    """Rename tmp to final (moving aside an older copy of the same step) and make it durable."""
    old = final.with_name(f".{final.name}.old")
    if final.exists():
        os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@watchdog.stage("resume")
def load(path: Path, trained: dict, prompts, group: int) -> tuple[dict, list[str]]:
    """Collective: load a checkpoint into freshly built models, optimizers, schedulers and the prompt
    stream. Returns (the loop's counters, lines to print about what could not be carried over)."""
    saved = json.loads((path / MARKER).read_text())
    missing = set(trained) - set(saved["trained"])
    if missing:
        raise ValueError(f"resume: checkpoint {path} holds no {', '.join(sorted(missing))} "
                         f"(it was saved with {', '.join(saved['trained'])})")
    state = _model_state(trained)
    dcp.load(state, checkpoint_id=path)  # each rank reads the slices of its own shards
    for name, (model, optimizer, _) in trained.items():
        set_state_dict(model, optimizer, model_state_dict=state[name]["model"],
                       optim_state_dict=state[name]["optim"], options=_options(model))
    common = torch.load(path / "trainer.pt", weights_only=False)
    for name, (_, _, scheduler) in trained.items():
        scheduler.load_state_dict(common["schedulers"][name])

    rank, world = dist.get_rank(), dist.get_world_size()
    groups, notes = saved["rollout_groups"] if prompts is None else prompts.groups, []
    # A split mesh resumed with another trainer count (resolve checked its rollout side is the same): each
    # rollout rank is the rank it was and continues exactly; the trainer ranks hold no prompt stream.
    split = saved["config"].get("rollout.ranks", 0)
    if saved["world_size"] == world and saved["rollout_groups"] == groups or rank < split:
        own = torch.load(path / f"rank_{rank}.pt", weights_only=False)
        if prompts is not None:
            prompts.load_state_dict(own["prompts"])
        set_rng_state(own["rng"])
    if saved["world_size"] == world and saved["rollout_groups"] == groups:
        return common["loop"], notes
    if split:
        return common["loop"], notes + [
            f"resume: saved with {saved['world_size'] - split} trainer rank(s), running with {world - split}: models, "
            f"optimizers and the trainers' batch in flight are resharded; the {split} rollout rank(s) continue exactly; "
            f"the trainer ranks' RNG states are not carried over (reseeded from seed)"]
    notes.append(f"resume: saved on {saved['world_size']} ranks, running on {world}: models and optimizers "
                 f"are resharded; per-rank RNG states are not carried over (reseeded from seed)")
    if saved["rollout_groups"] == groups:  # same dealing of prompts: continue each group exactly
        first_rank = group * saved["world_size"] // groups
        prompts.load_state_dict(torch.load(path / f"rank_{first_rank}.pt", weights_only=False)["prompts"])
    else:
        p = torch.load(path / "rank_0.pt", weights_only=False)["prompts"]
        prompts.skip_to(p["epoch"], p["batches"])
        notes.append(f"resume: {saved['rollout_groups']} rollout groups before, {groups} now: the data "
                     f"continues at the same step of epoch {p['epoch']}, with its prompts dealt to other groups")
    return common["loop"], notes


# ---------------------------------------------------------------------------------------------- preemption

class StopSignal:
    """SIGTERM / SIGUSR1 set a flag; the loop asks, after each step, whether any rank got one.

    The handler only records the signal, so the step in flight (generation, collectives) finishes
    normally; then every rank agrees (one all-reduce), writes a checkpoint and exits together."""
    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.received = 0
        self.previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def _handle(self, signum, frame) -> None:
        self.received = signum

    def any_rank(self, device: str) -> bool:
        flag = torch.tensor([float(self.received)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() > 0

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
