"""Before anything loads: the launch plan's per-GPU memory bars (plan.py, plan_render.py) from a model's shapes
(shapes.py), and every cheap check of the config and its files, one line and exit 2 on bad input (checks.py)."""
