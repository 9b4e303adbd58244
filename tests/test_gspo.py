"""GSPO (rlcore.algorithms.gspo) against the hand-computed example of its docstring, both levels, and its
refusals (through the warm entry server: one line, exit 2, before any engine starts)."""
import math

import pytest
import torch

from rlcore.algorithms.gspo import GSPO
from rlcore.algorithms.objectives import local_normaliser
from rlcore.batch import Batch
from rlcore.config import Config


def _example():
    """Two sequences (one group), masks [1, 1, 1] and [1, 1, 0]; log r = [0.1, -0.2, 0.4] with A = +1 and
    [2e-4, 4e-4, pad] with A = -1."""
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    log_r = torch.tensor([[0.1, -0.2, 0.4], [2e-4, 4e-4, 5.0]], dtype=torch.float64)
    batch = Batch(input_ids=torch.zeros(2, 4, dtype=torch.long), attention_mask=torch.ones(2, 4, dtype=torch.long),
                  loss_mask=mask, rollout_logprobs=torch.zeros(2, 3, dtype=torch.float64),
                  rewards=torch.tensor([1.0, 0]),
                  group_size=2, old_logprobs=torch.zeros(2, 3, dtype=torch.float64),
                  advantages=torch.tensor([[1.0, 1, 1], [-1, -1, 0]], dtype=torch.float64))
    return batch, log_r.requires_grad_()


@pytest.mark.parametrize("level", ["sequence", "token"])
def test_worked_example(level):
    """s_1 = e^0.1 = 1.105171, clipped to 1.0004 (gradient 0); s_2 = e^3e-4 = 1.00030005, inside: loss
    -(1.0004 - 1.00030005) / 2 = -4.998e-5; dL/dlog pi = s_2 / (|y_2| G) = 0.250075 on sequence 2's tokens.
    GSPO-token gives the same value and gradient."""
    batch, logprobs = _example()
    loss, metrics = GSPO(level=level).loss(batch, logprobs, local_normaliser(batch.loss_mask))
    assert loss.item() == pytest.approx(-(1.0004 - math.exp(3e-4)) / 2, abs=1e-12)
    assert loss.item() == pytest.approx(-4.998e-5, abs=1e-8)
    loss.backward()
    expected = torch.tensor([[0.0, 0.0, 0.0], [1, 1, 0]], dtype=torch.float64) * math.exp(3e-4) / 4
    torch.testing.assert_close(logprobs.grad, expected)
    assert logprobs.grad[1, 0].item() == pytest.approx(0.250075, abs=1e-6)
    # sequence 1 is clipped: its 3 of the 5 tokens
    assert metrics["policy/clip_frac"].item() == pytest.approx(3 / 5)


def test_group_advantages_as_grpo():
    batch, _ = _example()
    advantages, metrics = GSPO().advantages(batch)
    a = 0.5 / math.sqrt(0.5)  # rewards [1, 0]: mean 0.5, sample std sqrt(0.5)
    torch.testing.assert_close(advantages, torch.tensor([[a, a, a], [-a, -a, 0]]), atol=1e-5, rtol=0)
    assert metrics == {}


@pytest.mark.parametrize("fields, says", [
    ({"dual_clip": 3.0}, "algorithm.dual_clip=3 cannot be used with GSPO: it caps a token ratio's loss and GSPO "
                         "clips one ratio per sequence; set algorithm.dual_clip=0"),
    ({"loss_agg": "token-mean"}, "algorithm.loss_agg=token-mean cannot be used with GSPO: its objective is a mean "
                                 "over sequences; set algorithm.loss_agg=seq-mean-token-mean"),
    ({"level": "batch"}, "algorithm.level must be one of sequence, token (got 'batch')"),
])
def test_refusals(fields, says):
    with pytest.raises(ValueError) as e:
        GSPO(**fields).validate(Config())
    assert str(e.value) == says


def test_refused_through_the_entry_point(entry, tmp_path):
    proc = entry.train("recipe=gspo_tiny", "algorithm.dual_clip=3", f"output_dir={tmp_path}/runs")
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("rlcore: error:")]
    assert proc.returncode == 2 and lines == ["rlcore: error: algorithm.dual_clip=3 cannot be used with GSPO: it "
                                              "caps a token ratio's loss and GSPO clips one ratio per sequence; set "
                                              "algorithm.dual_clip=0"]
    assert not (tmp_path / "runs").exists()


def test_gspo_moe_recipe_is_grpo_moe_with_sequence_ratios():
    """recipe=gspo_moe: the MoE node of recipe=grpo_moe (model, data, engines, batch, steps), valid on 8 GPUs,
    with GSPO's sequence ratio and the paper's window; several optimizer steps per rollout, so the clip acts."""
    from pathlib import Path

    from rlcore.config import validate
    from rlcore.config.cli import load_recipe
    from rlcore.distributed.parallel import ParallelDims

    recipes = Path(__file__).resolve().parents[1] / "recipes"
    cfg, grpo = load_recipe("gspo_moe", recipes), load_recipe("grpo_moe", recipes)
    validate(cfg, ParallelDims(world_size=8, tp=cfg.rollout.tensor_parallel))
    assert (cfg.model, cfg.data, cfg.rollout, cfg.train) == (grpo.model, grpo.data, grpo.rollout, grpo.train)
    assert type(cfg.algorithm).__name__ == "GSPO" and cfg.algorithm.level == "sequence"
    assert (cfg.algorithm.clip_low, cfg.algorithm.clip_high) == (3e-4, 4e-4) and cfg.train.mini_batches > 1
