"""The architecture matrix: every family trains 3 GRPO steps at TP=1 and TP=2 with the engine's logprobs within
1e-4 of the trainer's on every step, and its HF export scores like the trainer in transformers and in vLLM.
Real torchrun (2 CPU ranks), FSDP2 and vLLM engines; tiny random models from tests/archs.py. (Models rlcore
cannot train stop before anything loads: tests/test_launch.py.)
"""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import archs
from conftest import ROOT, WORKERS, train_warm

pytestmark = pytest.mark.slow  # real torchrun processes and vLLM engines: `make test-fast` leaves them out

sys.path.insert(0, str(WORKERS))
from hf_logprobs import SEQUENCES  # noqa: E402  (the fixed sequences every export check scores)

RECIPE = f"recipe={ROOT / 'tests' / 'archs.py'}"
BOUND = 1e-4  # fp32 on both sides: a correct sync leaves rounding only (~1e-6)
# The slower half as measured (50-105 s each on 2 busy cores; the MoE ones also check their export in
# vLLM); `-m "not slow"` leaves them out, `make test` runs all.
SLOW = {"mixtral", "qwen3_moe", "qwen3", "llama", "qwen2_tied"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("archs")
    return {arch: archs.build(arch, root / arch) for arch in archs.ARCHS}


def steps(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# Features a run of one family also covers (these used to be test_train.py's own runs of qwen2 and llama): a KL
# term to a frozen reference model, and activation checkpointing.
EXTRA = {("qwen2", 1): ("algorithm.kl_coef=0.05",), ("llama", 1): ("model.activation_checkpointing=true",)}


def run_steps(model_path, tp: int, run_dir, extra: tuple[str, ...] = ()) -> list[float]:
    """3 GRPO steps through the real entry point; returns rollout/logprob_diff_max per step."""
    proc = train_warm(RECIPE, f"model.path={model_path}", f"rollout.tensor_parallel={tp}", f"name={run_dir.name}",
                     f"output_dir={run_dir.parent}", *extra)
    assert proc.returncode == 0, proc.stderr[-4000:]
    metrics = steps(run_dir)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    # Every step applied an update that moved the policy (a sync of unchanged weights proves nothing).
    assert all(m["optim/steps_applied"] == 1 and m["policy/grad_norm"] > 0 for m in metrics)
    # Bandwidth and share of the step are the sync's own bytes and seconds.
    for m in metrics:
        assert m["sync/gb"] > 0
        assert m["throughput/sync_gb_s"] == pytest.approx(m["sync/gb"] / m["time/sync_s"], rel=1e-6)
        assert m["time/sync_share"] == pytest.approx(m["time/sync_s"] / m["time/step_s"], rel=1e-6)
        assert 0 < m["time/sync_share"] < 1
    # The reference is built only for a KL term; it starts equal to the policy, so KL(step 1) is ~0.
    kl = "algorithm.kl_coef=0.05" in extra
    assert (f"reference {model_path} (frozen)" in proc.stderr + proc.stdout) == kl
    if kl:
        assert abs(metrics[0]["policy/ref_kl"]) < 1e-6 and math.isfinite(metrics[1]["policy/ref_kl"])
    return [m["rollout/logprob_diff_max"] for m in metrics]


def transformers_scores(model_dir, state=None) -> torch.Tensor:
    """log p of hf_logprobs.SEQUENCES under transformers (its weights replaced by `state` when given)."""
    from transformers import AutoModelForCausalLM

    from rlcore.models import build as models

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if state is not None:
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}  # a tied head is the embedding
    with torch.no_grad():
        return torch.cat([models.token_logprobs(model, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long),
                                                1.0)[0] for s in SEQUENCES])


@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.slow) if a in SLOW else a for a in archs.ARCHS])
def test_arch_trains_with_exact_sync_and_exports(arch, models, tmp_path):
    """TP=2 from the random model, exporting at step 3; then TP=1 from that export. So the export is loaded by
    vLLM (`LLM(model=export)`, the TP=1 engine) and by transformers (the TP=1 trainer), and the TP=1 run's
    first step checks the two against each other on its samples; the export also scores fixed sequences
    exactly as the TP=2 trainer's final weights (read from its checkpoint) do."""
    diffs = {2: run_steps(models[arch], 2, tmp_path / "tp2")}
    export, ckpt = tmp_path / "tp2" / "hf" / "step_3", tmp_path / "tp2" / "checkpoints" / "step_3"
    from rlcore.outputs.export import read_model
    trained = transformers_scores(models[arch], read_model(ckpt))  # in-memory names: load_state_dict takes them
    exported = transformers_scores(export)  # checkpoint format: from_pretrained converts it
    assert (trained - exported).abs().max().item() < 1e-5
    if arch in archs.MOE_ARCHS:
        check_moe_export(models[arch], ckpt, export, tmp_path / "export.json")
    diffs[1] = run_steps(export, 1, tmp_path / "tp1", EXTRA.get((arch, 1), ()))
    print(f"{arch}: rollout/logprob_diff_max per step: tp=1 {diffs[1]}, tp=2 {diffs[2]}")
    assert all(d < BOUND for d in diffs[1] + diffs[2]), diffs


def check_moe_export(model_dir, ckpt, export, out):
    """An MoE export holds one tensor per expert (checkpoint format), loads in vLLM and transformers, and scores
    fixed sequences as the trainer does; launch/convert.py writes the same bytes from the checkpoint."""
    proc = subprocess.run([sys.executable, str(WORKERS / "export_check.py"), model_dir, ckpt, export, out],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    print(f"export: trainer vs transformers {r['hf_max_diff']:.3g}, vs vLLM {r['vllm_max_diff']:.3g}")
    assert r["hf_max_diff"] < 1e-5 and r["vllm_max_diff"] < BOUND
    assert r["convert_same_bytes"]
    assert not any("gate_up_proj" in n for n in r["names"]) and any(".experts.3." in n for n in r["names"])
