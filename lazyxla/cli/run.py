"""``lazyxla run SCRIPT [ARGS...]``: run a torch_xla script unchanged, on lazyxla.

Installs the ``torch_xla`` names (``lazyxla.compat.install()``: ``import torch_xla`` and its
submodules give lazyxla's compatibility modules, in this process and in the processes it
spawns), then runs the script as ``python SCRIPT ARGS`` would (``cli.script.run_script``:
``__main__``, ``sys.argv``, the script's directory first on ``sys.path``) and exits with its
exit code. Every argument after SCRIPT is the script's. A nonexistent script is a one-line
error and exit code 2. Not under a launcher, it sets ``LOCAL_RANK=0`` (a world of one says its
local rank as torchrun would; HuggingFace's accelerate reads it there).

May touch: ``sys.meta_path`` (the torch_xla finder, for the rest of the process), ``LOCAL_RANK`` in
the environment, and whatever the user's script touches.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..engine import closures
from .. import compat
from ..config import env_str
from .script import run_script


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.usage = "lazyxla run SCRIPT [ARGS...]"
    p.add_argument("script", metavar="SCRIPT", help="the torch_xla script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's own arguments")


def run(args) -> int:
    """The ``lazyxla run`` subcommand; returns the script's exit code (2 for our own errors)."""
    if not os.path.exists(args.script):
        print(f"lazyxla run: error: no such script: {args.script}", file=sys.stderr)
        return 2
    compat.install()
    if not env_str("LOCAL_RANK").strip() and not env_str("RANK").strip():
        # not under a launcher: this process is a world of one, and says so as torchrun would
        # (accelerate reads its local rank only from here when the device is not a TPU)
        os.environ["LOCAL_RANK"] = "0"
    code = run_script(args.script, list(args.args))
    closures.wait_async_closures()
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 - a closed stdout is the script's business
        pass
    return code
