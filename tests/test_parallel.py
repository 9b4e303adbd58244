"""Mesh degrees are validated before anything loads; the rollout mesh rows are vLLM's TP groups."""
import json
import re

import pytest

from conftest import WORKERS, torchrun_warm
from rlcore.distributed.parallel import ParallelDims


@pytest.mark.parametrize("world, tp, heads, kv, message", [
    (2, 0, None, None, "rollout.tensor_parallel must be >= 1 (got 0)"),
    (8, 3, None, None, "rollout.tensor_parallel=3 does not divide the world size 8; valid: [1, 2, 4, 8]"),
    (8, 8, 4, 4, "rollout.tensor_parallel=8 does not divide the model's 4 attention heads"),
    (8, 4, 12, 6, "incompatible with the model's 6 key/value heads"),
])
def test_invalid_degrees(world, tp, heads, kv, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ParallelDims(world, tp).validate(heads, kv)


@pytest.mark.parametrize("world, tp, heads, kv", [(8, 2, 12, 2), (8, 4, 12, 2), (8, 8, 16, 16), (1, 1, 4, 2)])
def test_valid_degrees(world, tp, heads, kv):
    dims = ParallelDims(world, tp)
    dims.validate(heads, kv)  # kv heads are replicated when they divide tp, sharded when tp divides them
    assert dims.rollout_groups == world // tp


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_rollout_mesh_rows_are_contiguous_rank_blocks(tmp_path, tp):
    proc = torchrun_warm(WORKERS / "mesh_worker.py", tp, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {int(p.stem): json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    for rank in (0, 1):
        assert got[rank]["group"] == rank // tp and got[rank]["tp_rank"] == rank % tp
        assert got[rank]["rollout_mesh"] == ([[0], [1]] if tp == 1 else [[0, 1]])
        assert got[rank]["fsdp_mesh"] == [0, 1]
