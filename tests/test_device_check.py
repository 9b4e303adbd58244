"""benchmarks/device_check.py (the trainer side on one GPU, without vLLM) at its tiny size on CPU, so the script the
GPU machine runs cannot rot: every part runs, its numbers land in the JSON, its checks pass, and it imports no vLLM."""
import importlib.util
import json
import os
import subprocess
import sys

import torch

from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "device_check.py"
# The script run with vLLM unimportable: any import of it (by rlcore or by the script) fails the run.
WITHOUT_VLLM = ("import runpy, sys; sys.modules['vllm'] = None; sys.argv = sys.argv[1:]; "
                "runpy.run_path(sys.argv[0], run_name='__main__')")


def load_script():
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_the_tiny_size_runs_every_part_on_cpu_without_vllm(tmp_path):
    out = tmp_path / "device_check.json"
    proc = subprocess.run([sys.executable, "-c", WITHOUT_VLLM, str(SCRIPT), "--size", "tiny", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=os.environ | {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "all checks passed" in proc.stdout
    result = json.loads(out.read_text())
    assert result["ok"] and result["device"] == "cpu"
    r = result["models"]["tiny"]
    assert set(r["seconds"]) == {"a. build", "b. update", "f. memory", "c. chunking", "d. packing", "e. gather"}
    u = r["update"]
    assert u["tokens_per_s"] > 0 and u["steps_applied"] == u["steps"] == 3 and u["mfu"] is None
    for part in ("chunking", "packing"):
        assert 0 < r[part]["bound"] < 1 and r[part]["max_abs_diff"] <= r[part]["bound"], (part, r[part])
    for path in ("sync", "export"):
        g = r["gather"][path]
        assert g["equal"] is True and g["tensors"] == 26 and not (g["missing"] or g["extra"] or g["mismatched"])
    assert (r["gather"]["sync"]["dtype"], r["gather"]["export"]["dtype"]) == ("torch.bfloat16", "float32")
    assert r["memory"]["plan_train_gb"] > 0 and r["memory"]["measured_over_plan"] is None  # no comparison on CPU
    assert len(result["checks"]) == 5 and all(c["ok"] for c in result["checks"])


def test_the_gather_compare_sees_one_bit_a_name_and_a_dtype():
    dc = load_script()
    saved = {"a": torch.arange(4, dtype=torch.float32), "b": torch.ones(2, dtype=torch.bfloat16)}
    assert dc.compare(dict(saved), saved)["equal"]
    flipped = saved["a"].clone()
    flipped.view(torch.int32)[1] ^= 1  # the lowest mantissa bit of 1.0
    assert dc.compare(saved | {"a": flipped}, saved)["mismatched"] == ["a"]
    assert dc.compare(saved | {"b": saved["b"].float()}, saved)["mismatched"] == ["b"]
    renamed = dc.compare({"a": saved["a"], "c": saved["b"]}, saved)
    assert (renamed["missing"], renamed["extra"], renamed["equal"]) == (["b"], ["c"], False)


def test_the_logprob_bounds_are_their_formulas():
    dc = load_script()
    eps16, eps32 = 2.0 ** -7, 2.0 ** -23
    assert dc.chunk_bound(torch.bfloat16, 151936, 4.0, 1.0) == (2 * eps16 + 151936 ** 0.5 * eps32) * 4.0
    # 28 layers: R = 16 * 28 + 2 = 450 roundings on a logit's path
    assert dc.packing_bound(torch.bfloat16, 28, 151936, 1024, 4.0, 0.5) == \
        (2 * 450 ** 0.5 * eps16 + (1024 + 151936) ** 0.5 * eps32) * 4.0 / 0.5
