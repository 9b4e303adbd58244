"""What the benchmarks share: the machine line, a RESULTS.md section, medians, and random-init models by size.

Models are random-init Qwen2 with the demo's character tokenizer (rlcore.tasks.tiny), built once into
$RLCORE_CACHE/bench-<size> (local; nothing is downloaded). `vocab` widens the vocabulary (to measure logits
memory at a real vocabulary size); the extra ids are never produced by the tokenizer.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"

# name -> (hidden, layers, heads, kv heads, intermediate); head_dim 64 except the demo-sized shape.
SIZES = {
    "0.3M": (128, 2, 4, 2, 256),
    "3M": (256, 4, 4, 2, 704),
    "10M": (384, 6, 6, 2, 1024),
    "25M": (512, 8, 8, 4, 1408),
    "50M": (640, 11, 10, 2, 1792),
}


def machine() -> str:
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    line = f"{platform.machine()} {cpu}, {len(os.sched_getaffinity(0))} cores, {platform.system()} {platform.release()}"
    try:
        import torch
        line += f", torch {torch.__version__}"
        if torch.cuda.is_available():
            line += f", {torch.cuda.device_count()} x {torch.cuda.get_device_name()}"
    except ImportError:
        pass
    return line


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def write_section(title: str, command: str, lines: list[str]) -> str:
    """Append `## title (date)` with the machine and the command to RESULTS.md; returns the text."""
    text = "\n".join([f"## {title} ({time.strftime('%Y-%m-%d')})", "", f"Machine: {machine()}",
                      f"Command: `{command}`", "", *lines, ""])
    with open(RESULTS, "a") as f:
        f.write("\n" + text)
    print(text, flush=True)
    return text


def model_shape(size: str, vocab: int | None = None, max_positions: int = 1024):
    from transformers import Qwen2Config

    from rlcore.tasks import tiny
    if size not in SIZES:
        raise ValueError(f"unknown benchmark model size {size!r}; valid: {', '.join(SIZES)}")
    hidden, layers, heads, kv, inter = SIZES[size]
    return Qwen2Config(vocab_size=vocab or tiny.VOCAB_SIZE, hidden_size=hidden, intermediate_size=inter,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                       head_dim=hidden // heads, max_position_embeddings=max_positions, tie_word_embeddings=False,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0)


def random_model(size: str, vocab: int | None = None, max_positions: int = 1024, seed: int = 0) -> Path:
    """A random-init Qwen2 of `size` with the tiny tokenizer, built once (atomically) into the rlcore cache."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcore.tasks import tiny
    config = model_shape(size, vocab, max_positions)

    def build(out: Path) -> None:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
        tiny._save(model, out)
        count = sum(p.numel() for p in model.parameters())
        (out / "meta.json").write_text(f'{{"params": {count}, "size": "{size}"}}\n')

    return tiny.prepare_cached(f"bench-{size}-v{config.vocab_size}-p{max_positions}-s{seed}", build)


def param_count(model_dir: Path) -> int:
    import json
    return json.loads((Path(model_dir) / "meta.json").read_text())["params"]
