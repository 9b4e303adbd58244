"""What each numeric and named-choice field of the config may hold (VALID), and the check of a table of them.
It imports nothing of rlcore, so the config's sections can check themselves (SandboxConfig outside a run)."""
from __future__ import annotations

import math


def _at_least(low):
    return lambda v: v >= low, f">= {low}"


def _above(low):
    return lambda v: v > low, f"> {low}"


def _between(low, high, closed_high=True):
    ok = (lambda v: low <= v <= high) if closed_high else (lambda v: low <= v < high)
    return ok, f"in [{low}, {high}{']' if closed_high else ')'}"


def _whole(low):
    return lambda v: isinstance(v, int) and v >= low, f"a whole number >= {low}"


def _one_of(*names):
    return lambda v: v in names, "one of " + ", ".join(names)


_SECONDS = (lambda v: 0 < v < math.inf, "a finite number of seconds > 0")  # inf would disarm the deadlines
SANDBOX_LIMITS = {"timeout_s": _SECONDS, "cpu_s": _SECONDS, "memory_mb": _whole(1), "file_mb": _whole(1),
            "tmp_mb": _whole(1), "max_processes": _whole(1), "max_output_bytes": _whole(1), "workers": _whole(1)}
# Every numeric and named-choice field with what is valid. NaN fails every test (comparisons with NaN
# are false), so `optim.lr=nan` is caught like `optim.lr=-1`. The algorithm checks its own fields.
_OPTIM = {"lr": _at_least(0), "weight_decay": _at_least(0), "eps": _above(0), "warmup_steps": _at_least(0),
          "schedule": _one_of("constant", "linear", "cosine"), "min_lr_ratio": _between(0, 1),
          "max_grad_norm": _at_least(0)}
VALID = {
    "seed": _at_least(0),
    "model.dtype": _one_of("float32", "bfloat16"),
    "model.mixed_precision": _one_of("none", "bfloat16", "float32"),
    "model.attn_implementation": _one_of("sdpa", "eager", "flash_attention_2"),
    "data.max_prompt_tokens": _at_least(1), "data.eval_size": _at_least(0), "data.num_workers": _at_least(0),
    "rollout.tensor_parallel": _at_least(1), "rollout.group_size": _at_least(1),
    "rollout.prompts_per_step": _at_least(1), "rollout.max_new_tokens": _at_least(1),
    "rollout.temperature": (lambda v: 0 < v <= 2, "in (0, 2] (vLLM refuses more)"), "rollout.max_model_len": _at_least(0),
    "rollout.gpu_memory_utilization": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "rollout.cpu_kv_cache_gb": _above(0), "rollout.logprob_diff_threshold": _at_least(0),
    "rollout.logprob_diff_mean_threshold": _at_least(0),
    "rollout.eval_max_new_tokens": _at_least(0), "rollout.max_turns": _at_least(0),
    "rollout.max_total_tokens": _at_least(0), "rollout.env_timeout_s": _above(0),
    "rollout.env_workers": _at_least(1), "rollout.env_weight": (math.isfinite, "a finite number"),
    "rollout.max_tool_calls": _whole(1), "rollout.turn_deadline_s": _SECONDS,
    "rollout.truncated_reward": (lambda v: v is None or math.isfinite(v), "a finite number or none"),
    "rollout.schedule": _one_of("lockstep", "continuous"), "rollout.seeds": _one_of("request", "engine"),
    "rollout.max_failed_frac": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "rollout.agent_tool_format": _one_of("hermes", "llama3", "mistral"), "rollout.trajectory_timeout_s": _at_least(0),
    "rollout.step_deadline_s": _at_least(0), "rollout.ranks": _at_least(0), "rollout.max_staleness": _at_least(0),
    "rollout.max_running": _at_least(0), "rollout.max_waiting": _at_least(0), "rollout.join_steps": _at_least(0),
    "rollout.load_lag_steps": (lambda v: v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 0),
                               "a whole number of engine steps >= 0, or auto"),
    "rollout.load_lag_margin": (lambda v: 1 <= v < math.inf, "a finite number >= 1 (auto's lag over the trainers' "
                                "measured step)"),
    "rollout.load_lag_margin_blocked": (lambda v: 1 <= v < math.inf, "a finite number >= 1 (auto's lag over the "
                                        "trainers' measured step once something waits for the version)"),
    **{f"{section}.{k}": test for section in ("optim", "critic.optim") for k, test in _OPTIM.items()},
    "train.steps": _at_least(1), "train.epochs_per_step": _at_least(1), "train.mini_batches": _at_least(1),
    "train.micro_batch_size": _at_least(1), "train.eval_every": _at_least(1), "train.log_every": _at_least(1),
    "train.save_every": _at_least(0), "train.keep_checkpoints": _at_least(1), "train.export_every": _at_least(0),
    "train.max_skipped_steps": _at_least(1), "train.logprob_chunk_tokens": _at_least(0),
    "train.max_tokens_per_micro_batch": _at_least(0), "train.watchdog_s": _SECONDS,
    # vLLM 0.32 takes max_lora_rank in {1, 8, ..., 320, 512} and serves any adapter rank up to it.
    "lora.rank": (lambda v: isinstance(v, int) and 1 <= v <= 512, "an integer in [1, 512] (vLLM's largest "
                  "max_lora_rank is 512)"),
    "lora.alpha": _above(0), "lora.lr_scale": _above(0), "lora.sync": _one_of("adapter", "merged"),
    **{f"sandbox.{k}": test for k, test in SANDBOX_LIMITS.items()},
}


def check_fields(obj, table: dict, prefix: str = "") -> None:
    """Raise a ValueError naming the first field of `table` (dotted keys under `obj`) that is not valid."""
    for key, (ok, valid) in table.items():
        value = obj
        for part in key.split("."):
            value = getattr(value, part)
        try:
            good = bool(ok(value))
        except TypeError:
            good = False
        if not good or isinstance(value, bool) and not valid.startswith("one of"):
            raise ValueError(f"{prefix}{key} must be {valid} (got {value!r})")
