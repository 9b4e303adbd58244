"""Score a streaming run's batch under each weight version its tokens came from (tests/test_stream.py).

    python tests/workers/stream_versions.py MODEL_DIR RUN_DIR BATCH_PT OUT_JSON

One vLLM engine (model.path's weights, version 0) scores every sequence of the batch (prompt logprobs at
temperature 1); then for each version v >= 1 in the batch it reloads the run's export hf/step_v in place (as the
trainer's transfer does) and scores them again. Writes {"v": [[log p(token t) at position t - 1] per sequence]}.
"""
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from vllm import LLM, SamplingParams

from rlcore.rollout.engine import redo_cpu_weight_processing


def main(model_dir: str, run_dir: str, batch_pt: str, out: str) -> None:
    batch = torch.load(batch_pt)
    seqs = [ids[mask.bool()].tolist() for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]
    versions = sorted(set(batch["token_versions"][batch["loss_mask"].bool()].tolist()))
    llm = LLM(model=model_dir, dtype="float32", enforce_eager=True, enable_prefix_caching=False, seed=0,
              kv_cache_memory_bytes=2**28, enable_chunked_prefill=False, max_num_batched_tokens=4096)
    scores = {}
    for v in versions:
        if v > 0:
            weights = load_file(str(Path(run_dir) / "hf" / f"step_{v}" / "model.safetensors"))
            llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights.items()),
                                                         "is_checkpoint_format": True})
            llm.apply_model(redo_cpu_weight_processing)
        outs = llm.generate([{"prompt_token_ids": s} for s in seqs],
                            SamplingParams(temperature=1.0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)
        scores[v] = [[pos[t].logprob for pos, t in zip(o.prompt_logprobs[1:], s[1:])] for o, s in zip(outs, seqs)]
    Path(out).write_text(json.dumps(scores))


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
    main(*sys.argv[1:5])
