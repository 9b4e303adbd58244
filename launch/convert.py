"""Convert a saved checkpoint into an HF model folder (safetensors + config + tokenizer), in one process.

    python launch/convert.py runs/demo/checkpoints/step_60 runs/demo/hf/step_60
    python launch/convert.py runs/grpo/checkpoints/step_200 /models/grpo-200 --model critic

No torchrun and no GPU: the sharded checkpoint is read whole on CPU (it may have been saved on any
number of ranks). The result loads with transformers `from_pretrained` and vLLM `LLM(model=...)`, and
is byte-identical to what the run itself exported at that step (train.export_every). A LoRA run's
checkpoint holds adapters only: it converts to the same PEFT adapter folder the run exports.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a checkout runs without `pip install -e .`

from rlcore.config import LoraConfig  # noqa: E402
from rlcore.models import lora  # noqa: E402
from rlcore.outputs import checkpoint, export  # noqa: E402


def convert(ckpt: Path, out: Path, model: str = "policy") -> None:
    if not (ckpt / checkpoint.MARKER).is_file():
        raise ValueError(f"{ckpt} is not a complete checkpoint (no {checkpoint.MARKER})")
    weights = export.read_model(ckpt, model)
    if any(".lora_" in name for name in weights):  # a LoRA run saved its adapters only: a PEFT folder
        saved = json.loads((ckpt / checkpoint.MARKER).read_text())
        lo = LoraConfig(enabled=True, rank=saved["config"]["lora.rank"], alpha=saved["config"]["lora.alpha"],
                        targets=sorted(saved["config"]["lora.targets"]))
        error = export._write_adapter(out, weights, lora.peft_config(lo, saved["model_path"], lo.targets))
        if error:
            raise ValueError(error)
        return
    config = json.loads((ckpt / "model_files" / "config.json").read_text())
    if config.get("tie_word_embeddings"):
        weights.pop("lm_head.weight", None)  # one tensor under the embedding's name, as trained
    export.write_hf(out, export.checkpoint_format(weights, ckpt / "model_files"), ckpt / "model_files")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="a checkpoints/step_<N> directory")
    parser.add_argument("out", type=Path, help="the HF folder to write (replaced if it exists)")
    parser.add_argument("--model", default="policy", help="which trained model (policy, or critic with PPO)")
    args = parser.parse_args(argv)
    try:
        convert(args.checkpoint, args.out, args.model)
    except ValueError as e:
        print(f"rlcore: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
