"""rlcore.algorithms.base: the contract every algorithm meets, checked without any algorithm file (so deleting
one leaves this test), on stand-ins written as a user's fork would be."""
import pytest
import torch

from rlcore.algorithms.base import Algorithm, check
from rlcore.algorithms.objectives import KLRewardPenalty, PolicyLoss
from rlcore.batch import Batch


class Fork(PolicyLoss):
    def advantages(self, batch, reduce):
        return batch.loss_mask, {}


class WithCritic(Fork):
    needs_critic = True

    def value_loss(self, batch, values, norm):
        return values.sum(), {}


def test_defaults_of_the_base():
    a = Fork()
    check(a)
    assert (a.needs_critic, a.needs_reference, a.advantages_use_old_logprobs, a.dynamic_sampling,
            a.corrects_off_policy) == (False, False, False, 0, False)
    assert Fork(kl_coef=0.1).needs_reference and Fork(tis_cap=2.0).corrects_off_policy
    assert isinstance(a, Algorithm)


@pytest.mark.parametrize("algorithm, says", [
    (None, "algorithm is not set: the recipe must set cfg.algorithm (e.g. GRPO())"),
    (PolicyLoss(), "algorithm PolicyLoss does not implement advantages()"),
    (WithCritic(), "algorithm WithCritic does not implement returns()"),
    (type("NoLoss", (Algorithm,), {"advantages": Fork.advantages})(), "algorithm NoLoss does not implement loss()"),
    (type("Flag", (Fork,), {"dynamic_sampling": True})(),
     "algorithm Flag: dynamic_sampling must be an integer (got True)"),
    (type("Flag", (Fork,), {"needs_critic": 1})(), "algorithm Flag: needs_critic must be true or false (got 1)"),
    (type("Flag", (Fork,), {"teacher": None})(), "algorithm Flag: teacher must be a string (got None)"),
    (type("Duck", (), {"advantages": Fork.advantages, "loss": PolicyLoss.loss})(),
     "algorithm Duck has no needs_critic"),
])
def test_a_missing_piece_is_one_line(algorithm, says):
    with pytest.raises(ValueError) as e:
        check(algorithm)
    assert str(e.value).startswith(says) and "\n" not in str(e.value)


def test_kl_penalty_written_once():
    """KLRewardPenalty (PPO's and REINFORCE++'s reward penalty): rewards [1, 0], masks [[0, 1, 1], [1, 1, 0]],
    k1 = old - ref = 1 on every token, kl_penalty 0.1 -> [[0, -0.1, 0.9], [-0.1, -0.1, 0]]; metric 0.1 * 1."""
    batch = Batch(input_ids=torch.zeros(2, 4, dtype=torch.long), attention_mask=torch.ones(2, 4, dtype=torch.long),
                  loss_mask=torch.tensor([[0.0, 1, 1], [1, 1, 0]]), rollout_logprobs=torch.zeros(2, 3),
                  rewards=torch.tensor([1.0, 0.0]), group_size=1, old_logprobs=torch.zeros(2, 3),
                  ref_logprobs=-torch.ones(2, 3))
    algo = KLRewardPenalty(kl_penalty=0.1)
    rewards, metrics = algo.penalised_rewards(batch, batch.rewards)
    torch.testing.assert_close(rewards, torch.tensor([[0.0, -0.1, 0.9], [-0.1, -0.1, 0.0]]))
    assert metrics == {"reward/kl_penalty": pytest.approx(0.1)}
    assert algo.needs_reference and algo.advantages_use_old_logprobs
    plain, none = KLRewardPenalty().penalised_rewards(batch, batch.rewards)
    torch.testing.assert_close(plain, torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])) and none == {}
    assert not KLRewardPenalty().needs_reference
