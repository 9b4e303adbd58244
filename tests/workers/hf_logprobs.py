"""Logprobs of fixed sequences from a checkpoint and from its HF export (tests/test_checkpoint.py).

    python tests/workers/hf_logprobs.py trainer MODEL_DIR CHECKPOINT_DIR OUT_JSON   # FSDP policy, 1 rank
    python tests/workers/hf_logprobs.py hf HF_DIR OUT_JSON                          # transformers
    python tests/workers/hf_logprobs.py vllm HF_DIR OUT_JSON                        # vllm.LLM(model=HF_DIR)
    python tests/workers/hf_logprobs.py vllm_lora BASE_DIR ADAPTER_DIR OUT_JSON     # the base + a PEFT folder

Each writes {"logprobs": [[log p(seq[t] | seq[:t]) for t >= 1] per sequence]} at temperature 1.
"""
import json
import os
import sys

import torch

SEQUENCES = [[1, 7, 4, 13, 6, 11, 17, 8, 2], [1, 5, 5, 13, 9, 9, 17, 14, 12, 2], [1, 12, 3, 15, 4, 19, 18, 7]]


def trainer(model_dir: str, ckpt: str) -> list[list[float]]:
    from rlcore.config import ModelConfig, OptimConfig
    from rlcore.distributed.parallel import ParallelDims, build_meshes, init_distributed
    from rlcore.models import build as models
    from rlcore.outputs import checkpoint

    init_distributed()
    cfg = ModelConfig(path=model_dir)
    policy = models.shard(models.load_causal_lm(cfg), build_meshes(ParallelDims(1, 1))[0], cfg)
    optimizer, scheduler = models.build_optimizer(policy, OptimConfig(), total_steps=1)

    class NoPrompts:  # this check needs the weights only
        groups = 0

        def skip_to(self, epoch, batches):
            pass
    checkpoint.load(__import__("pathlib").Path(ckpt), {"policy": (policy, optimizer, scheduler)}, NoPrompts(), 0)
    return [models.token_logprobs(policy, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long), 1.0)[0]
            .tolist() for s in SEQUENCES]


def hf(hf_dir: str) -> list[list[float]]:
    from transformers import AutoModelForCausalLM

    from rlcore.models import build as models
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
        return [models.token_logprobs(model, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long), 1.0)[0]
                .tolist() for s in SEQUENCES]


def vllm(hf_dir: str, adapter_dir: str | None = None) -> list[list[float]]:
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    lora = dict(enable_lora=True, max_lora_rank=16) if adapter_dir else {}
    llm = LLM(model=hf_dir, dtype="float32", enforce_eager=True, max_model_len=32, kv_cache_memory_bytes=2**26,
              **lora)
    outs = llm.generate([{"prompt_token_ids": s} for s in SEQUENCES],
                        SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0), use_tqdm=False,
                        lora_request=LoRARequest("export", 1, adapter_dir) if adapter_dir else None)
    return [[pos[t].logprob for pos, t in zip(o.prompt_logprobs[1:], s[1:])] for o, s in zip(outs, SEQUENCES)]


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    mode, *args, out = sys.argv[1:]
    logprobs = {"trainer": trainer, "hf": hf, "vllm": vllm, "vllm_lora": vllm}[mode](*args)
    json.dump({"logprobs": logprobs}, open(out, "w"))
