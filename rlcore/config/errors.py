"""One line for an exception raised in user code (a recipe, reward, environment or prepare function).

rlcore reports every failure as one line naming the setting or file; when the cause is the user's own code,
that line also names the exception and where it was raised. RLCORE_DEBUG=1 prints the whole traceback
(launch/train.py), since every such error keeps its cause chained.
"""
from __future__ import annotations

import traceback


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def describe(e: BaseException) -> str:
    """'KeyError: boom (at my_rewards.py:12)': the exception and the innermost frame that raised it."""
    if isinstance(e, SyntaxError) and e.filename:  # raised by the parser: the place is the error's own
        return f"{type(e).__name__}: {e.msg} (at {e.filename.rsplit('/', 1)[-1]}:{e.lineno})"
    frames = traceback.extract_tb(e.__traceback__)
    at = f" (at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {one_line(e)}{at}"
