"""The four models (actor, critic, reference, reward): loaded, sharded with FSDP2, their forwards (build.py, with
the LM head's fused logprobs in head_logprobs.py), LoRA (lora.py) and their weights in checkpoint format (weights.py)."""
