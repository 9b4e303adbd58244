"""LoRA on one process (rlcore/models/lora.py): the maths, the names, the optimizer, the PEFT folder and the fold."""
import re

import pytest
import torch

from rlcore.config import LoraConfig, ModelConfig, OptimConfig
from rlcore.models import lora, build as models


def _model(path, cfg=None):
    model = models.load_causal_lm(ModelConfig(path=str(path)))
    return lora.apply(model, cfg or LoraConfig(enabled=True, rank=4, alpha=8.0))


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def _nonzero_b(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, m in lora.lora_modules(model):
            m.lora_B.weight.copy_(torch.randn(m.lora_B.weight.shape, generator=g) * 0.05)


IDS = torch.randint(3, 20, (2, 10), generator=torch.Generator().manual_seed(0))


def test_layer_is_base_plus_scaled_low_rank_update():
    base = torch.nn.Linear(6, 5)
    layer = lora.LoRALinear(base, rank=2, alpha=3.0)
    torch.nn.init.normal_(layer.lora_B.weight)
    x = torch.randn(4, 6)
    expected = x @ base.weight.T + base.bias + 1.5 * (x @ layer.lora_A.weight.T) @ layer.lora_B.weight.T
    torch.testing.assert_close(layer(x), expected)
    assert layer.weight is base.weight and not layer.weight.requires_grad


def test_zero_init_is_exactly_the_base_and_names_are_kept(tiny_models):
    base = models.load_causal_lm(ModelConfig(path=str(tiny_models["qwen2"])))
    model = _model(tiny_models["qwen2"])
    assert torch.equal(_logits(model, IDS), _logits(base, IDS))  # B = 0: bitwise the base model
    base_names, names = set(dict(base.named_parameters())), set(dict(model.named_parameters()))
    assert base_names <= names  # every base name unchanged (units, checkpoint format, export)
    added = names - base_names
    assert added and all(n.endswith((".lora_A.weight", ".lora_B.weight")) and ".layers." in n for n in added)
    assert not any("embed" in n or "lm_head" in n for n in added)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == added
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if n in added)


def test_adapters_off_is_the_base_model(tiny_models):
    base = models.load_causal_lm(ModelConfig(path=str(tiny_models["qwen2"])))
    model = _model(tiny_models["qwen2"])
    _nonzero_b(model)
    on = _logits(model, IDS)
    assert (on - _logits(base, IDS)).abs().max() > 1e-3
    with lora.adapters_off(model):
        assert torch.equal(_logits(model, IDS), _logits(base, IDS))
    assert torch.equal(_logits(model, IDS), on)  # back on after the block


def test_optimizer_holds_adapter_state_only(tiny_models):
    model = _model(tiny_models["qwen2"])
    opt, _ = models.build_optimizer(model, OptimConfig(lr=1e-3), total_steps=1)
    _nonzero_b(model)
    logits = model(input_ids=IDS).logits
    logits.float().logsumexp(-1).mean().backward()
    assert all(p.grad is None for n, p in model.named_parameters() if ".lora_" not in n)
    opt.step()
    adapter_numel = sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n)
    state_bytes = sum(t.numel() * t.element_size() for s in opt.state.values()
                      for k, t in s.items() if k in ("exp_avg", "exp_avg_sq"))
    assert state_bytes == 8 * adapter_numel  # two fp32 moments per adapter parameter, none for the base
    total = sum(p.numel() for p in model.parameters())
    assert adapter_numel < total / 5


def test_peft_folder_round_trip_and_fold(tiny_models, tmp_path):
    cfg = LoraConfig(enabled=True, rank=4, alpha=8.0, targets=["q_proj", "v_proj", "down_proj"])
    model = _model(tiny_models["qwen2"], cfg)
    _nonzero_b(model)
    tensors = lora.adapter_tensors(model)
    lora.write_peft(tmp_path / "adapter", tensors, lora.peft_config(cfg, "base", cfg.targets))
    config, read = lora.read_peft(tmp_path / "adapter")
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["target_modules"] == sorted(cfg.targets)
    assert all(torch.equal(read[n], t) for n, t in tensors.items())
    loaded = lora.load_peft(models.load_causal_lm(ModelConfig(path=str(tiny_models["qwen2"]))), tmp_path / "adapter")
    assert torch.equal(_logits(loaded, IDS), _logits(model, IDS))
    # The merged weights (W + s B A, out of place) score like the adapters, up to fp32 rounding.
    merged = lora.fold({n: p.detach() for n, p in model.named_parameters()}, lora.scale_of(model))
    assert not any(".lora_" in n for n in merged)
    plain = models.load_causal_lm(ModelConfig(path=str(tiny_models["qwen2"])))
    plain.load_state_dict(merged, strict=False)
    torch.testing.assert_close(_logits(plain, IDS), _logits(model, IDS), atol=1e-5, rtol=0)


def test_unknown_target_is_named(tiny_models):
    with pytest.raises(ValueError, match="lora.targets: qkv_proj"):
        _model(tiny_models["qwen2"], LoraConfig(enabled=True, targets=["q_proj", "qkv_proj"]))


# ------------------------------------------------------------------------------------ bad input

def _config(tiny_path, algorithm=None, **lora_fields):
    from types import SimpleNamespace

    from rlcore.config import Config

    # A stand-in algorithm (tests stay independent of any algorithm file): only needs_critic is read.
    return Config(model=ModelConfig(path=str(tiny_path)), algorithm=algorithm or SimpleNamespace(needs_critic=False, needs_reference=False),
                  lora=LoraConfig(enabled=True, **lora_fields))


@pytest.mark.parametrize("fields, says", [
    ({"rank": 0}, "lora.rank must be an integer in [1, 512]"),
    ({"rank": 1024}, "lora.rank must be an integer in [1, 512]"),
    ({"alpha": 0.0}, "lora.alpha must be > 0 (got 0.0)"),
    ({"lr_scale": -1.0}, "lora.lr_scale must be > 0"),
    ({"sync": "full"}, "lora.sync must be one of adapter, merged (got 'full')"),
])
def test_bad_values_are_named(tiny_models, fields, says):
    from rlcore.config import check_values

    with pytest.raises(ValueError, match=re.escape(says)):
        check_values(_config(tiny_models["qwen2"], **fields))


def test_bad_lora_input_is_named(tiny_models):
    from types import SimpleNamespace

    from transformers import AutoConfig, Qwen3MoeConfig

    path = tiny_models["qwen2"]
    hf = AutoConfig.from_pretrained(path)
    with pytest.raises(ValueError, match=r"lora.targets: qkv_proj names no linear layer .* \(its linears: down_proj"):
        lora.check(_config(path, targets=["q_proj", "qkv_proj"]), hf, cuda=False)
    quantized = AutoConfig.from_pretrained(path)
    quantized.quantization_config = {"quant_method": "gptq"}
    with pytest.raises(ValueError, match=r"lora.enabled=true needs an unquantized base: .* \(gptq\)"):
        lora.check(_config(path), quantized, cuda=False)
    with pytest.raises(ValueError, match=r"lora.enabled=true with a critic .* cannot share the policy's adapters"):
        lora.check(_config(path, algorithm=SimpleNamespace(needs_critic=True, needs_reference=False)), hf, cuda=False)
    moe = Qwen3MoeConfig(vocab_size=32, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, num_experts=4,
                         num_experts_per_tok=2, architectures=["Qwen3MoeForCausalLM"])
    with pytest.raises(ValueError, match="lora.sync=adapter: vLLM's CPU engine cannot serve LoRA on a "
                                         "mixture-of-experts model .*; use lora.sync=merged"):
        lora.check(_config(path, targets=["q_proj", "o_proj"]), moe, cuda=False)
    lora.check(_config(path, targets=["q_proj", "o_proj"], sync="merged"), moe, cuda=False)  # merged serves it


def test_bad_lora_input_stops_the_entry_point_before_any_engine(entry, tmp_path):
    """Through launch/train.py's main() (world size 1): exit 2, one error line naming the key, nothing written."""
    proc = entry.train("recipe=demo_lora", "lora.targets=[q_proj,qkv_proj]", f"output_dir={tmp_path}/runs")
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("rlcore: error:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "lora.targets: qkv_proj names no linear layer" in lines[0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_bf16_base_keeps_fp32_adapters_and_their_gradients():
    base = torch.nn.Linear(8, 6, dtype=torch.bfloat16)
    layer = lora.LoRALinear(base, rank=2, alpha=4.0)
    torch.nn.init.normal_(layer.lora_B.weight)
    out = layer(torch.randn(3, 8, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and layer.lora_A.weight.dtype == torch.float32
    out.float().sum().backward()
    assert layer.lora_A.weight.grad.dtype == torch.float32 and layer.weight.grad is None


def test_resume_refuses_a_checkpoint_of_other_adapters(tmp_path):
    """A LoRA checkpoint holds adapters of one rank and set of targets: resuming it without LoRA, or with
    another shape, stops before anything loads (checkpoint.resolve), naming the key."""
    import json
    from types import SimpleNamespace

    from rlcore.outputs import checkpoint

    ckpt = tmp_path / "step_2"
    ckpt.mkdir()
    saved = {"lora.enabled": True, "lora.rank": 16, "lora.targets": ["q_proj"]}
    (ckpt / checkpoint.MARKER).write_text(json.dumps({"step": 2, "model_path": "m", "algorithm": "a",
                                                      "config": saved}))
    cfg = SimpleNamespace(resume=str(ckpt))
    for key, value in (("lora.enabled", False), ("lora.rank", 8)):
        meta = {"model_path": "m", "algorithm": "a", "config": saved | {key: value}}
        with pytest.raises(ValueError, match=f"saved with {key}=.*but this run has {key}={value}"):
            checkpoint.resolve(cfg, tmp_path, meta)
    assert checkpoint.resolve(cfg, tmp_path, {"model_path": "m", "algorithm": "a", "config": saved})[0] == ckpt


def test_adapter_init_depends_on_the_seed_only(tiny_models):
    def a_weights(seed):
        model = lora.apply(models.load_causal_lm(ModelConfig(path=str(tiny_models["qwen2"]))),
                           LoraConfig(enabled=True, rank=4), seed)
        return torch.cat([m.lora_A.weight.flatten() for _, m in lora.lora_modules(model)])

    torch.manual_seed(123)  # the global RNG (which the engine and loaders may use) plays no part
    first = a_weights(0)
    torch.manual_seed(456)
    assert torch.equal(first, a_weights(0)) and not torch.equal(first, a_weights(1))
