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
import sys

from ..debug import explain as debug_explain
from ..debug import fold_page
from .script import run_script


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

    code = run_script(args.script, script_args)
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
