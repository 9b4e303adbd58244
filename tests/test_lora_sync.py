"""LoRA into the real vLLM engine on CPU (torchrun, 2 ranks, one engine of tensor parallel 2): adapter sync
and merged sync both serve exactly the trainer's policy, over three adapter versions each. One torchrun
process runs every scenario (tests/workers/lora_sync_worker.py), so the engine starts once (~1 min)."""
import json

from conftest import WORKERS, torchrun


def test_engine_serves_the_trained_adapters_in_both_sync_modes(tiny_models, tmp_path):
    out = tmp_path / "lora_sync.json"
    proc = torchrun(WORKERS / "lora_sync_worker.py", tiny_models["qwen2"], out)
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
