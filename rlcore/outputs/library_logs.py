"""Other libraries' logs: their errors only, by default, so that a run's first screen is rlcore's.

vLLM, torch, transformers and datasets print notes meant for their own developers at startup (Triton without a
CPU backend, NUMA binding, tcmalloc not preloaded, chunked prefill disabled, deprecations, a progress bar per
checkpoint load): ~30 lines on the CPU demo, before rlcore's layout line, that a newcomer reads as something
wrong. Hidden: those libraries' info lines, warnings, progress bars and deprecation notices; never an error or
an exception of theirs, nor anything rlcore prints. `logging.library_logs=true` (config key) or
`RLCORE_LIBRARY_LOGS=1` (environment) brings back their warnings, deprecation notices and bars, for debugging. A level the user set in a library's own
variable (VLLM_LOGGING_LEVEL, TORCH_CPP_LOG_LEVEL, TRANSFORMERS_VERBOSITY) is kept as set.

launch/train.py calls `before_imports(argv)` before it imports torch (torch reads its C++ log level once, at
import), then `apply(cfg.logging.library_logs)` once the config is known, before any engine imports vLLM.
"""
from __future__ import annotations

import logging
import os
import sys
import warnings

ENV = "RLCORE_LIBRARY_LOGS"
KEY = "logging.library_logs"
# Each library's own switch, read when it is imported, and its level when rlcore keeps errors only.
QUIET_ENV = {"TORCH_CPP_LOG_LEVEL": "ERROR", "VLLM_LOGGING_LEVEL": "ERROR", "TRANSFORMERS_VERBOSITY": "error"}
# Shown: warnings, as without rlcore. vLLM's INFO logs every weight reload and cache reset (VLLM_LOGGING_LEVEL=INFO).
LOUD_ENV = {"TORCH_CPP_LOG_LEVEL": "WARNING", "VLLM_LOGGING_LEVEL": "WARNING", "TRANSFORMERS_VERBOSITY": "warning"}
LOGGERS = ("vllm", "transformers", "datasets", "huggingface_hub", "torch")
# Deprecation notices raised from inside these packages are addressed to rlcore's developers, not its users.
DEPRECATIONS_FROM = r"(vllm|transformers|datasets|huggingface_hub|torch|torchdata)(\.|$)"
_TRUE = {"true", "yes", "1"}
# The variables the user set before rlcore touched them: those are never overwritten.
_users_own = {name for name in QUIET_ENV if name in os.environ}


def wanted(argv: list[str]) -> bool:
    """Before the config exists: the environment variable, or the key given on the command line."""
    given = [a.partition("=")[2] for a in argv if a.startswith(KEY + "=")]
    return os.environ.get(ENV, "").lower() in _TRUE or bool(given) and given[-1].lower() in _TRUE


def before_imports(argv: list[str]) -> None:
    """Set the switches the libraries read at import. Torch's C++ warnings (e.g. NUMA binding) follow the
    environment variable or the key on the command line only: a recipe's value comes after torch loaded."""
    _set_env(LOUD_ENV if wanted(argv) else QUIET_ENV)


def apply(library_logs: bool) -> None:
    """The run's choice (its config key, or the environment variable), for everything not yet fixed: the
    loggers, vLLM's level at its import and its checkpoint-loading bar, datasets' bars, deprecations."""
    loud = library_logs or os.environ.get(ENV, "").lower() in _TRUE
    _set_env({k: v for k, v in (LOUD_ENV if loud else QUIET_ENV).items() if k != "TORCH_CPP_LOG_LEVEL"})
    # NOTSET: a logger's default again (its parent's level). vLLM and transformers have a variable of their own,
    # which now holds the level: the user's, or the one chosen here.
    levels = dict.fromkeys(LOGGERS, logging.NOTSET if loud else logging.ERROR) | {
        "vllm": os.environ["VLLM_LOGGING_LEVEL"].upper(), "transformers": os.environ["TRANSFORMERS_VERBOSITY"].upper()}
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    for category in (FutureWarning, DeprecationWarning):
        if loud:
            warnings.filters[:] = [f for f in warnings.filters if not (
                f[0] == "ignore" and f[2] is category and getattr(f[3], "pattern", None) == DEPRECATIONS_FROM)]
        else:
            warnings.filterwarnings("ignore", category=category, module=DEPRECATIONS_FROM)
    if "datasets" in sys.modules:
        from datasets.utils import disable_progress_bars, enable_progress_bars
        (enable_progress_bars if loud else disable_progress_bars)()


def _set_env(values: dict[str, str]) -> None:
    for name, value in values.items():
        if name not in _users_own:
            os.environ[name] = value
