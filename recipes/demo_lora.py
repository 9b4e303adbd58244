"""The demo with LoRA: GRPO teaches the tiny character-level Qwen2 to add by training rank-16 adapters
on its frozen weights (rlcore/lora.py), on 2 CPU ranks; the engine loads each new adapter (adapter sync).

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=demo_lora
    # the same run with merged sync (full W + (alpha/r) B A weights streamed into an engine without LoRA):
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 launch/train.py recipe=demo_lora lora.sync=merged

Everything else is the demo's (recipes/demo.py): model, data, reward, GRPO, steps. Prints held-out greedy
accuracy before and after; writes runs/demo_lora/, with PEFT adapter folders as exports (hf/step_<N>/).
"""
from pathlib import Path

from rlcore.cli import load_recipe
from rlcore.config import LoraConfig


def config():
    cfg = load_recipe("demo", Path(__file__).parent)
    cfg.name = "demo_lora"
    # r=16, alpha=32: the notes' defaults (/work/shared/notes/lora.md). The adapters train at 10 x the demo's
    # full fine-tuning LR (lora.lr_scale), the usual LoRA factor.
    cfg.lora = LoraConfig(enabled=True, rank=16, alpha=32.0, lr_scale=10.0)
    return cfg
