"""rlcore.algorithms.corrections and PolicyLoss's correction options, on the 2x3 batch of the notes (E4), by hand:

    sequence 1: delta = [0, 1, -1]            rho = [1, e, 1/e] = [1, 2.718282, 0.367879]
    sequence 2: delta = [0.005, 0.015, pad]   rho = [1.005013, 1.015113]

    token truncate 2       [1, 2, 0.367879]                 [1.005013, 1.015113]
    token mask 2           [1, 0, 0.367879]                 unchanged
    IcePop [0.5, 5]        [1, 2.718282, 0]                 unchanged
    IcePop [0.5, 2]        [1, 0, 0]                        unchanged
    product                1: kept in [0.5, 2]              1.020201: kept
    geometric mean         1: kept in [0.99, 1.01]          exp(0.01) = 1.010050: masked
    k3 KL(rollout || old)  [0, 0.718282, 0.367879]          [1.25e-5, 1.13e-4]
"""
import math

import pytest
import torch

from rlcore.algorithms.corrections import log_ratio, rollout_kl, sequence_keep, tis_weights
from rlcore.algorithms.objectives import PolicyLoss, local_normaliser
from rlcore.batch import Batch

OLD = torch.tensor([[0.0, 1.0, -1.0], [0.005, 0.015, 3.0]])  # the pad's 3.0 must never count
ROLLOUT = torch.zeros(2, 3)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
E, R1, R2 = math.e, math.exp(0.005), math.exp(0.015)


@pytest.mark.parametrize("mode, low, cap, row1", [
    ("truncate", 0.0, 2.0, [1, 2, 1 / E]),
    ("mask", 0.0, 2.0, [1, 0, 1 / E]),
    ("mask", 0.5, 5.0, [1, E, 0]),  # IcePop [0.5, 5]
    ("mask", 0.5, 2.0, [1, 0, 0]),  # IcePop [0.5, 2]
])
def test_token_corrections(mode, low, cap, row1):
    weights, raw, cut = tis_weights(OLD, ROLLOUT, MASK, cap, "token", mode, low)
    torch.testing.assert_close(weights, torch.tensor([row1, [R1, R2, 0.0]]))
    torch.testing.assert_close(raw, torch.tensor([[1, E, 1 / E], [R1, R2, 0.0]]))
    assert cut.sum().item() == sum(w != r for w, r in zip(row1, [1, E, 1 / E]))


def test_sequence_levels_and_masks():
    torch.testing.assert_close(log_ratio(OLD, ROLLOUT, MASK, "sequence"), torch.tensor([[0.0] * 3, [0.02, 0.02, 0]]))
    torch.testing.assert_close(log_ratio(OLD, ROLLOUT, MASK, "geometric"), torch.tensor([[0.0] * 3, [0.01, 0.01, 0]]))
    assert sequence_keep(OLD, ROLLOUT, MASK, "product", 0.5, 2.0).flatten().tolist() == [1.0, 1.0]
    assert sequence_keep(OLD, ROLLOUT, MASK, "geometric", 0.99, 1.01).flatten().tolist() == [1.0, 0.0]
    assert sequence_keep(OLD, ROLLOUT, MASK, "geometric", 0.99, 1.0101).flatten().tolist() == [1.0, 1.0]
    # geometric truncation at 1.005: sequence 2's weight exp(0.01) is cut to the cap on its two tokens
    weights, _, cut = tis_weights(OLD, ROLLOUT, MASK, 1.005, "geometric")
    torch.testing.assert_close(weights, torch.tensor([[1.0, 1, 1], [1.005, 1.005, 0]]))
    assert cut.sum().item() == 2


def test_rollout_kl():
    kl = rollout_kl(OLD, ROLLOUT, MASK)
    torch.testing.assert_close(kl, torch.tensor([[0.0, E - 2, 1 / E], [R1 - 1.005, R2 - 1.015, 0.0]]))
    assert kl[0].mean().item() == pytest.approx(0.362054, abs=1e-6)  # the notes' mean K3, rejected at 0.01


def test_policy_loss_with_icepop_and_geometric_mask():
    """A = 1 everywhere, logprobs = old (ratio 1: the surrogate is -1 per token). IcePop [0.5, 5] weights
    [1, e, 0] and [R1, R2]; the geometric mask [0.99, 1.01] drops sequence 2: per-token loss [-1, -e, 0], 0, 0
    over 5 tokens -> -(1 + e) / 5. Metrics: raw weights' mean (1 + e + 1/e + R1 + R2) / 5 and max e; cut 1 of
    5 tokens; 1 of 2 sequences masked."""
    batch = Batch(input_ids=torch.zeros(2, 4, dtype=torch.long), attention_mask=torch.ones(2, 4, dtype=torch.long),
                  loss_mask=MASK, rollout_logprobs=ROLLOUT, rewards=torch.ones(2), group_size=1, old_logprobs=OLD,
                  advantages=torch.ones(2, 3))
    algo = PolicyLoss(tis_cap=5.0, tis_low=0.5, tis_mode="mask", seq_mask="geometric")
    loss, metrics = algo.loss(batch, OLD.clone(), local_normaliser(MASK))
    assert loss.item() == pytest.approx(-(1 + E) / 5)
    assert metrics["policy/is_weight_mean"].item() == pytest.approx((1 + E + 1 / E + R1 + R2) / 5)
    assert metrics["policy/is_weight_max"].item() == pytest.approx(E)
    assert metrics["policy/is_truncated_frac"].item() == pytest.approx(1 / 5)
    assert metrics["policy/seq_masked_frac"].item() == pytest.approx(1 / 2)
    assert algo.corrects_off_policy and PolicyLoss(seq_mask="product").corrects_off_policy


@pytest.mark.parametrize("fields, says", [
    ({"tis_low": 0.5, "tis_cap": 2.0}, "algorithm.tis_low=0.5 is a mask's lower bound: it needs tis_mode=mask"),
    ({"tis_low": 1.5, "tis_cap": 2.0, "tis_mode": "mask"}, "algorithm.tis_low must be in [0, 1)"),
    ({"seq_mask": "geometric", "seq_mask_low": 1.01, "seq_mask_high": 0.99}, "0 < low < 1 < high < inf"),
    ({"seq_mask": "product", "seq_mask_low": 0.0}, "0 < low < 1 < high < inf (got [0.0, 1.01])"),
    ({"seq_mask": "product", "seq_mask_high": math.inf}, "0 < low < 1 < high < inf"),
    ({"seq_mask": "mean"}, "algorithm.seq_mask must be one of (empty: off), geometric, product (got 'mean')"),
    ({"tis_level": "batch"}, "algorithm.tis_level must be one of token, sequence, geometric"),
])
def test_bad_corrections(fields, says):
    with pytest.raises(ValueError) as e:
        PolicyLoss(**fields).validate(None)
    assert says in str(e.value)
