"""rlcore: RL post-training for LLMs in pure PyTorch (FSDP2 training + colocated vLLM rollout)."""
