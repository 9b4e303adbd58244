"""What a warm process (entry_server.py, run_server.py) does around each run it takes in: the request's environment
and import path added, then everything put back, and the modules the run imported from its own files dropped."""
import contextlib
import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Where rlcore, its tests and every installed library live: modules from anywhere else are a run's own (a test's
# recipe or reward file in its tmp_path) and are dropped after it, never a library's.
OURS = (str(ROOT), sys.prefix, sys.base_prefix)


@contextlib.contextmanager
def isolated(env: dict, path: list):
    """`env` added to os.environ and `path` in front of sys.path for the block; environment, sys.path, sys.argv and
    the run's own modules as they were after it."""
    saved_env, saved_path, saved_argv, modules = dict(os.environ), list(sys.path), list(sys.argv), set(sys.modules)
    os.environ.update(env)
    sys.path[:0] = path
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:], sys.argv[:] = saved_path, saved_argv
        for name in set(sys.modules) - modules:
            file = getattr(sys.modules[name], "__file__", None) or ""
            if name.startswith("rlcore_recipe_") or (file and not file.startswith(OURS)):
                del sys.modules[name]


def exit_code(run) -> int:
    """run()'s exit code as a process's would be: its return value (0 for None), SystemExit's code, or a traceback
    and 1 for any other exception."""
    try:
        return run() or 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        return 1
