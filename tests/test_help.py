"""`--help`: the entry points' usage, and every config key of a recipe with its type, value and doc."""
import dataclasses
import subprocess
import sys

import rlcore.config.sections as config_module
from conftest import ROOT
from rlcore.algorithms.grpo import GRPO
from rlcore.config import help as config_help
from rlcore.config.cli import load_recipe


def config_classes() -> list[type]:
    return [c for c in vars(config_module).values()
            if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == config_module.__name__]


def test_every_config_field_is_documented_where_declared():
    classes = config_classes()
    assert {"Config", "ModelConfig", "RolloutConfig", "TrainConfig", "RewardSpec"} <= {c.__name__ for c in classes}
    undocumented = [f"{c.__name__}.{f.name}" for c in classes for f in dataclasses.fields(c)
                    if not config_help.field_docs(c).get(f.name)]
    assert undocumented == []
    # The comment beside the line, or the lines above a field that has none.
    assert config_help.field_docs(config_module.ModelConfig)["dtype"] == \
        "master weights and optimizer state: float32 | bfloat16"
    assert config_help.field_docs(config_module.TrainConfig)["max_tokens_per_micro_batch"].startswith(
        "Pack whole sequences, padding stripped, into micro-batches")
    assert config_help.field_docs(GRPO)["clip_low"] == "ratio floor is 1 - clip_low"  # from its base class


def test_help_lists_every_field_with_type_value_and_doc():
    cfg = load_recipe("demo", ROOT / "recipes")
    text = config_help.render(cfg, "demo")
    for c in config_classes():
        docs = config_help.field_docs(c)
        for f in dataclasses.fields(c):
            assert docs[f.name] in text, f"{c.__name__}.{f.name}"
    rows = {key: (tp, value, doc) for _, key, tp, value, doc in config_help.keys(cfg)}
    assert rows["rollout.group_size"] == ("int", "8", "responses sampled per prompt")
    assert rows["optim.lr"][:2] == ("float", "0.0001")
    assert rows["rewards.0.fn"][1] == "'rlcore.rewards:arithmetic_exact'"
    assert rows["algorithm.clip_high"][:2] == ("float", "0.2")
    assert rows["critic.optim.lr"][:2] == ("float", "1e-05")
    leaves = [k for k, (tp, _, _) in rows.items() if not tp.startswith("section")]
    assert len(leaves) == len(set(leaves)) and len(leaves) > 80
    assert "[rollout]  the vLLM engines, sampling, environments" in text.splitlines()
    assert "  rollout.group_size = 8  (int)" in text.splitlines()


def test_every_algorithm_key_of_every_recipe_is_documented():
    """Each recipe's algorithm (whichever module it comes from) documents every field where it is declared."""
    from rlcore.config.cli import available_recipes

    recipes = available_recipes(ROOT / "recipes")
    undocumented = [f"{name}: {key}" for name in recipes
                    for _, key, tp, _, doc in config_help.keys(load_recipe(name, ROOT / "recipes"))
                    if key.startswith("algorithm.") and not tp.startswith("section") and not doc]
    assert len(recipes) > 10 and undocumented == []


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "launch" / script), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_entry_points_print_help_and_exit_0():
    usage = run("train.py", "--help")
    assert usage.returncode == 0 and usage.stdout.startswith("rlcore's one entry point") and not usage.stderr
    assert "launch/train.py recipe=grpo --help" in usage.stdout
    keys = run("plan.py", "recipe=demo", "rollout.group_size=4", "--help")  # values after the overrides
    assert keys.returncode == 0, keys.stderr
    assert "  rollout.group_size = 4  (int)\n      responses sampled per prompt\n" in keys.stdout
    plan_usage = run("plan.py", "-h")
    assert plan_usage.returncode == 0 and "--nproc-per-node" in plan_usage.stdout and "--gpu-memory-gb" in plan_usage.stdout
    bad = run("train.py", "recipe=demo", "rollout.group_sise=4", "--help")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "rlcore: error: unknown config key 'rollout.group_sise'; did you mean 'rollout.group_size'?"]
