"""Model sizes for the launch plan (rlcore/preflight/shapes.py): parameter counts from the model class built on the
meta device, checked against a build of every class rlcore loads (the architecture matrix, tiny), against the
published counts of the models the recipes name (their real config.json, written here), and by hand for a
mixture of experts. A config.json transformers cannot build is bad input: one line, exit 2.

No hub, no weights, no GPU."""
import importlib.util
import json

import pytest

from archs import ARCHS, MOE_ARCHS, hf_config
from conftest import ROOT
from hub_configs import QWEN25_0P5B, QWEN3_30B_A3B, REAL, hub_ids, model_dir
from rlcore.config import LoraConfig
from rlcore.config.cli import available_recipes, load_recipe, parse_argv
from rlcore.preflight import plan

HEADS = {"actor": ("AutoModelForCausalLM", {}), "critic": ("AutoModelForTokenClassification", {"num_labels": 1}),
         "reward": ("AutoModelForSequenceClassification", {"num_labels": 1})}


def meta_build(config: dict, role: str = "actor"):
    """The model a role loads (rlcore/models/build.py), built here on the meta device, apart from the plan."""
    import torch
    import transformers

    auto, labels = HEADS[role]
    fields = {k: v for k, v in config.items() if k != "model_type"} | labels
    with torch.device("meta"):
        return getattr(transformers, auto).from_config(transformers.AutoConfig.for_model(config["model_type"],
                                                                                         **fields))


def count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_every_model_a_recipe_names_is_here():
    named = {p for name in available_recipes(ROOT / "recipes") for p in hub_ids(load_recipe(name, ROOT / "recipes"))}
    assert {"Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen3-30B-A3B"} <= named
    assert named <= set(REAL)


@pytest.mark.parametrize("name", sorted(REAL))
def test_the_plan_counts_the_published_sizes(tmp_path, name):
    """plan count == the meta model's count exactly; the meta count within 0.1% of the published one."""
    config, published = REAL[name]
    cfg = parse_argv(["recipe=grpo", f"model.path={model_dir(tmp_path, name)}"], ROOT / "recipes")
    actor = plan.build(cfg, 8, 1, 80).models[0]
    meta = count(meta_build(config))
    assert actor.params == meta
    assert meta == pytest.approx(published, rel=1e-3)


@pytest.mark.parametrize("arch", ARCHS)
def test_counts_and_fsdp_units_match_the_models_rlcore_builds(arch):
    """Every architecture of the test matrix, in every role: the parameters, the largest decoder layer (an FSDP
    unit) and the root unit (the rest), and LoRA's adapters as rlcore's LoRA wraps them (MoE experts: none)."""
    import transformers

    from rlcore.models import lora

    config = {k: v for k, v in hf_config(arch).to_dict().items() if k not in ("id2label", "label2id")}
    for role in HEADS:
        if type(hf_config(arch)) not in getattr(transformers, HEADS[role][0])._model_mapping:
            continue  # no such class in transformers (olmo2 has no token classifier): rlcore cannot build that role
        s, model = plan.Shapes.from_config(config, role), meta_build(config, role)
        layers = [count(layer) for layer in model.get_decoder().layers]
        assert (s.params, s.layer, s.root, s.layers) == (count(model), max(layers), count(model) - sum(layers),
                                                         len(layers)), (arch, role)
    s, model = plan.Shapes.from_config(config), meta_build(config)
    targets = [t for t in LoraConfig().targets if t in s.linears]
    lora.apply(model, LoraConfig(enabled=True, rank=8, targets=targets))
    adapters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert s.adapter_params(8, LoraConfig().targets) == s.adapter_params(8, targets) == adapters > 0
    if arch in MOE_ARCHS:  # the experts are 3-D tensors: only attention is adapted
        assert sorted(targets) == ["k_proj", "o_proj", "q_proj", "v_proj"]


def test_qwen3_30b_a3b_by_hand():
    """Qwen3-30B-A3B: 48 layers of attention (q 32 x 128, k and v 4 x 128, q/k norms) and 128 experts of width
    768 (gate, up, down) with a router; 8 experts a token; untied embedding and LM head."""
    s = plan.Shapes.from_config(QWEN3_30B_A3B)
    h, q, kv, e, i, V = 2048, 32 * 128, 4 * 128, 128, 768, 151936
    layer = 2 * h * q + 2 * h * kv + 2 * 128 + e * 3 * h * i + h * e + 2 * h  # attention, experts, router, norms
    assert s.layer == layer == 623_120_640  # 1.25 GB gathered in bf16
    assert s.root == 2 * V * h + h == 622_331_904
    assert s.params == 48 * layer + s.root == 30_532_122_624
    assert s.mlp == 8 * 768  # routed width of a token (intermediate_size, 6144, happens to be the same)
    assert s.kv_bytes_per_token(tp=4, dtype_bytes=2) == 2 * 48 * 1 * 128 * 2 == 24_576
    assert s.adapter_params(16, LoraConfig().targets) == 48 * 16 * ((h + q) + 2 * (h + kv) + (q + h))
    assert plan.Shapes.from_config(QWEN3_30B_A3B, "critic").params == 30_532_122_624 - V * h + h + 1
    assert plan.Shapes.from_config(QWEN3_30B_A3B, "reward").params == 30_532_122_624 - V * h + h


def test_moe_activations_use_the_routed_width():
    """Mixtral (every expert intermediate_size wide) and qwen3_moe (moe_intermediate_size): a token's MLP
    activations are its num_experts_per_tok experts' width, not the dense intermediate_size."""
    mixtral = plan.Shapes.from_config(hf_config("mixtral").to_dict())
    qwen3_moe = plan.Shapes.from_config(hf_config("qwen3_moe").to_dict())
    llama = plan.Shapes.from_config(hf_config("llama").to_dict())
    assert (mixtral.mlp, qwen3_moe.mlp, llama.mlp) == (2 * 256, 2 * 64, 256)
    assert mixtral.activation_bytes_per_token(False, 2) - llama.activation_bytes_per_token(False, 2) == 2 * 8 * 256
    shared = plan.Shapes.from_config(dict(model_type="qwen2_moe", hidden_size=64, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1, vocab_size=32,
                                          intermediate_size=128, moe_intermediate_size=16, num_experts=4,
                                          num_experts_per_tok=2, shared_expert_intermediate_size=48))
    assert shared.mlp == 2 * 16 + 48


def folder(tmp_path, config: dict):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("broken, reason", [
    ({"model_type": "not_a_model"}, "model_type 'not_a_model' is unknown to transformers"),
    ({"model_type": None}, "it has no model_type"),
    ({"hidden_size": None}, "StrictDataclassFieldValidationError: Validation error for field 'hidden_size': "
                            "TypeError: Field 'hidden_size' expected int, got NoneType (value: None)"),
])
def test_a_config_transformers_cannot_build_is_one_line(tmp_path, broken, reason):
    config = {k: v for k, v in (QWEN25_0P5B | broken).items() if v is not None or k != "model_type"}
    path = folder(tmp_path, config)
    with pytest.raises(ValueError) as e:
        plan.build(parse_argv(["recipe=grpo", f"model.path={path}"], ROOT / "recipes"), 8, 1, 80)
    prefix = f"model.path '{path}': config.json at {path}/config.json cannot build a model on the meta device: "
    assert str(e.value).startswith(prefix + reason) and "\n" not in str(e.value)


def test_both_entry_points_exit_2_on_it(tmp_path, capsys, entry):
    path = folder(tmp_path, QWEN25_0P5B | {"model_type": "not_a_model"})
    line = (f"rlcore: error: model.path '{path}': config.json at {path}/config.json cannot build a model on the meta "
            f"device: model_type 'not_a_model' is unknown to transformers")
    spec = importlib.util.spec_from_file_location("plan_cli", ROOT / "launch" / "plan.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert cli.main(["recipe=grpo", f"model.path={path}", "--nproc-per-node", "8", "--gpu-memory-gb", "80"]) == 2
    assert capsys.readouterr().err.startswith(line)
    proc = entry.train("recipe=demo", "plan=true", f"model.path={path}", f"output_dir={tmp_path}/runs")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(line), proc.stderr[-2000:]
