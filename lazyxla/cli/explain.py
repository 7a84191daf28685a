"""``lazyxla explain [-o PAGE] SCRIPT [ARGS...] [-o PAGE]``: run a script, write its fold page.

The script runs in this process under runpy as ``__main__`` with ``sys.argv = [SCRIPT, *ARGS]``;
whatever it compiled before it ended (or raised) goes on the page (``lazyxla.debug.explain``'s
``export()``, rendered by ``lazyxla.debug.fold_page``), and the command exits with the script's
exit code (1 for an uncaught exception, 130 for Ctrl-C). ``-o`` goes before SCRIPT, or last;
the default page is ``fold.html``. A nonexistent script or page directory is a one-line error
and exit code 2.

May touch: ``sys.argv`` and ``sys.path[0]`` while the script runs (restored after), the page
file, and whatever the user's script touches.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback

from ..debug import explain as debug_explain
from ..debug import fold_page


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.usage = "lazyxla explain [-o PAGE] SCRIPT [ARGS...] [-o PAGE]"
    p.add_argument("-o", "--output", default=None, metavar="PAGE",
                   help="where to write the page (default fold.html); before SCRIPT, or as the last two "
                        "arguments")
    p.add_argument("script", metavar="SCRIPT", help="the Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments")


def _split_trailing_output(args):
    """``[..., "-o", PAGE]`` (or ``--output PAGE``, ``-oPAGE``, ``--output=PAGE``) at the end of
    the script's arguments belongs to lazyxla explain: (script args, PAGE or None)."""
    rest = list(args)
    if len(rest) >= 2 and rest[-2] in ("-o", "--output"):
        return rest[:-2], rest[-1]
    if rest and rest[-1].startswith("--output="):
        return rest[:-1], rest[-1][len("--output="):]
    if rest and rest[-1].startswith("-o") and len(rest[-1]) > 2 and not rest[-1].startswith("--"):
        return rest[:-1], rest[-1][2:]
    return rest, None


def _run_script(script, argv) -> int:
    """Run ``script`` as ``__main__`` like ``python SCRIPT ARGS``; return its exit code, with the
    traceback printed the way Python prints it for an uncaught exception."""
    script_abs = os.path.abspath(script)
    old_argv, old_path0 = sys.argv, (sys.path[0] if sys.path else None)
    sys.argv = [script, *argv]
    here = script_abs if os.path.isdir(script_abs) else os.path.dirname(script_abs)
    if sys.path:
        sys.path[0] = here
    else:
        sys.path.insert(0, here)
    try:
        runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as e:
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
        traceback.print_exception(type(e), e, t if t is not None else tb, file=sys.stderr)
        return 130 if isinstance(e, KeyboardInterrupt) else 1
    finally:
        sys.argv = old_argv
        if old_path0 is not None and sys.path:
            sys.path[0] = old_path0


def run(args) -> int:
    """The ``lazyxla explain`` subcommand; returns the script's exit code (2 for our own errors)."""
    # -o before SCRIPT leaves every later argument to the script; otherwise a trailing -o is ours
    script_args, trailing = (list(args.args), None) if args.output else _split_trailing_output(args.args)
    out = trailing if trailing is not None else (args.output or "fold.html")
    if not os.path.exists(args.script):
        print(f"lazyxla explain: error: no such script: {args.script}", file=sys.stderr)
        return 2
    out_dir = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(out_dir):
        print(f"lazyxla explain: error: no such directory for the page: {out_dir}", file=sys.stderr)
        return 2

    code = _run_script(args.script, script_args)
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001
        pass
    data = debug_explain.export()
    data["meta"] = {"script": args.script, "argv": script_args, "exit_code": code}
    try:
        fold_page.write(out, data)
    except OSError as e:
        print(f"lazyxla explain: error: cannot write {out}: {e}", file=sys.stderr)
        return code or 2
    n_rec = sum(1 for r in data["records"] if r.get("closest"))
    print(f"lazyxla explain: fold page: {os.path.abspath(out)} ({len(data['keys'])} keys, "
          f"{n_rec} recompiles explained)", file=sys.stderr)
    return code
