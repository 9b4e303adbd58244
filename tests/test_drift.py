"""The drift alarm per engine dtype (rlcore/train/logprobs.py): fp32 stops on the largest gap, bf16 on the mean gap
per token; the distribution's summary (quantiles from a histogram that sums over ranks) is exact to its bins.

The bf16 numbers below are the ones measured on the demo with model.mixed_precision=bfloat16 (docs/plan.md,
"The drift alarm"): clean, a 1% nudge of one tensor, one tensor's rows reversed, a skipped sync."""
import math

import pytest
import torch

from rlcore.config import Config, ModelConfig, RolloutConfig
from rlcore.train.logprobs import EDGES, drift_error, histogram, quantile


def cfg(precision: str) -> Config:
    return Config(model=ModelConfig(dtype="float32", mixed_precision=precision), rollout=RolloutConfig())


@pytest.mark.parametrize("precision, mean, max_, stops", [
    ("none", 1e-6, 2e-5, False),  # fp32 engine, a clean sync: rounding only
    ("none", 1e-5, 2e-3, True),  # fp32: one token off by more than 1e-3 is a broken sync
    ("bfloat16", 0.0073, 0.16, False),  # bf16, clean (measured: mean 0.005-0.009, max 0.09-0.16)
    ("bfloat16", 0.0073, 2.5, False),  # bf16, one near-tie token far off: heavy tail, not a fault
    ("bfloat16", 0.2, 1.53, True),  # bf16, the sync skipped twice (measured: mean 0.076, then 0.20)
    ("bfloat16", 4.33, 12.9, True),  # bf16, one tensor's rows reversed (a wrong layout; measured: mean 4.33)
])
def test_the_alarm_per_engine_dtype(precision, mean, max_, stops):
    error = drift_error(cfg(precision), mean, max_)
    assert bool(error) == stops, error
    if stops and precision == "none":
        assert error == f"logprob_diff_max={max_:.3g} exceeds rollout.logprob_diff_threshold=0.001"
    if stops and precision == "bfloat16":
        assert error == (f"logprob_diff_mean={mean:.3g} exceeds rollout.logprob_diff_mean_threshold=0.1 "
                         f"(a bfloat16 engine: the mean is checked)")


def test_quantiles_from_the_histogram():
    """Each quantile is the upper edge of its bin: never below the true quantile, at most one bin (10**0.2) above."""
    diff = torch.tensor([0.0] * 10 + [10.0 ** (-4 + 4 * i / 999) for i in range(1000)], dtype=torch.float64)
    counts = histogram(diff)
    assert sum(counts) == len(diff) and counts[0] == 10  # zeros fall below the first edge
    for q in (0.5, 0.9, 0.99, 0.999):
        true = torch.quantile(diff, q).item()
        got = quantile(counts, q)
        assert true <= got <= true * 10 ** 0.2 * (1 + 1e-12), (q, true, got)
    # Above the last edge the quantile is infinite; an empty histogram reads 0.
    assert quantile(histogram(torch.tensor([1e3])), 0.5) == math.inf and quantile([0] * (len(EDGES) + 1), 0.5) == 0


def test_histograms_sum_over_ranks():
    """Two ranks' counts added are the counts of the two ranks' values together (what all_sum does)."""
    a, b = torch.rand(300).double() * 0.1, torch.rand(500).double() ** 4
    assert [x + y for x, y in zip(histogram(a), histogram(b))] == histogram(torch.cat([a, b]))
