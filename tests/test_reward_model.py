"""The reward model, the fourth model: a frozen sequence classifier scored at each sequence's last real token,
FSDP-sharded like the reference, and combined with reward functions by weight."""
import json

import pytest
import torch

from conftest import train_warm
from rlcore.config import ModelConfig
from rlcore.models import build as models
from rlcore.tasks import tiny


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory):
    return tiny.build_reward_model(tmp_path_factory.mktemp("rm") / "rm", seed=1)


def test_scores_at_the_last_real_token(reward_model):
    """Right-padded scores equal each sequence scored alone; a sequence ending in the pad id (pad = EOS)
    is still scored at its last token, where the model's own pad-based pooling would pick an earlier one."""
    rm = models.load_reward_model(str(reward_model), ModelConfig())
    seqs = [[1, 5, 6, 14, 7, 8, 17, 9], [1, 7, 15, 3], [1, 5, 6, 14, 0]]  # the last one ends in pad id 0
    L = max(map(len, seqs))
    ids = torch.tensor([s + [0] * (L - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (L - len(s)) for s in seqs])
    got = models.sequence_scores(rm, ids, mask)
    rm.config.pad_token_id = 31  # an id none of these use: the model's pooling then takes the last token
    alone = [rm(input_ids=torch.tensor([s])).logits[0, 0].item() for s in seqs]
    torch.testing.assert_close(got, torch.tensor(alone), atol=1e-5, rtol=0)
    rm.config.pad_token_id = 0
    pooled = rm(input_ids=ids[2:], attention_mask=mask[2:]).logits[0, 0].item()
    assert abs(pooled - alone[2]) > 1e-4  # the pitfall this function avoids
    assert len(set(round(x, 4) for x in alone)) == 3


def test_not_a_sequence_classifier(tiny_models, tmp_path):
    with pytest.raises(ValueError, match=r"rewards\[1\].model '.*' is a Qwen2ForCausalLM, not a sequence classifier"):
        models.check_reward_model(str(tiny_models["qwen2"]), "rewards[1].model")
    two = tiny.build_reward_model(tmp_path / "two")
    config = json.loads((two / "config.json").read_text())
    config["id2label"] = {"0": "a", "1": "b"}
    (two / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="has num_labels=2; a reward model has 1"):
        models.check_reward_model(str(two), "rewards[0].model")


RECIPE = '''
import runpy
from pathlib import Path
from rlcore.config import RewardSpec

def config():
    cfg = runpy.run_path(str(Path({root!r}) / "recipes" / "demo.py"))["config"]()
    cfg.rewards = [RewardSpec(fn="arithmetic_exact", weight=1.0), RewardSpec(model={rm!r}, weight=0.5)]
    return cfg
'''


@pytest.mark.slow
def test_run_with_a_reward_model_and_a_function(reward_model, tmp_path):
    """2 ranks, 2 steps: the logged reward is 1 x the function's mean + 0.5 x the reward model's, and the
    startup line names all four models."""
    from conftest import ROOT

    recipe = tmp_path / "with_rm.py"
    recipe.write_text(RECIPE.format(root=str(ROOT), rm=str(reward_model)))
    proc = train_warm(f"recipe={recipe}", f"output_dir={tmp_path}", "train.steps=2", "data.eval_path=",
                      "rollout.prompts_per_step=8", "rollout.group_size=4")
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout + proc.stderr
    assert "critic none | reference none | reward arithmetic_exact x1, model " in out
    assert f"model {reward_model} (frozen) x0.5" in out
    rows = [json.loads(line) for line in (tmp_path / "demo" / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        assert r["reward/mean"] == pytest.approx(r["reward/arithmetic_exact"] + 0.5 * r["reward/model0"], abs=1e-5)
        assert r["reward/model0"] != 0.0
