"""FSDP2 as the trainer sets it up: gradients reduce as a SUM of globally normalised contributions."""
import json

import pytest

from conftest import WORKERS, torchrun
from rlcore.objectives import AGG_MODES


@pytest.mark.parametrize("ranks", [1, 2])
def test_fsdp_gradient_equals_full_batch_gradient(tiny_models, tmp_path, ranks):
    """The same 8-sequence batch over `ranks` ranks x 1, 2 and 4 micro-batches gives the single-process
    full-batch gradient to 1e-6, for all four aggregation modes (the clipped loss with TIS weights)."""
    out = tmp_path / "grad.json"
    proc = torchrun(WORKERS / "fsdp_grad_worker.py", tiny_models["qwen2"], out, nproc=ranks)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    for agg in AGG_MODES:
        assert r[f"{agg}/grad_scale"] > 1e-3  # a real gradient, so a halved or doubled one would show
        for micro in (1, 2, 4):
            assert r[f"{agg}/{micro}"] < 1e-6, (agg, micro, r[f"{agg}/{micro}"])
