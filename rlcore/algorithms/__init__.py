"""One module per RL algorithm; a recipe imports the one it uses. This package imports none of them."""
