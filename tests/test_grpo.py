"""GRPO (rlcore.algorithms.grpo) against hand-computed numbers."""
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlcore.algorithms.grpo import GRPO, dapo, dr_grpo, overlong_penalty
from rlcore.algorithms.objectives import local_normaliser
from rlcore.batch import Batch
from rlcore.config import Config

LOG_HALF, LOG_1_5 = math.log(0.5), math.log(1.5)


def _batch(**fields) -> Batch:
    """Two sequences (one group) of T = 3 scored positions; only the tensors the algorithm reads matter."""
    loss_mask = torch.tensor([[0, 1, 1], [0, 1, 0]])
    defaults = dict(
        input_ids=torch.zeros(2, 4, dtype=torch.long),
        attention_mask=torch.ones(2, 4, dtype=torch.long),
        loss_mask=loss_mask,
        rollout_logprobs=torch.zeros(2, 3),
        rewards=torch.tensor([1.0, 0.0]),
        group_size=2,
        old_logprobs=torch.zeros(2, 3),
        advantages=torch.tensor([[0.0, 1.0, 1.0], [0.0, -1.0, -1.0]]),
        ref_logprobs=torch.tensor([[0.0, 0.0, LOG_HALF], [0.0, 0.0, 0.0]]),
    )
    defaults.update(fields)
    return Batch(**defaults)


def test_advantages_broadcast_on_response_tokens():
    # rewards [1, 0]: mean 0.5, sample std sqrt(0.5); 0.5 / sqrt(0.5) = 0.707107
    a = 0.5 / math.sqrt(0.5)
    expected = torch.tensor([[0.0, a, a], [0.0, -a, 0.0]])
    advantages, metrics = GRPO().advantages(_batch())
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=0)
    assert metrics == {}
    advantages, _ = dr_grpo().advantages(_batch())
    torch.testing.assert_close(advantages, expected / a * 0.5, atol=1e-6, rtol=0)


def test_overlong_penalty():
    # max_len 8, buffer 4: free up to 4 tokens, then -1/4 per token into the buffer
    lengths = torch.tensor([3, 4, 5, 6, 8])
    torch.testing.assert_close(overlong_penalty(lengths, 8, 4), torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0]))
    torch.testing.assert_close(overlong_penalty(lengths, 8, 2, factor=0.5), torch.tensor([0, 0, 0, 0, -0.5]) * 1.0)


def test_dapo_shapes_rewards_before_the_group_baseline():
    """Lengths 2 and 1 with budget 2, buffer 1: the first response pays -1 -> rewards [1 - 1, 0] = [0, 0],
    an all-equal group (advantage 0); without shaping the group is [1, 0]."""
    batch = _batch(max_model_tokens=2)
    algo = dapo(overlong_buffer=1)
    advantages, metrics = algo.advantages(batch)
    torch.testing.assert_close(advantages, torch.zeros(2, 3))
    assert metrics["reward/overlong_penalty_mean"] == pytest.approx(-0.5)
    assert (algo.clip_high, algo.loss_agg, algo.dynamic_sampling) == (0.28, "token-mean", 3)
    assert (dr_grpo().scale_rewards, dr_grpo().loss_agg) == (False, "seq-mean-token-sum-norm")


# logprobs vs old_logprobs = 0: ratios [[1, 1.5, 1], [1, 0.5, 1]]; response tokens (0,1), (0,2), (1,1).
LOGPROBS = [[0.0, LOG_1_5, 0.0], [0.0, LOG_HALF, 0.0]]
# clipped surrogate, clip 0.2: (0,1) r 1.5, A +1 -> -1.2 clipped; (0,2) r 1, A +1 -> -1; (1,1) r .5, A -1 -> .8 clipped
PG = [-1.2, -1.0, 0.8]
# k3 vs ref, exp(lr) - 1 - lr with lr = ref - logp: (0,1) 1/1.5 - 1 + log 1.5; (0,2) .5 - 1 + log 2; (1,1) 2 - 1 - log 2
REF_K3 = [1 / 1.5 - 1 + LOG_1_5, 0.5 - 1 - LOG_HALF, 2 - 1 + LOG_HALF]
# k3 vs old (= 0): (0,1) as above; (0,2) 0; (1,1) as above
OLD_K3 = [REF_K3[0], 0.0, REF_K3[2]]


def test_loss_with_kl():
    batch = _batch()
    logprobs = torch.tensor(LOGPROBS, requires_grad=True)
    loss, metrics = GRPO(kl_coef=0.1).loss(batch, logprobs, local_normaliser(batch.loss_mask))
    assert loss.item() == pytest.approx((sum(PG) + 0.1 * sum(REF_K3)) / 3, abs=1e-6)  # -0.447596
    assert metrics["policy/pg_loss"].item() == pytest.approx(sum(PG) / 3, abs=1e-6)
    assert metrics["policy/clip_frac"].item() == pytest.approx(2 / 3, abs=1e-6)
    assert metrics["policy/kl"].item() == pytest.approx(sum(OLD_K3) / 3, abs=1e-6)
    assert metrics["policy/ref_kl"].item() == pytest.approx(sum(REF_K3) / 3, abs=1e-6)
    loss.backward()
    # clipped tokens keep only the KL gradient, 0.1 / 3 * d k3 / d logp = 0.1 / 3 * (1 - exp(ref - logp))
    # (0,2): unclipped -r*A = -1 plus 0.1 * (1 - 0.5); divided by the 3 tokens
    expected = torch.tensor([[0.0, 0.1 * (1 - 1 / 1.5), -1 + 0.1 * 0.5], [0.0, 0.1 * (1 - 2), 0.0]]) / 3
    torch.testing.assert_close(logprobs.grad, expected, atol=1e-6, rtol=0)


def test_loss_without_reference():
    batch = _batch(ref_logprobs=None)
    logprobs = torch.tensor(LOGPROBS)
    loss, metrics = GRPO().loss(batch, logprobs, local_normaliser(batch.loss_mask))
    assert loss.item() == pytest.approx(sum(PG) / 3, abs=1e-6)  # -0.466667
    assert "policy/ref_kl" not in metrics
    # the paper's per-sequence mean: ((-1.2 - 1) / 2 + 0.8) / 2
    loss, _ = GRPO(loss_agg="seq-mean-token-mean").loss(batch, logprobs, local_normaliser(batch.loss_mask))
    assert loss.item() == pytest.approx((-1.1 + 0.8) / 2, abs=1e-6)


def test_needs_reference():
    assert not GRPO().needs_reference
    assert GRPO(kl_coef=0.04).needs_reference


@pytest.mark.parametrize(
    "algo, group_size, message",
    [
        (GRPO(), 1, r"rollout.group_size must be >= 2 for GRPO \(got 1\)"),
        (GRPO(clip_low=-0.1), 8, "algorithm.clip_low must be >= 0"),
        (GRPO(clip_high=-0.1), 8, "algorithm.clip_high must be >= 0"),
        (GRPO(clip_low=1.0), 8, "algorithm.clip_low must be < 1"),
        (GRPO(kl_coef=-1.0), 8, "algorithm.kl_coef must be >= 0"),
        (GRPO(loss_agg="mean"), 8, "algorithm.loss_agg must be one of token-mean, seq-mean-token-mean"),
        (GRPO(kl_estimator="k4"), 8, "algorithm.kl_estimator must be one of k1, k2, k3"),
        (GRPO(dual_clip=1.1), 8, r"algorithm.dual_clip must be 0 \(off\) or > 1 \+ clip_high = 1.2"),
        (GRPO(tis_mode="clip"), 8, "algorithm.tis_mode must be one of truncate, mask"),
        (GRPO(tis_cap=0.5), 8, "algorithm.tis_cap must be 0"),
        (GRPO(overlong_buffer=32), 8, "algorithm.overlong_buffer=32 must be < rollout.max_new_tokens=32"),
        (GRPO(dynamic_sampling=-1), 8, "algorithm.dynamic_sampling must be >= 0"),
    ],
)
def test_validate_errors(algo, group_size, message):
    cfg = Config()
    cfg.rollout.group_size = group_size
    with pytest.raises(ValueError, match=message):
        algo.validate(cfg)


def test_validate_defaults_pass():
    GRPO().validate(Config())


def test_core_imports_no_algorithm():
    """rlcore.algorithms and rlcore.algorithms.objectives must not pull in GRPO: a recipe picks it."""
    code = "import sys, rlcore.algorithms, rlcore.algorithms.objectives; assert 'rlcore.algorithms.grpo' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])
