"""REINFORCE++ and REINFORCE++-baseline (rlcore.algorithms.reinforce_pp): hand-computed returns and the
global whitening, checked over two real gloo ranks against one process holding the whole batch."""
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlcore.algorithms.reinforce_pp import ReinforcePP, returns_to_go
from rlcore.batch import Batch
from rlcore.config import Config


def test_returns_to_go():
    rewards = torch.tensor([[0.0, -0.1, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]])
    torch.testing.assert_close(returns_to_go(rewards, mask, 0.5), torch.tensor([[0.0, 0.4, 1.0], [0.0, 2.0, 0.0]]))
    torch.testing.assert_close(returns_to_go(rewards, mask, 1.0), torch.tensor([[0.0, 0.9, 1.0], [0.0, 2.0, 0.0]]))


def _batch(rewards, lengths, group_size=2, T=4):
    B = len(rewards)
    mask = torch.zeros(B, T)
    for i, n in enumerate(lengths):
        mask[i, 1:1 + n] = 1
    return Batch(input_ids=torch.zeros(B, T + 1, dtype=torch.long), attention_mask=torch.ones(B, T + 1, dtype=torch.long),
                 loss_mask=mask, rollout_logprobs=torch.zeros(B, T), rewards=torch.tensor(rewards),
                 group_size=group_size, old_logprobs=torch.zeros(B, T), ref_logprobs=torch.zeros(B, T))


def test_advantages_by_hand():
    """gamma 1, no KL: every token's return is its sequence's reward. Rewards [1, 0] over 2 + 1 tokens ->
    returns [1, 1, 0]: mean 2/3, population std sqrt(2)/3 -> A = [0.7071, 0.7071, -1.4142]."""
    advantages, _ = ReinforcePP().advantages(_batch([1.0, 0.0], [2, 1]))
    s = 2 ** 0.5
    torch.testing.assert_close(advantages, torch.tensor([[0, 1 / s, 1 / s, 0], [0, -s, 0, 0]]), atol=1e-5, rtol=0)


def test_baseline_subtracts_the_group_mean_first():
    """Groups (1, 0) and (1, 1): baseline rewards (0.5, -0.5) and (0, 0). One token each -> returns
    [0.5, -0.5, 0, 0]: mean 0, std sqrt(0.125) -> [1.4142, -1.4142, 0, 0]. Without the baseline the
    all-correct group would get the largest advantage."""
    batch = _batch([1.0, 0.0, 1.0, 1.0], [1, 1, 1, 1])
    advantages, _ = ReinforcePP(baseline=True).advantages(batch)
    torch.testing.assert_close(advantages[:, 1], torch.tensor([1.0, -1.0, 0.0, 0.0]) * 2 ** 0.5, atol=1e-5, rtol=0)
    plain, _ = ReinforcePP().advantages(batch)
    assert plain[2, 1] > 0 and plain[2, 1] == plain[3, 1]


def test_kl_penalty_in_the_reward():
    """k1 penalty 0.5 * (old - ref) with old - ref = 1 on each of 2 tokens, reward 1, gamma 1:
    token rewards [-0.5, 0.5] -> returns [0, 0.5]; a second sequence with reward 0 and 1 token: [-0.5]."""
    batch = _batch([1.0, 0.0], [2, 1])
    batch.ref_logprobs = batch.old_logprobs - 1.0
    algo = ReinforcePP(kl_penalty=0.5)
    returns = torch.tensor([0.0, 0.5, -0.5])
    expected = (returns - returns.mean()) / returns.std(unbiased=False)
    advantages, metrics = algo.advantages(batch)
    torch.testing.assert_close(advantages[batch.loss_mask > 0], expected, atol=1e-5, rtol=0)
    assert metrics["reward/kl_penalty"] == pytest.approx(0.5)


def _worker(rank, init_file, baseline):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        gen = torch.Generator().manual_seed(0)
        rewards = torch.rand(8, generator=gen).round().tolist()
        lengths = torch.randint(1, 4, (8,), generator=gen).tolist()
        algo = ReinforcePP(baseline=baseline, kl_penalty=0.1)
        whole = _batch(rewards, lengths)
        whole.old_logprobs = -torch.rand(8, 4, generator=gen)
        expected, _ = algo.advantages(whole)

        def reduce(t):
            t = t.clone()
            dist.all_reduce(t)
            return t

        mine = whole.rows(rank * 4, rank * 4 + 4)  # whole prompt groups per rank, as the trainer splits
        got, metrics = algo.advantages(mine, reduce)
        # The moments are fp32 sums (n <= 24 masked entries, |x| <= 1.3) added in another order over 2 ranks:
        # dmu <= n u X = 2e-6, d(E[x^2]) <= n u X^2 = 2.4e-6, so with sigma >= 0.3 and |a| <= 3 the whitened
        # advantage moves by at most ~1.7e-4 (the typical difference is ~1e-6; the local-statistics control below
        # differs by > 1e-3).
        torch.testing.assert_close(got, expected[rank * 4:rank * 4 + 4], atol=2e-4, rtol=0)
        assert got.abs().sum() > 0
        local, _ = algo.advantages(mine)  # whitening with only this rank's statistics differs
        assert (local - got).abs().max() > 1e-3
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("baseline", [False, True])
def test_global_whitening_over_two_ranks(tmp_path, baseline):
    mp.spawn(_worker, args=(str(tmp_path / "store"), baseline), nprocs=2, join=True)


@pytest.mark.parametrize("algo, group_size, message", [
    (ReinforcePP(gamma=-0.1), 8, r"algorithm.gamma must be in \[0, 1\]"),
    (ReinforcePP(kl_penalty=-1.0), 8, "algorithm.kl_penalty must be >= 0"),
    (ReinforcePP(kl_penalty_estimator="k0"), 8, "must be one of k1, k2, k3"),
    (ReinforcePP(baseline=True), 1, "rollout.group_size must be >= 2 for the group baseline"),
    (ReinforcePP(clip_high=-0.1), 8, "algorithm.clip_high must be >= 0"),
])
def test_validate_errors(algo, group_size, message):
    cfg = Config()
    cfg.rollout.group_size = group_size
    with pytest.raises(ValueError, match=message):
        algo.validate(cfg)


def test_returns_carry_across_an_environment_gap():
    """Two model turns with an observation between them (mask 0 at positions 3-4): the final reward reaches
    the first turn, discounted by model tokens only. Before multi-turn the gap reset the running sum to 0."""
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 0]], dtype=torch.float32)
    rewards = torch.tensor([[0, 0, 0, 0, 0, 0, 1.0, 0]])
    assert returns_to_go(rewards, mask, 0.5).tolist() == [[0, 0.125, 0.25, 0, 0, 0.5, 1.0, 0]]
    assert returns_to_go(rewards, mask, 1.0).tolist() == [[0, 1, 1, 0, 0, 1, 1, 0]]
    # per-token penalties on both turns (a KL penalty in the reward), gamma 1: sums of what follows
    penalised = torch.tensor([[0, -0.1, -0.1, 0, 0, -0.1, 0.9, 0]])
    assert returns_to_go(penalised, mask, 1.0)[0].tolist() == pytest.approx([0, 0.6, 0.7, 0, 0, 0.8, 0.9, 0])
