"""Model-written Python, sandboxed: a warm pool per rank (pool.py), each worker a supervisor (worker.py, stdlib only)
that forks every call from a zygote (zygote.py) into fresh namespaces. docs/sandbox.md says what it protects."""
from rlcore.config.sections import SandboxConfig
from rlcore.sandbox.pool import Result, Sandbox, configure, shared

__all__ = ["Result", "Sandbox", "SandboxConfig", "configure", "shared"]
