"""PPO (rlcore.algorithms.ppo) against hand-computed numbers and a plain GAE loop written here."""
import pytest
import torch

from rlcore.algorithms.objectives import no_reduce
from rlcore.algorithms.ppo import PPO, explained_variance, gae, value_loss
from rlcore.batch import Batch, Normaliser
from rlcore.config import Config, CriticConfig


def test_gae_worked_example():
    # gamma 1, lambda 0.5: deltas [0 + .25 - .5, 1 - .25] = [-.25, .75]; A = [-.25 + .5 * .75, .75]
    advantages, returns = gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[9.0, 0.5, 0.25]]),
                              torch.tensor([[0, 1, 1]]), gamma=1.0, lam=0.5)
    torch.testing.assert_close(advantages, torch.tensor([[0.0, 0.125, 0.75]]))
    torch.testing.assert_close(returns, torch.tensor([[0.0, 0.625, 1.0]]))


def _gae_by_hand(rewards, values, gamma, lam):
    """Textbook GAE over one response (lists), written independently of rlcore."""
    n, out = len(rewards), []
    for t in range(n):
        total = 0.0
        for k in range(t, n):
            v_next = values[k + 1] if k + 1 < n else 0.0
            delta = rewards[k] + gamma * v_next - values[k]
            total += (gamma * lam) ** (k - t) * delta
        out.append(total)
    return out


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.8), (1.0, 1.0), (0.99, 0.0)])
def test_gae_matches_the_textbook_sum(gamma, lam):
    """Right-padded responses of lengths 3 and 1 after prompts of 2 and 1 scored positions."""
    gen = torch.Generator().manual_seed(0)
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 1, 0, 0, 0]])
    rewards = torch.randn(2, 5, generator=gen) * mask
    values = torch.randn(2, 5, generator=gen) * mask
    advantages, returns = gae(rewards, values, mask, gamma, lam)
    for row in range(2):
        idx = mask[row].nonzero().squeeze(-1).tolist()
        expected = _gae_by_hand(rewards[row, idx].tolist(), values[row, idx].tolist(), gamma, lam)
        torch.testing.assert_close(advantages[row, idx], torch.tensor(expected), atol=1e-6, rtol=0)
        torch.testing.assert_close(returns[row, idx], torch.tensor(expected) + values[row, idx], atol=1e-6, rtol=0)
    assert advantages[mask == 0].abs().sum() == 0 and returns[mask == 0].abs().sum() == 0


def test_value_loss_clipped():
    # token 1: V_old 0, V 0.5, R 1 -> max(0.25, (0.2 - 1)^2 = 0.64) = 0.64 (clipped)
    # token 2: V_old 0, V 0.1, R 0 -> max(0.01, 0.01) = 0.01 (not clipped)
    values = torch.tensor([[0.5, 0.1]], requires_grad=True)
    loss, metrics = value_loss(values, torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), torch.ones(1, 2),
                               Normaliser(tokens=2, sequences=1), clip=0.2)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.01) / 2)
    assert metrics["value/clip_frac"].item() == pytest.approx(0.5)
    loss.backward()
    # the clipped token has no gradient; the other: 0.5 * 2 * (0.1 - 0) / 2
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 0.05]]))


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4)
    assert explained_variance(returns, returns, mask, no_reduce) == pytest.approx(1.0)
    # errors [1, 0, -1, 0]: var 0.5 of var(returns) 1.25 -> 1 - 0.4
    values = returns - torch.tensor([[1.0, 0.0, -1.0, 0.0]])
    assert explained_variance(values, returns, mask, no_reduce) == pytest.approx(0.6)
    assert explained_variance(torch.zeros(1, 4), torch.ones(1, 4), mask, no_reduce) == 0.0


def test_advantages_whitened_and_returns():
    """One response of 2 tokens, reward 1, V = [0.5, 0.25], gamma 1, lambda 0.5 -> A = [0.125, 0.75],
    whitened: mean 0.4375, std 0.3125 -> [-1, 1]; returns [0.625, 1]."""
    batch = Batch(input_ids=torch.zeros(1, 4, dtype=torch.long), attention_mask=torch.ones(1, 4, dtype=torch.long),
                  loss_mask=torch.tensor([[0.0, 1.0, 1.0]]), rollout_logprobs=torch.zeros(1, 3),
                  rewards=torch.tensor([1.0]), group_size=1, old_logprobs=torch.zeros(1, 3),
                  values=torch.tensor([[0.0, 0.5, 0.25]]))
    advantages, metrics = PPO(lam=0.5).advantages(batch)
    torch.testing.assert_close(advantages, torch.tensor([[0.0, -1.0, 1.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(PPO(lam=0.5).returns(batch), torch.tensor([[0.0, 0.625, 1.0]]))
    assert batch.returns is None  # returned, not written into the batch
    assert metrics["value/mean"] == pytest.approx(0.375)
    # errors R - V = [0.125, 0.75]: var 0.09766 of var(R) 0.03516 -> 1 - 2.778
    assert metrics["value/explained_variance"] == pytest.approx(1 - 0.0976562 / 0.0351562, abs=1e-4)
    # with a KL penalty, the reward on each token drops by 0.1 * k1(old || ref) = 0.1 * 1
    batch.ref_logprobs = batch.old_logprobs - 1.0
    advantages, metrics = PPO(lam=0.5, kl_penalty=0.1, whiten_advantages=False).advantages(batch)
    # rewards [-0.1, 0.9]: deltas [-0.1 + 0.25 - 0.5, 0.9 - 0.25] = [-0.35, 0.65]; A = [-0.35 + 0.325, 0.65]
    torch.testing.assert_close(advantages, torch.tensor([[0.0, -0.025, 0.65]]), atol=1e-6, rtol=0)
    assert metrics["reward/kl_penalty"] == pytest.approx(0.1)


def _cfg(critic="policy"):
    return Config(critic=CriticConfig(path=critic))


@pytest.mark.parametrize("algo, critic, message", [
    (PPO(gamma=1.5), "policy", r"algorithm.gamma must be in \[0, 1\] \(got 1.5\)"),
    (PPO(lam=-0.1), "policy", r"algorithm.lam must be in \[0, 1\]"),
    (PPO(clip_low=-0.2), "policy", "algorithm.clip_low must be >= 0 .*inverts the ratio range"),
    (PPO(clip_high=-0.3), "policy", "algorithm.clip_high must be >= 0"),
    (PPO(value_clip=-1.0), "policy", "algorithm.value_clip must be >= 0"),
    (PPO(loss_agg="sum"), "policy", "algorithm.loss_agg must be one of token-mean, seq-mean-token-mean, "
                                    "seq-mean-token-sum, seq-mean-token-sum-norm"),
    (PPO(kl_penalty_estimator="k9"), "policy", "algorithm.kl_penalty_estimator must be one of k1, k2, k3"),
    (PPO(), "", "PPO needs a critic but critic.path is empty"),
])
def test_validate_errors(algo, critic, message):
    with pytest.raises(ValueError, match=message):
        algo.validate(_cfg(critic))


def test_needs():
    PPO().validate(_cfg())
    assert PPO.needs_critic and not PPO().needs_reference
    assert PPO(kl_penalty=0.01).needs_reference and PPO(kl_coef=0.01).needs_reference


def test_gae_carries_across_an_environment_gap():
    """Turn 1 (positions 0-1), an observation (2-3, mask 0, values 0 there), turn 2 (4-5) with the reward on
    its last token; gamma 1, lambda 0.5, V = [0.1, 0.2, -, -, 0.4, 0.5]:
      t5: delta = 1 - 0.5 = 0.5                A5 = 0.5
      t4: delta = 0.5 - 0.4 = 0.1              A4 = 0.1 + 0.5 * 0.5 = 0.35
      t1: delta = 0.4 - 0.2 = 0.2 (V of t4)    A1 = 0.2 + 0.5 * 0.35 = 0.375
      t0: delta = 0.2 - 0.1 = 0.1              A0 = 0.1 + 0.5 * 0.375 = 0.2875
    exactly the advantages of the same four tokens without the gap."""
    mask = torch.tensor([[1, 1, 0, 0, 1, 1]], dtype=torch.float32)
    values = torch.tensor([[0.1, 0.2, 0, 0, 0.4, 0.5]])
    rewards = torch.tensor([[0, 0, 0, 0, 0, 1.0]])
    adv, ret = gae(rewards, values, mask, 1.0, 0.5)
    assert adv[0].tolist() == pytest.approx([0.2875, 0.375, 0, 0, 0.35, 0.5])
    assert ret[0].tolist() == pytest.approx([0.3875, 0.575, 0, 0, 0.75, 1.0])
    flat, _ = gae(torch.tensor([[0, 0, 0, 1.0]]), torch.tensor([[0.1, 0.2, 0.4, 0.5]]), torch.ones(1, 4), 1.0, 0.5)
    assert adv[mask.bool()].tolist() == pytest.approx(flat[0].tolist())
