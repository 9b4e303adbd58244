"""torchrun worker: what each rollout.seeds setting guarantees, on one real vLLM engine (tests/test_seeds.py).

    torchrun --nproc-per-node 1 tests/workers/seeds_worker.py MODEL_DIR OUT_JSON

Prompt A is sampled 8 times (n=8) alone and beside prompt B, under seeds=request (each request its own seed) and
seeds=engine (no request seeds; the engine's generator reseeded per call); the caller's RNG state is compared
before and after. The engine's mode is the attribute the config sets, switched between calls.
"""
import json
import sys

import torch

from rlcore.config import Config, DataConfig, ModelConfig, RolloutConfig
from rlcore.distributed.parallel import init_distributed
from rlcore.engine import RolloutEngine

model_dir, out = sys.argv[1], sys.argv[2]
init_distributed()
cfg = Config(model=ModelConfig(path=model_dir), data=DataConfig(max_prompt_tokens=8),
             rollout=RolloutConfig(cpu_kv_cache_gb=0.25, max_new_tokens=12, temperature=1.0))
engine = RolloutEngine(cfg, max_model_len=24)
A, B = [5, 6, 7], [9, 4]


def tokens(prompts, seeds):
    return [s.token_ids for s in engine.generate(prompts, 8, 12, 1.0, seeds)[0]]


result = {}
for mode in ("request", "engine"):
    engine.engine_seeds = mode == "engine"
    state = torch.get_rng_state()
    alone, again = tokens([A], [100]), tokens([A], [100])
    beside = tokens([A, B], [100, 200])
    other = tokens([A], [300])
    result[mode] = {"rerun_same": alone == again, "beside_same": alone == beside, "other_seed_same": alone == other,
                    "rng_untouched": torch.equal(state, torch.get_rng_state()),
                    "distinct_samples": len({tuple(t) for t in alone})}
json.dump(result, open(out, "w"))
print(result, flush=True)
