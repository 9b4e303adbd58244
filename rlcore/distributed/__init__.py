"""Distributed plumbing: the process groups and the mesh (parallel.py), agreeing on an error or a number across
ranks (collectives.py), and the watchdog that names the rank a stuck run waits for (watchdog.py)."""
