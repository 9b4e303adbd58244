"""rollout.seeds: per-request seeds make a sample independent of what runs beside it; the engine's generator
(reseeded per call) reproduces the same call but not the same prompt in other company (benchmarks/sampler.py
measures what each costs)."""
import json

import pytest

from conftest import WORKERS, torchrun_warm

pytestmark = pytest.mark.slow  # a real vLLM engine


def test_what_each_seed_setting_guarantees(tiny_models, tmp_path):
    out = tmp_path / "seeds.json"
    proc = torchrun_warm(WORKERS / "seeds_worker.py", tiny_models["qwen2"], out, nproc=1)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    for mode in ("request", "engine"):
        assert r[mode]["rerun_same"] and not r[mode]["other_seed_same"], r
        assert r[mode]["distinct_samples"] > 1  # the 8 samples of a request differ: there is noise to reproduce
    assert r["request"]["beside_same"]  # a sample does not depend on the batch it is in
    assert not r["engine"]["beside_same"]  # with the engine's generator it does
    # The reseed does not leak into the caller's (the trainer's) RNG stream. (With request seeds vLLM itself advances
    # the process's generator, the same way on every run: that is how it was before this setting existed.)
    assert r["engine"]["rng_untouched"] and not r["request"]["rng_untouched"]
