"""The ``lazyxla`` command line: ``python -m lazyxla <subcommand>`` or ``lazyxla <subcommand>``.

Subcommands live in ``SUBCOMMANDS``, a dict of name -> ``(add_arguments, handler, help)``:
``add_arguments(parser)`` declares the subcommand's options, ``handler(args)`` runs it and
returns an exit code (``None`` means 0), ``help`` is its one-line description. To add one,
write the two functions (a module of this package, or the module whose job the command is,
as ``tools.coverage``) and add an entry; ``main`` needs no change. Here: ``demo``
(``tools.demo``), ``explain`` (``cli.explain``), ``run`` (``cli.run``: a torch_xla script
unchanged), ``cache`` (``cli.cache``), ``profile`` (``cli.profile``) and ``coverage`` (``tools.coverage``). Importing this
package imports lazyxla (torch and JAX) anyway, so the subcommands' modules are imported up
front.

May touch: whatever the chosen subcommand touches; nothing itself.

The top floor: it may import anything of the package; only ``__main__`` imports it.
"""
from __future__ import annotations

import argparse

from ..tools import coverage, demo
from . import cache, explain, profile, run


# ---------------------------------------------------------------------------------------
# demo
def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epochs", type=int, default=4, help="training epochs (default 4)")
    p.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _demo(args: argparse.Namespace) -> int:
    demo.run(epochs=args.epochs, batch_size=args.batch_size, quiet=args.quiet)
    return 0


SUBCOMMANDS = {
    "demo": (_demo_arguments, _demo,
             "train a small CNN on scikit-learn's digits and report the compilation counts"),
    "explain": (explain.add_arguments, explain.run,
                "run SCRIPT [ARGS...] and write its fold page (-o PAGE): every compiled key, folded in R3's order"),
    "run": (run.add_arguments, run.run,
            "run a torch_xla script unchanged: SCRIPT [ARGS...], with import torch_xla giving lazyxla"),
    "cache": (cache.add_arguments, cache.run,
              "list (ls), summarize (stats) or empty (clear) a persistent compilation cache"),
    "profile": (profile.add_arguments, profile.run,
                "a trace's device time per step by the user's line, op kind and top op (lazyxla.debug.profiler)"),
    "coverage": (coverage.add_arguments, coverage.run,
                 "list PyTorch's core ATen ops: lowered, composite, decomposed or CPU fallback"),
}


# ---------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="lazyxla",
                                 description="lazyxla: torch_xla's lazy graph executor in Python")
    sub = ap.add_subparsers(dest="command", metavar="<command>")
    sub.required = True
    for name, (add_arguments, handler, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(_handler=handler)
    return ap


def main(argv=None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the subcommand, return its exit code."""
    args = build_parser().parse_args(argv)
    code = args._handler(args)
    return 0 if code is None else int(code)
