"""The training stage: the trainer's forwards (forward.py), the logprobs stage with the drift check and the
advantages (logprobs.py), the update (update.py) and its token-budget micro-batches (packing.py)."""
