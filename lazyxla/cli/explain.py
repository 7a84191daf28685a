"""``lazyxla explain [--walk [--sync N|HASH]] [-o PAGE] SCRIPT [ARGS...] [-o PAGE]``: run a script,
write its fold page, or with ``--walk`` its code walk.

The script runs in this process under runpy as ``__main__`` with ``sys.argv = [SCRIPT, *ARGS]``;
whatever it compiled from its start until it ended (or raised) goes on the page
(``lazyxla.debug.explain``'s ``export()``, rendered by ``lazyxla.debug.fold_page``), and the
command exits with the script's exit code (1 for an uncaught exception, 130 for Ctrl-C). ``-o``
goes before SCRIPT, or last; the default page is ``fold.html``. A nonexistent script or page directory is a one-line error
and exit code 2.

``--walk`` records the run with ``lazyxla.debug.walk.Walker`` and writes the walk page
(``debug.walk_page``, default ``walk.html``) for one lookup: the last, or ``--sync N`` (the
N-th, 1-based; negative from the end) or ``--sync HASH`` (the last lookup of that graph hash,
or of a key starting with those hex digits).

May touch: ``sys.argv`` and ``sys.path[0]`` while the script runs (restored after), the page
file, and whatever the user's script touches.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

from ..debug import explain as debug_explain
from ..debug import fold_page, walk_page
from ..debug.walk import Walker, WalkSourceError
from ..ir.user_line import fmt_where
from .script import run_script


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.usage = "lazyxla explain [--walk [--sync N|HASH]] [-o PAGE] SCRIPT [ARGS...] [-o PAGE]"
    p.add_argument("-o", "--output", default=None, metavar="PAGE",
                   help="where to write the page (default fold.html, walk.html with --walk); before SCRIPT, "
                        "or as the last two arguments")
    p.add_argument("--walk", action="store_true",
                   help="write the code walk instead: one sync of the run through lazyxla's executor, stage by "
                        "stage, with its values and lazyxla's source")
    p.add_argument("--sync", default=None, metavar="N|HASH",
                   help="with --walk: the lookup to walk, by number (1-based; negative from the end) or graph hash "
                        "(a prefix will do); default the last")
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


def _pick(text):
    """``--sync``'s value: an int (the N-th lookup), a hex string (a graph hash), or ValueError."""
    if text is None:
        return None
    if re.fullmatch(r"-?[0-9]+", text) and len(text.lstrip("-")) < 8:
        n = int(text)
        if n == 0:
            raise ValueError("--sync counts from 1 (or from the end: -1 is the last)")
        return n
    if re.fullmatch(r"[0-9a-fA-F]{4,32}", text):
        return text.lower()
    raise ValueError(f"--sync takes a lookup number or a graph hash (4 to 32 hex digits), not {text!r}")


def run(args) -> int:
    """The ``lazyxla explain`` subcommand; returns the script's exit code (2 for our own errors)."""
    # -o before SCRIPT leaves every later argument to the script; otherwise a trailing -o is ours
    script_args, trailing = (list(args.args), None) if args.output else _split_trailing_output(args.args)
    out = trailing if trailing is not None else (args.output or ("walk.html" if args.walk else "fold.html"))
    if args.sync is not None and not args.walk:
        print("lazyxla explain: error: --sync picks the sync to walk; it needs --walk", file=sys.stderr)
        return 2
    try:
        pick = _pick(args.sync)
    except ValueError as e:
        print(f"lazyxla explain: error: {e}", file=sys.stderr)
        return 2
    if not os.path.exists(args.script):
        print(f"lazyxla explain: error: no such script: {args.script}", file=sys.stderr)
        return 2
    out_dir = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(out_dir):
        print(f"lazyxla explain: error: no such directory for the page: {out_dir}", file=sys.stderr)
        return 2

    if args.walk:
        return _walk(args.script, script_args, out, pick)
    since = debug_explain.mark()  # the page is the script's (called in a process that compiled before)
    code = run_script(args.script, script_args)
    _flush()
    data = debug_explain.export(since)
    data["meta"] = {"script": args.script, "argv": script_args, "exit_code": code}
    if not _write(fold_page.write, out, data):
        return code or 2
    n_rec = sum(1 for r in data["records"] if r.get("closest"))
    print(f"lazyxla explain: fold page: {os.path.abspath(out)} ({len(data['keys'])} keys, "
          f"{n_rec} recompiles explained)", file=sys.stderr)
    return code


def _walk(script, script_args, out, pick) -> int:
    """Run the script under the walk's recorder and write the walk page."""
    raised = []

    def on_error(e, where):
        at = f" at {fmt_where(where)}" if where else ""
        raised.append(f"{type(e).__name__}: {e}{at}")

    walker = Walker(pick).start()
    try:
        code = run_script(script, script_args, on_error=on_error, on_end=walker.stop)
    finally:
        walker.stop()
    _flush()
    error = raised[0] if raised else None
    try:
        data = walker.export(error=error)
    except WalkSourceError as e:
        print(f"lazyxla explain: error: {e}", file=sys.stderr)
        return code or 2
    data["meta"] = {"script": script, "argv": script_args, "exit_code": code, "error": error}
    if not _write(walk_page.write, out, data):
        return code or 2
    walked = data["walked"]
    said = (f"lookup {walked} of {len(data['lookups'])}" if walked is not None else
            f"nothing walked ({len(data['lookups'])} lookups)")
    print(f"lazyxla explain: code walk: {os.path.abspath(out)} ({said})", file=sys.stderr)
    return code


def _flush():
    """The script's output before ours (a closed or broken stdout is the script's business)."""
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001
        pass


def _write(write, out, data) -> bool:
    """Write a page with ``write(out, data)``; False, with a one-line error, if it cannot."""
    try:
        write(out, data)
        return True
    except OSError as e:
        print(f"lazyxla explain: error: cannot write {out}: {e}", file=sys.stderr)
        return False
