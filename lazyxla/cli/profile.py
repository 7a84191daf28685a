"""``lazyxla profile LOG_DIR [--top 15]``: a trace's device time per step, by the user's line, by
op kind and the top ops, each op named with the ATen op and the Python line that recorded it.

LOG_DIR is what ``lazyxla.debug.profiler.start_trace(LOG_DIR)`` ... ``stop_trace()`` wrote
(torch_xla's ``torch_xla.debug.profiler`` names), on a TPU, a GPU or the CPU (``debug.profile``
reads both kinds of trace). Touches nothing: reads the trace and the programs' text.
"""
from __future__ import annotations

import argparse
import sys

from ..debug import profile


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("log_dir", help="the directory lazyxla.debug.profiler.start_trace wrote into")
    p.add_argument("--top", type=int, default=15, help="rows per table (default 15)")


def run(args: argparse.Namespace) -> int:
    try:
        p = profile.read(args.log_dir)
    except FileNotFoundError as e:
        print(f"lazyxla profile: {e}", file=sys.stderr)
        return 2
    print(profile.report(p, args.top))
    return 0
