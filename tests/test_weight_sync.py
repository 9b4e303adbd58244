"""The in-place weight sync is exact, streamed one FSDP2 unit at a time (the next unit's all-gather overlapped
with the engine's load), for TP=1 and TP=2 engines.

Qwen3-MoE is the model: transformers keeps its experts fused in memory ([E, 2I, H] gate_up_proj) and writes
one tensor per expert in its checkpoints, so the sync must convert (rlcore/models/weights.py). OLMo 2 is served
by vLLM's Transformers backend, which changes transformers' classes in place: building the trainer's model
before the engine (the order rlcore.trainer does not use) must work too."""
import json
from pathlib import Path

import pytest

import archs
from conftest import WORKERS, torchrun, torchrun_warm

pytestmark = pytest.mark.slow  # real torchrun processes and vLLM engines: `make test-fast` leaves them out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("sync_models")
    return {arch: archs.build(arch, root / arch) for arch in ("qwen3_moe", "olmo2")}


@pytest.mark.parametrize("arch, tp, order", [("qwen3_moe", 1, ""), ("qwen3_moe", 2, ""),
                                             ("olmo2", 1, "policy-first")])
def test_sync_is_exact_after_an_optimizer_step(models, tmp_path, arch, tp, order):
    out = tmp_path / "sync.json"
    if tp == 2:
        # A segment as a killed TP=2 run leaves it: the engine must clear it, not fail on it.
        Path("/dev/shm/-tp:0-[0-1]-cpushm_0").touch()
    # policy-first builds OLMo 2 before any engine: in a process where a vLLM engine already served OLMo 2, vLLM has
    # wrapped transformers' Olmo2Model in its compile decorator, so that case needs a process of its own
    launch = torchrun if order == "policy-first" else torchrun_warm
    proc = launch(WORKERS / "sync_worker.py", models[arch], tp, out, *([order] if order else []))
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    # The optimizer step moved every weight, so a stale engine is visibly wrong and the check below can fail.
    assert r["unchanged_parameters"] == []
    assert r["stale_max_diff"] > 0.05
    # Overlapping the next unit's all-gather with the engine's load changes no byte of what is streamed.
    assert r["overlap_stream_mismatch"] == []
    # Asleep at level 2 the engine refuses, naming who asked; around the check every logprob is NaN (poisoned).
    assert r["asleep_refused"].startswith("rlcore: engine prompt_logprobs called by __main__.<module> (line ")
    assert r["asleep_refused"].endswith("asleep at level 2 (weights discarded, KV cache freed); "
                                        "a sync_weights (or wake) must come first")
    assert r["asleep_finite"] == 0 and r["state_after_sync"] == "ready"
    # fp32 on both sides: the synced engine (overlapped sync) scores fixed sequences as the trainer does.
    assert r["synced_max_diff"] < 1e-4
    # Every parameter streamed once; the most held at once is one FSDP2 unit, never the model.
    assert r["bytes"] == r["model_bytes"]
    assert r["peak_bucket_bytes"] == max(r["layer_bytes"], r["root_bytes"])
    assert r["peak_bucket_bytes"] < r["model_bytes"] / 2
