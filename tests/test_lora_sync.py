"""LoRA into the real vLLM engine on CPU (torchrun, 2 ranks, one engine of tensor parallel 2): adapter sync
and merged sync both serve exactly the trainer's policy, over three adapter versions each. One torchrun
process runs every scenario (tests/workers/lora_sync_worker.py), so the engine starts once (~1 min)."""
import json

import pytest

from conftest import WORKERS, torchrun_warm, train_warm

pytestmark = pytest.mark.slow  # real torchrun processes and vLLM engines: `make test-fast` leaves them out


def test_engine_serves_the_trained_adapters_in_both_sync_modes(tiny_models, tmp_path):
    out = tmp_path / "lora_sync.json"
    proc = torchrun_warm(WORKERS / "lora_sync_worker.py", tiny_models["qwen2"], out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    assert r["base_vs_trainer_at_init"] < 1e-4  # B = 0: the engine's base is the policy before any update
    for mode in ("adapter", "merged"):
        assert len(r[mode]) == 3
        for row in r[mode]:
            # The update moved the policy measurably, so a stale engine would fail the check below...
            assert row["stale_max_diff"] > 0.05 and row["engine_vs_base"] > 0.05
            # ...and the synced engine scores fixed sequences, and samples, as the trainer does.
            assert row["synced_max_diff"] < 1e-4 and row["sampled_max_diff"] < 1e-4
            # The reference (the policy with adapters off) is still the base model the engine started with.
            assert row["adapters_off_vs_base"] < 1e-4
    # Adapter sync moves the adapters only; merged sync the full model.
    assert all(row["bytes"] == r["adapter_bytes"] for row in r["adapter"])
    assert all(row["bytes"] == r["model_bytes"] for row in r["merged"])


def test_demo_lora_learns_with_the_drift_alarm_tight(tmp_path):
    """recipes/demo_lora.py as a user runs it, for 20 of its 60 steps: held-out accuracy from >= 10% up by >= 30
    points (measured 17.2% -> 76.2% at step 20, 82.4% at 60, in both sync modes), the per-step engine-vs-trainer
    check tight after every adapter sync, and each sync moving the adapters only."""
    proc = train_warm("recipe=demo_lora", f"output_dir={tmp_path}", "train.steps=20", "train.eval_every=20")
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "demo_lora" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/logprob_diff_max" in r]
    assert len(steps) == 20 and max(r["rollout/logprob_diff_max"] for r in steps) < 1e-4  # measured 1.7e-5
    assert all(r["sync/gb"] < 0.001 for r in steps)  # 16 x 2 x 7 linears x 2 layers of fp32 A, B: 0.26 MB
    start, end = rows[0]["eval/accuracy"], rows[-1]["eval/accuracy"]
    assert start >= 0.10 and end - start >= 0.30, (start, end)
