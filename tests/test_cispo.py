"""CISPO (rlcore.algorithms.cispo) against the hand-computed example of its docstring (beside PPO's clip), and
its refusals (through the warm entry server: one line, exit 2, before any engine starts)."""
import math

import pytest
import torch

from rlcore.algorithms.cispo import CISPO
from rlcore.algorithms.objectives import PolicyLoss, local_normaliser
from rlcore.batch import Batch
from rlcore.config import Config


def _grads(algo, advantage: float) -> list[float]:
    """dL/dlog pi for three tokens with ratios r = [0.5, 1, 3] and one advantage, summed (not averaged)."""
    ratios = torch.tensor([[0.5, 1.0, 3.0]], dtype=torch.float64)
    batch = Batch(input_ids=torch.zeros(1, 4, dtype=torch.long), attention_mask=torch.ones(1, 4, dtype=torch.long),
                  loss_mask=torch.ones(1, 3), rollout_logprobs=torch.zeros(1, 3, dtype=torch.float64),
                  rewards=torch.ones(1), group_size=1, old_logprobs=torch.zeros(1, 3, dtype=torch.float64),
                  advantages=torch.full((1, 3), advantage, dtype=torch.float64))
    logprobs = ratios.log().requires_grad_()
    norm = local_normaliser(torch.ones(1, 3))
    norm.tokens = 1.0  # a sum over the tokens, so each gradient reads as the token's own
    loss, _ = algo.loss(batch, logprobs, norm)
    loss.backward()
    return logprobs.grad[0].tolist()


def test_worked_example_beside_ppo():
    """r = [0.5, 1, 3], cap 2, no floor: A = +1 -> CISPO [-0.5, -1, -2], PPO (0.2) [-0.5, -1, 0];
    A = -1 -> CISPO [0.5, 1, 2], PPO [0, 1, 3]."""
    cispo, ppo = CISPO(clip_low=1.0, clip_high=1.0), PolicyLoss(clip_low=0.2, clip_high=0.2)
    assert _grads(cispo, 1.0) == pytest.approx([-0.5, -1, -2])
    assert _grads(ppo, 1.0) == pytest.approx([-0.5, -1, 0])
    assert _grads(cispo, -1.0) == pytest.approx([0.5, 1, 2])
    assert _grads(ppo, -1.0) == pytest.approx([0, 1, 3])
    # a floor (clip_low 0.2: weight >= 0.8) lifts the first token's weight
    assert _grads(CISPO(clip_low=0.2, clip_high=1.0), 1.0) == pytest.approx([-0.8, -1, -2])


def test_loss_value_is_the_capped_weight():
    """The loss value is -sum(r_hat * A) / N: weights [0.5, 1, 2] with A = 1 over 3 tokens -> -3.5 / 3."""
    ratios = torch.tensor([[0.5, 1.0, 3.0]])
    batch = Batch(input_ids=torch.zeros(1, 4, dtype=torch.long), attention_mask=torch.ones(1, 4, dtype=torch.long),
                  loss_mask=torch.ones(1, 3), rollout_logprobs=torch.zeros(1, 3), rewards=torch.ones(1), group_size=1,
                  old_logprobs=torch.zeros(1, 3), advantages=torch.ones(1, 3))
    loss, metrics = CISPO(clip_high=1.0).loss(batch, ratios.log(), local_normaliser(batch.loss_mask))
    assert loss.item() == pytest.approx(-3.5 / 3)
    assert metrics["policy/clip_frac"].item() == pytest.approx(1 / 3)  # the one capped token
    # k3 of KL(pi_theta || pi_old), 1/r - 1 + log r per token: 0.306853, 0, 0.431946
    assert metrics["policy/kl"].item() == pytest.approx((2 - 1 + math.log(0.5) + 1 / 3 - 1 + math.log(3)) / 3)


@pytest.mark.parametrize("fields, says", [
    ({"dual_clip": 3.0}, "algorithm.dual_clip=3 cannot be used with CISPO: it clips the weight, not the update, "
                         "so there is no loss to cap; set algorithm.dual_clip=0"),
    ({"clip_low": 1.5}, "algorithm.clip_low must be in [0, 1] for CISPO: the weight floor 1 - clip_low cannot be "
                        "negative (1 = no floor; got 1.5)"),
])
def test_refusals(fields, says):
    with pytest.raises(ValueError) as e:
        CISPO(**fields).validate(Config())
    assert str(e.value) == says
    CISPO(clip_low=1.0).validate(Config())  # no floor is CISPO's default, unlike PPO's clip


def test_refused_through_the_entry_point(entry, tmp_path):
    proc = entry.train("recipe=cispo_tiny", "algorithm.dual_clip=3", f"output_dir={tmp_path}/runs")
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("rlcore: error:")]
    assert proc.returncode == 2 and len(lines) == 1 and "cannot be used with CISPO" in lines[0]
    assert not (tmp_path / "runs").exists()
