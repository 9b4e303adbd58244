"""LoRA checkpoints and exports (real runs: torchrun, 2 CPU ranks, real vLLM): a checkpoint holds the adapters
and their optimizer state only and resumes exactly; the export is a PEFT adapter folder (and, on request, the
merged full model) that scores fixed sequences as the trainer does; launch/convert.py rebuilds it."""
import json
import shutil
import sys

import pytest
import torch

from conftest import ROOT, WORKERS, train_warm
from test_checkpoint import SMALL, python, read_metrics

sys.path.insert(0, str(WORKERS))
from hf_logprobs import SEQUENCES  # noqa: E402  (the fixed sequences every export check scores)

pytestmark = pytest.mark.slow  # real torchrun processes and vLLM engines: `make test-fast` leaves them out

# A KL term: its reference logprobs come from the policy with its adapters off (no reference model).
RUN = ("recipe=demo_lora", "train.save_every=2", "lora.export_merged=true", "algorithm.kl_coef=0.05", *SMALL)


def test_adapter_checkpoint_resumes_exactly_and_exports_score_like_the_trainer(tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    from rlcore.config import ModelConfig
    from rlcore.models import lora, build as models
    from rlcore.outputs import export
    from rlcore.tasks import tiny

    straight, halves = tmp_path / "straight", tmp_path / "halves"
    proc = train_warm(*RUN, "train.steps=4", f"output_dir={straight}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    run, resumed = straight / "demo_lora", halves / "demo_lora"
    # The same run stopped after its step-2 checkpoint (its later checkpoint and exports gone; the logger drops
    # the later metric lines itself), then resumed: one run fewer than running the first half again.
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_4")
    shutil.rmtree(resumed / "hf")
    proc = train_warm(*RUN, "train.steps=4", "resume=auto", f"output_dir={halves}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resume: continuing after step 2" in proc.stdout + proc.stderr

    # The checkpoint holds adapters and their AdamW moments only: no base weight.
    ckpt = run / "checkpoints" / "step_4"
    keys = list(FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata)
    model_keys = [k for k in keys if k.startswith("policy.model.")]
    optim_keys = [k for k in keys if k.startswith("policy.optim.state.")]
    assert model_keys and all(".lora_" in k for k in model_keys)
    assert optim_keys and all(".lora_" in k for k in optim_keys)

    # Resume is exact: the same metrics at every step and the same adapter bytes at the end.
    assert read_metrics(resumed) == read_metrics(run)
    assert all(r["rollout/logprob_diff_max"] < 1e-3 for r in read_metrics(run))
    assert read_metrics(run)[0]["policy/ref_kl"] == 0.0 < read_metrics(run)[-1]["policy/ref_kl"]  # B = 0, then not
    assert "reference the actor with adapters off (no copy)" in proc.stdout + proc.stderr
    adapter = "hf/step_4/adapter_model.safetensors"
    assert (resumed / adapter).read_bytes() == (run / adapter).read_bytes()

    # The trainer's policy at step 4 (the base + the checkpoint's adapters), the PEFT folder through rlcore's
    # loader, and the merged folder through transformers all score fixed sequences alike.
    def base():
        return models.load_causal_lm(ModelConfig(path=str(tiny.model_dir())), trainable=False)

    trainer = lora.apply(base(), lora.LoraConfig(enabled=True, rank=16, alpha=32.0))
    missing = trainer.load_state_dict(export.read_model(ckpt), strict=False).missing_keys
    assert all(".lora_" not in k for k in missing)
    from transformers import AutoModelForCausalLM
    merged = AutoModelForCausalLM.from_pretrained(run / "hf" / "step_4_merged")
    peft = lora.load_peft(base(), run / "hf" / "step_4")
    ids = torch.randint(3, 20, (3, 14), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = models.token_logprobs(trainer, ids, None, 1.0)
        with lora.adapters_off(trainer):
            assert (models.token_logprobs(trainer, ids, None, 1.0) - want).abs().max() > 1e-4  # 4 steps moved it
        for model in (peft, merged):
            assert (models.token_logprobs(model, ids, None, 1.0) - want).abs().max() < 1e-5
    # vLLM serves the exported PEFT folder on the base model as the trainer scores (its engine's own loader).
    out = tmp_path / "vllm_lora.json"
    proc = python(WORKERS / "hf_logprobs.py", "vllm_lora", tiny.model_dir(), run / "hf" / "step_4", out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    served = json.loads(out.read_text())["logprobs"]
    with torch.no_grad():
        for seq, got in zip(SEQUENCES, served):
            mine = models.token_logprobs(trainer, torch.tensor([seq]), None, 1.0)[0]
            assert (mine - torch.tensor(got)).abs().max() < 1e-4
    config = json.loads((run / "hf" / "step_4" / "adapter_config.json").read_text())
    assert config["r"] == 16 and config["peft_type"] == "LORA"

    # The checkpoint converts to the same PEFT folder, byte for byte.
    proc = python(ROOT / "launch" / "convert.py", ckpt, tmp_path / "converted")
    assert proc.returncode == 0, proc.stderr[-4000:]
    for f in (run / "hf" / "step_4").iterdir():
        assert (tmp_path / "converted" / f.name).read_bytes() == f.read_bytes(), f.name
