"""One module per RL algorithm; a recipe imports the one it uses. This package imports none of them.
base.py is the contract they meet (the flags and hooks the trainer uses, with their defaults)."""
