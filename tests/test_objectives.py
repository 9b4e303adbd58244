"""rlcore.algorithms.objectives against hand-computed numbers, and the split-invariance of every aggregation mode."""
import math

import pytest
import torch

from rlcore.algorithms.corrections import tis_weights
from rlcore.algorithms.objectives import (
    AGG_MODES,
    aggregate,
    clipped_surrogate,
    kl_estimate,
    local_normaliser,
    masked_mean,
    masked_sum,
    masked_whiten,
    PolicyLoss,
    group_advantages,
    token_rewards,
)
from rlcore.batch import Batch, Normaliser

LOG_HALF = math.log(0.5)


@pytest.mark.parametrize(
    "kind, expected",
    [
        # pairs (logp, ref): (0, log .5), (log .5, 0), (0.3, 0.3); log_ratio = logp - ref = .6931, -.6931, 0
        ("k1", [0.693147, -0.693147, 0.0]),
        ("k2", [0.5 * 0.693147**2, 0.5 * 0.693147**2, 0.0]),
        # exp(-lr) - 1 + lr: 0.5 - 1 + .693147 ; 2 - 1 - .693147
        ("k3", [0.193147, 0.306853, 0.0]),
    ],
)
def test_kl_estimators(kind, expected):
    logprobs = torch.tensor([0.0, LOG_HALF, 0.3])
    ref_logprobs = torch.tensor([LOG_HALF, 0.0, 0.3])
    got = kl_estimate(logprobs, ref_logprobs, kind)
    torch.testing.assert_close(got, torch.tensor(expected), atol=1e-5, rtol=0)


def test_kl_unknown_kind():
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")


def _surrogate(ratios, advantages, **kw):
    logprobs = torch.tensor(ratios, dtype=torch.float64).log().requires_grad_()
    advantages = torch.tensor(advantages, dtype=torch.float64)
    loss, clipped = clipped_surrogate(logprobs, torch.zeros_like(logprobs), advantages, **kw)
    loss.sum().backward()
    return loss.detach(), clipped, logprobs.grad


def test_clipped_surrogate_asymmetric():
    # clip range [0.8, 1.28]
    ratios = [1.5, 1.5, 0.5, 0.5, 1.1, 0.7, 1.25]
    advs = [1.0, -1.0, 1.0, -1.0, 2.0, -1.0, 1.0]
    loss, clipped, grad = _surrogate(ratios, advs, clip_low=0.2, clip_high=0.28)
    # -min(r*A, clip(r)*A), token by token:
    #   1.5,+1: min(1.5, 1.28) -> -1.28 clipped     1.5,-1: min(-1.5, -1.28) -> 1.5
    #   0.5,+1: min(0.5, 0.8) -> -0.5               0.5,-1: min(-0.5, -0.8) -> 0.8 clipped
    #   1.1,+2: -2.2                                0.7,-1: min(-0.7, -0.8) -> 0.8 clipped (floor 0.8)
    #   1.25,+1: -1.25, inside the higher ceiling (a symmetric 0.2 clip would cap it at -1.2)
    torch.testing.assert_close(loss, torch.tensor([-1.28, 1.5, -0.5, 0.8, -2.2, 0.8, -1.25], dtype=torch.float64))
    assert clipped.tolist() == [True, False, False, True, False, True, False]
    # d(-r*A)/dlogp = -r*A where unclipped, 0 where clipped
    torch.testing.assert_close(grad, torch.tensor([0.0, 1.5, -0.5, 0.0, -2.2, 0.0, -1.25], dtype=torch.float64))


def test_clipped_surrogate_dual_clip():
    ratios = [5.0, 2.0, 5.0]
    advs = [-1.0, -1.0, 1.0]
    loss, clipped, grad = _surrogate(ratios, advs, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    # 5,-1: PPO loss 5, capped at -3 * -1 = 3;  2,-1: 2 < 3, kept;  5,+1: ordinary clip -> -1.2
    torch.testing.assert_close(loss, torch.tensor([3.0, 2.0, -1.2], dtype=torch.float64))
    assert clipped.tolist() == [True, False, True]
    torch.testing.assert_close(grad, torch.tensor([0.0, 2.0, 0.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_surrogate(torch.zeros(1), torch.zeros(1), torch.ones(1), 0.2, 0.2, dual_clip=1.0)


def test_masked_helpers():
    x = torch.tensor([[1.0, 3.0, 9.0], [5.0, 7.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    assert masked_sum(x, mask).item() == 16.0
    assert masked_mean(x, mask).item() == 4.0
    torch.testing.assert_close(masked_mean(x, mask, dim=-1), torch.tensor([2.0, 6.0]))
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0
    # mean 4, population std sqrt((9 + 1 + 1 + 9) / 4) = sqrt(5)
    s = math.sqrt(5)
    torch.testing.assert_close(masked_whiten(x, mask), torch.tensor([[-3 / s, -1 / s, 0.0], [1 / s, 3 / s, 0.0]]))


def test_local_normaliser():
    mask = torch.tensor([[0, 1, 1], [0, 0, 0], [1, 0, 0]])
    assert local_normaliser(mask) == Normaliser(tokens=3.0, sequences=2.0)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", (1 + 2 + 4) / 3),
        ("seq-mean-token-mean", ((1 + 2) / 2 + 4 / 1) / 2),
        ("seq-mean-token-sum", ((1 + 2) + 4) / 2),
        ("seq-mean-token-sum-norm", ((1 + 2) / 3 + 4 / 3) / 2),
    ],
)
def test_aggregate_modes(mode, expected):
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])  # [2, 3]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    got = aggregate(per_token, mask, mode, local_normaliser(mask), max_len=3)
    assert got.item() == pytest.approx(expected, abs=1e-6)


def test_aggregate_errors():
    x, m, norm = torch.ones(1, 2), torch.ones(1, 2), Normaliser(2.0, 1.0)
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean"):
        aggregate(x, m, "mean", norm)
    with pytest.raises(ValueError, match="max_len"):
        aggregate(x, m, "seq-mean-token-sum-norm", norm)


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("micro_batches", [1, 2, 4])
def test_aggregate_split_invariance(mode, micro_batches):
    """Summing micro-batch contributions under the global Normaliser gives the full-batch loss and gradient."""
    gen = torch.Generator().manual_seed(0)
    B, T = 4, 6
    # Response lengths 2, 6, 3, 1 after prompts of different lengths.
    mask = torch.zeros(B, T)
    for row, (start, length) in enumerate([(1, 2), (0, 6), (2, 3), (5, 1)]):
        mask[row, start : start + length] = 1
    old = -torch.rand(B, T, generator=gen, dtype=torch.float64)
    adv = torch.randn(B, T, generator=gen, dtype=torch.float64)

    def loss_and_grad(bounds):
        logprobs = (old + 0.3 * torch.randn(B, T, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
        logprobs.requires_grad_()
        norm = Normaliser(0.0, 0.0)
        for lo, hi in bounds:  # the trainer sums counts over micro-batches (and ranks) first
            n = local_normaliser(mask[lo:hi])
            norm = Normaliser(norm.tokens + n.tokens, norm.sequences + n.sequences)
        total = 0.0
        for lo, hi in bounds:
            per_token, _ = clipped_surrogate(logprobs[lo:hi], old[lo:hi], adv[lo:hi], 0.2, 0.2)
            contribution = aggregate(per_token, mask[lo:hi], mode, norm, max_len=T)
            contribution.backward()
            total += contribution.item()
        return total, logprobs.grad

    full_loss, full_grad = loss_and_grad([(0, B)])
    size = B // micro_batches
    split_loss, split_grad = loss_and_grad([(i, i + size) for i in range(0, B, size)])
    assert split_loss == pytest.approx(full_loss, abs=1e-6)
    torch.testing.assert_close(split_grad, full_grad, atol=1e-6, rtol=0)
    assert full_grad.abs().sum() > 0


def test_per_micro_batch_mean_is_not_invariant():
    """Why the Normaliser exists: dividing each micro-batch by its own count changes the loss."""
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    full = aggregate(per_token, mask, "token-mean", local_normaliser(mask)).item()  # 7 / 3
    rows = [(per_token[i : i + 1], mask[i : i + 1]) for i in (0, 1)]
    naive = sum(aggregate(l, m, "token-mean", local_normaliser(m)) for l, m in rows)
    assert full == pytest.approx(7 / 3)
    assert naive.item() == pytest.approx(1.5 + 4.0)  # each micro-batch's own mean, summed


def test_tis_weights_token_level():
    # old - rollout = [0, 1, -1] on response tokens -> w = [1, e, 1/e]; position 0 is the prompt
    old = torch.tensor([[5.0, 0.0, 1.0, -1.0]])
    rollout = torch.zeros(1, 4)
    mask = torch.tensor([[0, 1, 1, 1]])
    e = math.e
    weights, raw, truncated = tis_weights(old, rollout, mask, cap=2.0)
    torch.testing.assert_close(raw, torch.tensor([[0.0, 1.0, e, 1 / e]]))
    torch.testing.assert_close(weights, torch.tensor([[0.0, 1.0, 2.0, 1 / e]]))
    assert truncated.tolist() == [[False, False, True, False]]
    weights, _, _ = tis_weights(old, rollout, mask, cap=2.0, mode="mask")
    torch.testing.assert_close(weights, torch.tensor([[0.0, 1.0, 0.0, 1 / e]]))


def test_tis_weights_sequence_level():
    # sequence 1: log w = 0 + 1 - 1 = 0 -> w = 1 on each token; sequence 2: log w = 0.5 + 0.5 -> e > cap 2
    old = torch.tensor([[0.0, 1.0, -1.0], [0.5, 0.5, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    weights, raw, truncated = tis_weights(old, torch.zeros(2, 3), mask, cap=2.0, level="sequence")
    torch.testing.assert_close(raw, torch.tensor([[1.0, 1.0, 1.0], [math.e, math.e, 0.0]]))
    torch.testing.assert_close(weights, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))
    weights, _, truncated = tis_weights(old, torch.zeros(2, 3), mask, cap=2.0, level="sequence", mode="mask")
    torch.testing.assert_close(weights, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert truncated.sum().item() == 2
    with pytest.raises(ValueError, match="token, sequence"):
        tis_weights(old, old, mask, 2.0, level="batch")


def test_policy_loss_with_tis():
    """A = 1 on two tokens, ratio 1 (logprobs = old): the surrogate is -1 per token; TIS weights [1, 2]
    (cap 2 truncates e) give -(1 + 2) / 2 tokens = -1.5; is_weight_mean is the raw (1 + e) / 2."""
    batch = Batch(input_ids=torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 3, dtype=torch.long),
                  loss_mask=torch.tensor([[1.0, 1.0]]), rollout_logprobs=torch.tensor([[0.0, -1.0]]),
                  rewards=torch.ones(1), group_size=1, old_logprobs=torch.zeros(1, 2), advantages=torch.ones(1, 2))
    loss, metrics = PolicyLoss(tis_cap=2.0).loss(batch, torch.zeros(1, 2), local_normaliser(batch.loss_mask))
    assert loss.item() == pytest.approx(-1.5)
    assert metrics["policy/is_weight_mean"].item() == pytest.approx((1 + math.e) / 2)
    assert metrics["policy/is_truncated_frac"].item() == pytest.approx(0.5)
    loss, metrics = PolicyLoss().loss(batch, torch.zeros(1, 2), local_normaliser(batch.loss_mask))
    assert loss.item() == pytest.approx(-1.0) and "policy/is_weight_mean" not in metrics


def test_token_rewards_kl_penalty():
    rewards = torch.tensor([1.0, 2.0])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]])
    kl = torch.tensor([[9.0, 0.5, 0.25], [9.0, 1.0, 9.0]])
    expected = torch.tensor([[0.0, -0.05, 1 - 0.025], [0.0, 2 - 0.1, 0.0]])
    torch.testing.assert_close(token_rewards(rewards, mask, kl, 0.1), expected)
    torch.testing.assert_close(token_rewards(rewards, mask), torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]]))


def test_whiten_with_reduce_uses_global_moments():
    """Two 'ranks' holding [1, 3] and [5, 7]: the global mean 4 and population std sqrt(5) whiten each half.
    `reduce` here adds the other rank's moments, as the all-reduce would."""
    a, b = torch.tensor([[1.0, 3.0]]), torch.tensor([[5.0, 7.0]])
    mask = torch.ones(1, 2)

    def moments(x):
        return torch.stack([mask.sum(), x.sum(), (x * x).sum()]).double()

    got = masked_whiten(a, mask, reduce=lambda t: t + moments(b))
    torch.testing.assert_close(got, torch.tensor([[-3.0, -1.0]]) / math.sqrt(5), atol=1e-6, rtol=0)
    got = masked_whiten(a, mask, reduce=lambda t: t + moments(b), shift_mean=False)
    torch.testing.assert_close(got, torch.tensor([[1.0, 3.0]]) / math.sqrt(5), atol=1e-6, rtol=0)


def test_group_advantages():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    # group 1: mean 0.5, sample std sqrt(4 * 0.25 / 3) = sqrt(1/3); 0.5 / sqrt(1/3) = 0.866025
    # group 2: all equal -> 0 (the eps keeps 0 / 0 away)
    a = 0.5 / math.sqrt(1 / 3)
    expected = torch.tensor([a, -a, -a, a, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(group_advantages(rewards, 4), expected, atol=1e-5, rtol=0)
    unscaled = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(group_advantages(rewards, 4, scale=False), unscaled)
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(rewards, 3)
