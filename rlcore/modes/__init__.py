"""Who generates, who trains, and where they meet: the step skeleton every mode fills in (loop.py), colocated,
the split mesh (split.py) and streaming (stream/), over the exchange split and streaming share (transfer.py)."""
