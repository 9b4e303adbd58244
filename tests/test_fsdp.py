"""FSDP2 as the trainer sets it up: gradients reduce as a SUM of globally normalised contributions."""
import json

import pytest

from conftest import WORKERS, torchrun


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_fsdp_gradient_equals_full_batch_gradient(tiny_models, tmp_path, agg):
    """2 ranks x 2 micro-batches under FSDP2 give the single-process full-batch gradient (to 1e-6)."""
    out = tmp_path / "grad.json"
    proc = torchrun(WORKERS / "fsdp_grad_worker.py", tiny_models["qwen2"], out, agg)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    assert r["grad_scale"] > 1e-3  # a real gradient, so a halved or doubled one would show
    assert r["max_abs_grad_diff"] < 1e-6
