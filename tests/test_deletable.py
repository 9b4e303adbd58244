"""Every algorithm is deletable: remove its module, and the recipes and tests that use it, from a copy of the
tree; the core still imports, every other recipe loads and validates, and the remaining unit tests pass.
With GRPO (the core's own default) gone, a training step of PPO runs through the real entry point. That the
core imports no algorithm anywhere, not even inside a function, and that the algorithms import none of each
other, is read from the source by tests/test_structure.py: so one real step stands for all of them, and the
five others are deleted together in one copy (each deletion must still take its own recipes and tests)."""
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow  # real torchrun processes and vLLM engines: `make test-fast` leaves them out

# The algorithms deleted from one copy, and a tiny recipe of another algorithm that must survive them (with GRPO
# gone, it takes a step).
ALGORITHMS = {"grpo": "ppo_tiny", "ppo,reinforce_pp,gspo,cispo,distill": "demo"}
# Unit-test files (no engine, no extra processes) run in the copy; a deleted one is skipped.
UNIT_TESTS = ["test_objectives.py", "test_cli.py", "test_recipes.py", "test_grpo.py", "test_ppo.py",
              "test_rewards.py", "test_data.py", "test_contract.py", "test_corrections.py"]

# Run in the copy as a test file of its own, beside the unit tests (one interpreter for both).
CHECK = """
import importlib, os, pkgutil
from pathlib import Path
import rlcore, rlcore.algorithms
from rlcore.config import validate
from rlcore.config.cli import available_recipes, load_recipe
from rlcore.distributed.parallel import ParallelDims

def test_the_core_imports_and_every_remaining_recipe_validates():
    modules = [m.name for m in pkgutil.walk_packages(rlcore.__path__, "rlcore.")]
    for name in modules:
        importlib.import_module(name)
    recipes = available_recipes(Path("recipes"))
    for name in recipes:
        cfg = load_recipe(name, Path("recipes"))
        world = 8 if cfg.rollout.tensor_parallel > 1 or cfg.model.mixed_precision != "none" else 2
        validate(cfg, ParallelDims(world, cfg.rollout.tensor_parallel))
    assert len(modules) > 40 and os.environ["SURVIVOR"] in recipes
    assert not set(os.environ["DELETED"].split(",")) & set(recipes)
"""


def remove_algorithm(tree, algo: str) -> dict[str, list[str]]:
    """Delete rlcore/algorithms/<algo>.py, the recipes importing it, and the tests using either."""
    (tree / "rlcore" / "algorithms" / f"{algo}.py").unlink()
    module = f"rlcore.algorithms.{algo}"
    recipes = [p for p in (tree / "recipes").glob("*.py") if module in p.read_text()]
    names = [p.stem for p in recipes]
    uses = re.compile(re.escape(module) + "|" + "|".join(rf"recipe={n}\b|[\"']{n}[\"']" for n in names))
    tests = [p for p in (tree / "tests").rglob("*.py") if p.name != "conftest.py" and uses.search(p.read_text())]
    for p in recipes + tests:
        p.unlink()
    return {"recipes": names, "tests": sorted(p.name for p in tests)}


@pytest.mark.parametrize("algo", list(ALGORITHMS))  # "a,b": deleted together
def test_deleting_an_algorithm_leaves_the_rest_working(algo, tmp_path):
    tree = tmp_path / "tree"
    for part in ("rlcore", "launch", "recipes", "tests"):
        shutil.copytree(ROOT / part, tree / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in algo.split(","):
        removed = remove_algorithm(tree, name)
        assert removed["recipes"] and removed["tests"], (name, removed)  # the deletion took something with it
        assert ALGORITHMS[algo] not in removed["recipes"]
    env = {"PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}

    (tree / "tests" / "test_deleted_tree.py").write_text(CHECK)
    unit = [f"tests/{name}" for name in UNIT_TESTS if (tree / "tests" / name).exists()]
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *unit,
                            "tests/test_deleted_tree.py"], cwd=tree,
                           env=env | {"DELETED": algo, "SURVIVOR": ALGORITHMS[algo]}, capture_output=True, text=True,
                           timeout=600)
    assert tests.returncode == 0 and " passed" in tests.stdout and " failed" not in tests.stdout, tests.stdout[-3000:]

    if algo != "grpo":
        return
    # One real step of another algorithm (1 rank, its vLLM engine, FSDP2 over the single rank).
    step = subprocess.run([sys.executable, "launch/train.py", f"recipe={ALGORITHMS[algo]}", "train.steps=1",
                           "data.eval_path=", "rollout.prompts_per_step=4", "rollout.group_size=4",
                           f"output_dir={tmp_path / 'runs'}"], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=600)
    assert step.returncode == 0, step.stderr[-3000:]
    assert (tmp_path / "runs").exists() and list((tmp_path / "runs").rglob("metrics.jsonl"))
