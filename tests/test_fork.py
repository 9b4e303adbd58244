"""The "fork a recipe" example of docs/fork.md is true: its RLOO recipe file, copied as written into a folder
with nothing beside it, loads the built-in demo recipe, computes leave-one-out advantages by hand-computed values
and trains through the real entry point."""
import importlib.util
import json
import re

import pytest

import torch

from conftest import ROOT, train_warm
from rlcore.batch import Batch


def write_fork(tmp_path):
    readme = (ROOT / "docs" / "fork.md").read_text()
    code = re.search(r"<!-- rloo-recipe.*?-->\n```python\n(.*?)```", readme, re.S).group(1)
    folder = tmp_path / "exp"  # a folder with nothing beside the fork: the demo it loads is rlcore's own
    folder.mkdir()
    (folder / "rloo_tiny.py").write_text(code)
    return folder / "rloo_tiny.py"


def test_rloo_advantages(tmp_path):
    spec = importlib.util.spec_from_file_location("rloo_tiny", write_fork(tmp_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # groups (1, 0, 0, 1) and (1, 1, 1, 0): baselines (1/3, 2/3, 2/3, 1/3) and (2/3, 2/3, 2/3, 1)
    batch = Batch(input_ids=torch.zeros(8, 3, dtype=torch.long), attention_mask=torch.ones(8, 3, dtype=torch.long),
                  loss_mask=torch.ones(8, 2), rollout_logprobs=torch.zeros(8, 2),
                  rewards=torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 0]), group_size=4)
    advantages, metrics = module.RLOO().advantages(batch)
    expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 1 / 3, 1 / 3, 1 / 3, -1.0])
    torch.testing.assert_close(advantages, expected[:, None].expand(8, 2), atol=1e-6, rtol=0)
    assert metrics == {}


@pytest.mark.slow
def test_forked_recipe_trains(tmp_path):
    proc = train_warm(f"recipe={write_fork(tmp_path)}", f"output_dir={tmp_path}", "train.steps=2", "data.eval_path=",
                      "rollout.prompts_per_step=8", "rollout.group_size=4", "algorithm.clip_high=0.28")
    assert proc.returncode == 0, proc.stderr[-4000:]
    config = json.loads((tmp_path / "rloo_tiny" / "config.json").read_text())
    assert config["algorithm"]["_target"].endswith(".RLOO") and config["algorithm"]["clip_high"] == 0.28
    rows = [json.loads(line) for line in (tmp_path / "rloo_tiny" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["policy/grad_norm"] > 0 for r in rows)
