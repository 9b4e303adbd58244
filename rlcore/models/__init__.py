"""The four models (actor, critic, reference, reward): loaded (build.py; each rank its shards only: load.py),
sharded with FSDP2, their forwards (head_logprobs.py: the fused LM head), LoRA (lora.py), weights as saved (weights.py)."""
