"""Running a user's script in this process as ``python SCRIPT ARGS`` would (``lazyxla explain``,
``lazyxla run``): ``run_script(script, argv)`` runs it under runpy as ``__main__`` with
``sys.argv = [SCRIPT, *ARGS]`` and the script's directory as ``sys.path[0]``, and returns its
exit code (``SystemExit``'s code; 1 with Python's traceback for an uncaught exception; 130 for
Ctrl-C).

May touch: ``sys.argv`` and ``sys.path[0]`` while the script runs (restored after), and whatever
the user's script touches.
"""
from __future__ import annotations

import os
import runpy
import sys
import traceback


def run_script(script, argv, on_error=None, on_end=None) -> int:
    """Run ``script`` as ``__main__`` like ``python SCRIPT ARGS``; return its exit code, with the
    traceback printed the way Python prints it for an uncaught exception. ``on_error(exc, where)``
    hears of that exception first (``where``: the script's innermost (file, line), or None);
    ``on_end()`` runs once the script ended, however it ended, while its globals still live."""
    script_abs = os.path.abspath(script)
    old_argv, old_path0 = sys.argv, (sys.path[0] if sys.path else None)
    sys.argv = [script, *argv]
    here = script_abs if os.path.isdir(script_abs) else os.path.dirname(script_abs)
    if sys.path:
        sys.path[0] = here
    else:
        sys.path.insert(0, here)
    try:
        scope = runpy.run_path(script, run_name="__main__")
        if on_end is not None:
            on_end()
        del scope
        return 0
    except SystemExit as e:
        if on_end is not None:
            on_end()
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except BaseException as e:  # noqa: BLE001 - the script's own error, reported like Python does
        tb = e.__traceback__
        t = tb
        while t is not None and os.path.abspath(t.tb_frame.f_code.co_filename) != script_abs:
            t = t.tb_next
        sys.stdout.flush()
        if on_end is not None:
            on_end()
        if on_error is not None:
            inner = None
            for fr, line in traceback.walk_tb(tb):
                if os.path.abspath(fr.f_code.co_filename) == script_abs:
                    inner = (script, line)
            on_error(e, inner)
        traceback.print_exception(type(e), e, t if t is not None else tb, file=sys.stderr)
        return 130 if isinstance(e, KeyboardInterrupt) else 1
    finally:
        sys.argv = old_argv
        if old_path0 is not None and sys.path:
            sys.path[0] = old_path0
