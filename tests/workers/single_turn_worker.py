"""torchrun worker: with no environment, the turn loop gives bit for bit the batches of the single-turn
rollout it replaced (tests/test_multiturn.py).

    torchrun --nproc-per-node 2 tests/workers/single_turn_worker.py OUT_JSON recipe=demo [overrides]

Sets up a real run (engines, FSDP2 policy), then for two steps samples through rlcore.rollout.collect.sample
and through REFERENCE below (the rollout stage as it was before multi-turn, verbatim but for names) on the
same prompt rows and seeds, and compares every tensor with torch.equal; likewise the greedy eval.
"""
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from vllm import SamplingParams

from rlcore import rewards, trainer
from rlcore.batch import Batch
from rlcore.config.cli import parse_argv
from rlcore.rollout import collect

ROOT = Path(__file__).resolve().parents[2]


def reference_sample(run, step, draw=0):
    cfg, G = run.cfg, run.cfg.rollout.group_size
    rows = run.rollout.prompts.next_batch()
    first = draw * cfg.rollout.prompts_per_step + run.rollout.group * len(rows)
    seeds = [collect.rollout_seed(cfg.seed, step, first + i, G) for i in range(len(rows))]
    samples = run.engine.generate([r["prompt_ids"] for r in rows], G, cfg.rollout.max_new_tokens,
                                  cfg.rollout.temperature, seeds)
    share = len(rows) // run.dims.tp
    mine = slice(run.rollout.tp_rank * share, (run.rollout.tp_rank + 1) * share)
    rows, samples = rows[mine], samples[mine]
    pairs = [(r["prompt_ids"], s) for r, per_prompt in zip(rows, samples) for s in per_prompt]
    L = max(len(p) + len(s.token_ids) for p, s in pairs)
    input_ids = torch.full((len(pairs), L), collect.pad_id(run.tokenizer), dtype=torch.long)
    attention_mask = torch.zeros(len(pairs), L, dtype=torch.long)
    loss_mask = torch.zeros(len(pairs), L - 1)
    rollout_logprobs = torch.zeros(len(pairs), L - 1)
    for i, (p, s) in enumerate(pairs):
        n, m = len(p), len(s.token_ids)
        input_ids[i, :n + m] = torch.tensor(p + s.token_ids)
        attention_mask[i, :n + m] = 1
        loss_mask[i, n - 1:n + m - 1] = 1
        rollout_logprobs[i, n - 1:n + m - 1] = torch.tensor(s.logprobs)
    completions = [run.tokenizer.decode(s.token_ids, skip_special_tokens=True) for _, s in pairs]
    batch = Batch(input_ids, attention_mask, loss_mask, rollout_logprobs, torch.zeros(len(pairs)), G,
                  cfg.rollout.max_new_tokens)
    batch.rewards, _ = rewards.score_rollouts(run, [r for r in rows for _ in range(G)], completions)
    return batch


def reference_eval(run):
    rows = run.rollout.eval_rows[run.rollout.group::run.dims.rollout_groups]
    max_tokens = run.cfg.rollout.eval_max_new_tokens or run.cfg.rollout.max_new_tokens
    outs = run.engine.llm.generate([{"prompt_token_ids": r["prompt_ids"]} for r in rows],
                                   SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    outs = [list(o.outputs[0].token_ids) for o in outs]
    mine = [(r, o) for i, (r, o) in enumerate(zip(rows, outs)) if i % run.dims.tp == run.rollout.tp_rank]
    completions = [run.tokenizer.decode(o, skip_special_tokens=True) for _, o in mine]
    prompts, columns = rewards.reward_inputs([r for r, _ in mine], run.cfg.data.prompt_column)
    total, _ = rewards.score([(run.rollout.reward_fns[0][0], 1.0)], prompts, completions, columns)
    return (total >= 1.0).sum().item(), len(mine)


out_path, argv = sys.argv[1], sys.argv[2:]
run = trainer.setup(parse_argv(argv, ROOT / "recipes"))
stream, recorded = run.rollout.prompts.next_batch, []
checks = {}
for step in (1, 2):
    run.rollout.prompts.next_batch = lambda: recorded.append(stream()) or recorded[-1]
    new, _, _ = collect.sample(run, step)
    run.engine.llm.reset_prefix_cache()  # the reference computes every prompt afresh, as the first call did
    run.rollout.prompts.next_batch = lambda: recorded[-1]
    old = reference_sample(run, step)
    for f in ("input_ids", "attention_mask", "loss_mask", "rollout_logprobs", "rewards"):
        checks[f"step{step}/{f}"] = torch.equal(getattr(new, f), getattr(old, f))
    checks[f"step{step}/budget"] = new.max_model_tokens == old.max_model_tokens
new_eval = None
if run.rollout.eval_rows:
    new_eval = collect.evaluate(run)["eval/accuracy"]
    totals = torch.tensor(reference_eval(run), dtype=torch.float64)
    dist.all_reduce(totals)
    checks["eval"] = new_eval == totals[0].item() / totals[1].item()
gathered = [None] * dist.get_world_size()
dist.all_gather_object(gathered, checks)
if dist.get_rank() == 0:
    json.dump({"ranks": gathered, "eval_accuracy": new_eval, "rows": len(recorded[0])}, open(out_path, "w"))
run.logger.close()
