"""Score a streaming run's batch under each weight version its tokens came from (tests/test_stream.py).

    python tests/workers/stream_versions.py MODEL_DIR RUN_DIR BATCH_PT OUT_JSON

One vLLM engine (model.path's weights, version 0) scores every sequence of the batch (prompt logprobs at
temperature 1); then for each version v >= 1 in the batch it reloads the run's export hf/step_v in place (as the
trainer's transfer does) and scores them again. Writes {"v": [[log p(token t) at position t - 1] per sequence]}.

Then, with that engine's prefix cache (on, as in a streaming run), `prefix` in the same file: a prefix cached
under one version, rlcore's in-place load (RolloutEngine.load) of another under a request in flight, and a new
request with that prefix, against the same request computed afresh (and a bare reload without the reset, which
must serve the stale prefix: the check can fail).
"""
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file
from vllm import LLM, SamplingParams
from vllm.sampling_params import RequestOutputKind

from rlcore.engine.lifecycle import Lifecycle
from rlcore.engine.device import redo_cpu_weight_processing
from rlcore.engine.rollout_engine import RolloutEngine


def main(model_dir: str, run_dir: str, batch_pt: str, out: str) -> None:
    batch = torch.load(batch_pt)
    seqs = [ids[mask.bool()].tolist() for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]
    versions = sorted(set(batch["token_versions"][batch["loss_mask"].bool()].tolist()))
    # Prefix caching on, in blocks of 32 tokens (the tiny model's context is 64) for the prefix check.
    llm = LLM(model=model_dir, dtype="float32", enforce_eager=True, enable_prefix_caching=True, block_size=32, seed=0,
              kv_cache_memory_bytes=2**28, enable_chunked_prefill=False, max_num_batched_tokens=4096)
    scores = {}
    for v in versions:
        if v > 0:
            reload(llm, load_file(str(Path(run_dir) / "hf" / f"step_{v}" / "model.safetensors")))
        outs = llm.generate([{"prompt_token_ids": s} for s in seqs],  # prompt logprobs read no cached prefix
                            SamplingParams(temperature=1.0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)
        scores[v] = [[pos[t].logprob for pos, t in zip(o.prompt_logprobs[1:], s[1:])] for o, s in zip(outs, seqs)]
    # The engine holds the last version; the next is it with seeded noise (one training step moves this confident
    # model's sampled logprobs by ~1e-6 only: too little to tell the versions apart).
    old = load_file(str(Path(run_dir) / "hf" / f"step_{versions[-1]}" / "model.safetensors"))
    noise = torch.Generator().manual_seed(0)
    new = {name: t + 0.05 * torch.randn(t.shape, generator=noise) for name, t in old.items()}
    scores["prefix"] = prefix_check(llm, [t for s in seqs for t in s][:40], old, new)
    Path(out).write_text(json.dumps(scores))


def reload(llm, weights: dict) -> None:
    """The weights into the engine in place, as the trainer's transfer does, without touching its prefix cache."""
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights.items()),
                                                 "is_checkpoint_format": True})
    llm.apply_model(redo_cpu_weight_processing)


def prefix_check(llm, prefix: list[int], old: dict, new: dict) -> dict:
    """The engine holds `old`. Returns the sampled logprobs of one request (the prefix + 1 token, 4 new tokens,
    seeded) computed afresh under old ("old") and under new ("fresh"); after `old` cached the prefix and rlcore's
    load of `new` under a request in flight ("after_load"); again with new's own prefix cached ("hit", with its
    cached tokens); and after a bare reload of `old` that keeps new's cached prefix ("stale")."""
    done, cached = {}, {}

    def submit(rid: str, last: int, max_tokens: int, seed: int) -> None:
        params = SamplingParams(temperature=1.0, max_tokens=max_tokens, logprobs=0, seed=seed, ignore_eos=True)
        params.output_kind = RequestOutputKind.FINAL_ONLY
        llm.llm_engine.add_request(rid, {"prompt_token_ids": prefix + [last]}, params)

    def run(rid: str, last: int) -> list[float]:
        submit(rid, last, 4, seed=7)
        return until(rid)

    def until(rid: str) -> list[float]:
        while rid not in done:
            for out in llm.llm_engine.step():
                if out.finished:
                    c, cached[out.request_id] = out.outputs[0], out.num_cached_tokens or 0
                    done[out.request_id] = [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]
        return done[rid]

    llm.reset_prefix_cache()
    got = {"old": run("old", 11)}  # caches the prefix's whole blocks under old
    submit("flying", 12, 20, seed=8)
    for _ in range(3):
        llm.llm_engine.step()
    # rlcore's load, as a streaming engine loads a version: "flying" is running
    RolloutEngine.load(SimpleNamespace(llm=llm, sleep_mode=False, cuda=False, state=Lifecycle()), iter(new.items()))
    got["after_load"] = run("after_load", 11)
    until("flying")
    llm.reset_prefix_cache()
    got["fresh"] = run("fresh", 11)
    got["hit"] = run("hit", 11)
    reload(llm, old)  # no reset: the prefix cached under new stays
    got["stale"] = run("stale", 11)
    return got | {"cached": cached}


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
    main(*sys.argv[1:5])
