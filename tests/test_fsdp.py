"""FSDP2 as the trainer sets it up: gradients reduce as a SUM of globally normalised contributions."""
import json

import pytest

from conftest import FP32_EPS, WORKERS, torchrun_warm

pytestmark = pytest.mark.slow  # real torchrun processes and vLLM engines: `make test-fast` leaves them out
from rlcore.algorithms.objectives import AGG_MODES


# Each gradient entry sums the batch's 8 x 9 positions, regrouped by micro-batch, plus 2 ranks' parts, and matrix
# products (K <= 256) that may take other kernels for other micro-batch shapes: (72 + 2 + 256) * eps = 3.9e-5 of the
# largest gradient. Not per tensor: a bias whose exact gradient is 0 (softmax ignores a shift) holds rounding only.
BOUND = (8 * 9 + 2 + 256) * FP32_EPS


@pytest.mark.parametrize("ranks", [1, 2])
def test_fsdp_gradient_equals_full_batch_gradient(tiny_models, tmp_path, ranks):
    """The same 8-sequence batch over `ranks` ranks x 1, 2 and 4 micro-batches gives the single-process
    full-batch gradient within BOUND of the largest gradient, for all four aggregation modes (the clipped loss
    with TIS weights), with the sharded policy's logprobs unchunked and chunked (models.token_logprobs applies the root unit's LM head
    outside the model's forward: its gradient must still be reduced)."""
    out = tmp_path / "grad.json"
    proc = torchrun_warm(WORKERS / "fsdp_grad_worker.py", tiny_models["qwen2"], out, nproc=ranks)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    for agg in AGG_MODES:
        assert r[f"{agg}/grad_scale"] > 1e-3  # a real gradient, so a halved or doubled one would show
        for key in [f"{agg}/{micro}{chunked}" for micro in (1, 2, 4) for chunked in ("", "/chunked")]:
            assert r[key] < BOUND * r[f"{agg}/grad_max"], (key, r[key], r[f"{agg}/grad_max"])
