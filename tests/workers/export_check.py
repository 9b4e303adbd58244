"""Does a run's HF export score like its trainer, in transformers and in vLLM? (tests/test_archs.py)

    python tests/workers/export_check.py MODEL_DIR CHECKPOINT_DIR HF_DIR OUT_JSON

In one process, in this order: the trainer (FSDP2 policy, 1 rank, loaded from the checkpoint), then
transformers `from_pretrained(HF_DIR)`, then `vllm.LLM(model=HF_DIR)`, each scoring hf_logprobs.SEQUENCES;
also launch/convert.py's folder from the same checkpoint, which must hold the export's bytes. Writes the
largest differences from the trainer and the export's tensor names.
"""
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hf_logprobs import hf, trainer, vllm  # noqa: E402  (tests/workers is the script's directory)

from launch.convert import convert  # noqa: E402

model_dir, ckpt, hf_dir, out = sys.argv[1:]
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def max_diff(a, b) -> float:
    return max((torch.tensor(x) - torch.tensor(y)).abs().max().item() for x, y in zip(a, b))


ours = trainer(model_dir, ckpt)
in_transformers = hf(hf_dir)
with tempfile.TemporaryDirectory() as tmp:
    convert(Path(ckpt), Path(tmp) / "hf")
    converted = {f.name: f.read_bytes() for f in (Path(tmp) / "hf").glob("*.safetensors")}
exported = {f.name: f.read_bytes() for f in Path(hf_dir).glob("*.safetensors")}
in_vllm = vllm(hf_dir)

from safetensors import safe_open  # noqa: E402

with safe_open(str(Path(hf_dir) / "model.safetensors"), "pt") as f:
    names = sorted(f.keys())
json.dump({"hf_max_diff": max_diff(in_transformers, ours), "vllm_max_diff": max_diff(in_vllm, ours),
           "convert_same_bytes": converted == exported, "names": names}, open(out, "w"))
