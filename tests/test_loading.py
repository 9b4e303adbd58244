"""Loading that scales with the node (rlcore/models/load.py): with meta=True each rank reads only the rows of the
checkpoint its FSDP2 shards keep, and the model is the one from_pretrained + fully_shard gives, bit for bit."""
import json

import pytest

import archs
from conftest import WORKERS, torchrun

pytestmark = pytest.mark.slow  # a real torchrun launch: `make test-fast` leaves it out


def test_sharded_load_equals_whole_load_then_shard(tmp_path):
    """One launch, every architecture of the matrix at world size 2: every parameter's local shard and every
    buffer (rotary inv_freq, Gemma's embed_scale) equal bit for bit, with dtype, placement, tied weights, the
    conversions kept for saving and the numbers drawn from the global RNG. Cases: the causal LM (fp32, and bf16
    cast on load), the critic with its new zero head and the reward model where transformers has the class, a
    saved critic, LoRA adapters on the meta base, an index of several files, uneven rows; a .bin checkpoint is
    loaded whole (the fallback), as it says."""
    out = tmp_path / "loading.json"
    # A process of its own: where a vLLM engine served an architecture before (the shared launch), vLLM has wrapped
    # transformers' model class in its compile decorator, and building it fails without a vLLM config (CI-like order).
    proc = torchrun(WORKERS / "loading_worker.py", tmp_path, out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    assert {case.split("/")[0] for case in r} == set(archs.ARCHS)
    assert {f"{a}/{kind}" for a in archs.ARCHS for kind in ("causal_lm", "reward")} <= r.keys()
    assert {f"{a}/critic" for a in archs.ARCHS if a != "olmo2"} <= r.keys()  # no OLMo 2 token classifier
    for case, found in r.items():
        assert found["differences"] == [], (case, found["differences"])
        # Built on the meta device (the .bin one excepted); at 2 ranks every parameter but a 1-row head is split.
        assert found["on_meta"] == (not case.endswith("/bin")), case
        assert found["sharded"] >= found["params"] - 2, case
    assert "qwen2_bin: its weights are not safetensors" in proc.stdout + proc.stderr
