"""The environment example of docs/agents.md is true: its recipe file, copied out as written, answers
by hand-checked rules and trains through the real entry point with two-turn rollouts."""
import importlib.util
import json
import re
import shutil

import pytest

from conftest import ROOT, train_warm
from rlcore.rollout.env import Step, as_step


def write_recipe(tmp_path):
    readme = (ROOT / "docs" / "agents.md").read_text()
    code = re.search(r"<!-- env-recipe.*?-->\n```python\n(.*?)```", readme, re.S).group(1)
    assert len(code.splitlines()) <= 40
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    shutil.copy(ROOT / "recipes" / "demo.py", recipes / "demo.py")
    (recipes / "hint_tiny.py").write_text(code)
    return recipes / "hint_tiny.py"


def test_hint_environment_rules(tmp_path):
    spec = importlib.util.spec_from_file_location("hint_tiny", write_recipe(tmp_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    env = module.Hint({"prompt": "47+38=", "answer": "85"})
    assert as_step(env.step("75", [11, 9, 2])) == Step("+", 0.0, False)
    assert as_step(env.step("91", [13, 5, 2])) == Step("-", 0.0, False)
    assert as_step(env.step("8x", [12])) == Step("?", 0.0, False)
    assert as_step(env.step(" 85", [12, 9, 2])).done


@pytest.mark.slow
def test_hint_recipe_trains_with_two_turns(tmp_path):
    proc = train_warm(f"recipe={write_recipe(tmp_path)}", f"output_dir={tmp_path}", "train.steps=2",
                      "data.eval_size=32", "rollout.prompts_per_step=8", "rollout.group_size=4")
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "hint_tiny" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        # The warm-started model is right about a quarter of the time: the rest get a hint and a second turn.
        assert 1.2 < r["env/turns_mean"] <= 2.0 and r["env/active_turn1"] == 32
        assert r["env/active_turn2"] == (r["env/turns_mean"] - 1) * 32
        assert r["tokens/env_mean"] == r["env/turns_mean"] - 1  # one hint token per second turn
        assert r["rollout/logprob_diff_max"] < 1e-4
