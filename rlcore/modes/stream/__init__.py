"""Streaming (rollout.stream=true): the engines never drain (engine_side.py); the trainers take batches and send
versions (trainer_side.py); trajectories span versions (turns.py), and so do agents (agents.py)."""
