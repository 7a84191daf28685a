"""torch_xla's debug output: ``PT_XLA_DEBUG_LEVEL`` compile and execution analysis.

Level 1 prints a block for each compile, level 2 also for each execution: the cause (a
user sync, or a value read), the graph's name, hash, number of inputs and outputs, and
the user's Python frames. ``PT_XLA_DEBUG_FILE`` appends the blocks to a file instead of
stderr; ``PT_XLA_DEBUG_MAX_FRAME`` (8) bounds the frames. ``PT_XLA_DEBUG=1`` alone means
level 100. At every sync with a level above 0, torch_xla's performance warnings are
printed when they apply (``pt-xla-profiler: CompileTime too frequent: ...`` after 10
steps with more than 0.5 compiles per step). Environment read once at import.

``Reporter`` is its subscriber (``events``). May touch: stderr or the debug file.
"""
from __future__ import annotations

import sys

from .. import metrics
from ..config import env_flag, env_int, env_str
from ..dynamic import describe
from ..ir.user_line import user_frames


def _level() -> int:
    lvl = env_int("PT_XLA_DEBUG_LEVEL", -1)
    if lvl == -1 and env_flag("PT_XLA_DEBUG", False):
        lvl = 100
    return lvl


LEVEL = _level()
FILE = env_str("PT_XLA_DEBUG_FILE")
MAX_FRAMES = env_int("PT_XLA_DEBUG_MAX_FRAME", 8)
RULE = "=" * 80
DASH = "-" * 80

CAUSES = {
    "sync": "user lazyxla.sync",
    "read": "most likely user code trying to access tensor value before lazyxla.sync",
    "capture": "a step captured for replay (lazyxla.graph, lazyxla.compile(replay=True))",
}


def _emit(text: str):
    if FILE:
        with open(FILE, "a") as f:
            f.write(text)
    else:
        sys.stderr.write(text)
        sys.stderr.flush()


def block(prefix: str, kind: str, cause: str, key_hex: str, n_inputs: int, n_outputs: int, frames,
          graph_name: str = "") -> str:
    p = f"{prefix}: "
    lines = ["", p + RULE, f"{p}{kind} Cause", f"{p}  {cause}", f"{p}Graph Info: "]
    if graph_name:
        lines.append(f"{p}  Graph Name: {graph_name}")
    lines += [f"{p}  Graph Hash: {key_hex}", f"{p}  Number of Graph Inputs: {n_inputs}",
              f"{p}  Number of Graph Outputs: {n_outputs}", f"{p}Python Frame Triggered Execution: "]
    for fn, line, func in frames[:MAX_FRAMES]:
        lines.append(f"{p}  {func} ({fn}:{line})")
    if len(frames) > MAX_FRAMES:
        lines.append(f"{p}  ..........")
    lines += [p + DASH, p + RULE, ""]
    return "\n".join(lines)


def _post_compilation(prog) -> str:
    try:
        m = prog.executable.memory_analysis()
        gb = lambda n: f"{n / 2 ** 30:.6f} GB"  # noqa: E731
        parts = [("Graph input size", m.argument_size_in_bytes), ("Graph output size", m.output_size_in_bytes),
                 ("Aliased Input size", m.alias_size_in_bytes), ("Intermediate tensor size", m.temp_size_in_bytes),
                 ("Compiled program size", m.generated_code_size_in_bytes)]
        body = "\n".join(f"Post Compilation Analysis: {k}: {gb(v)}" for k, v in parts)
    except Exception:  # noqa: BLE001 - memory analysis is optional per backend
        body = "Post Compilation Analysis: Graph input size: Unknown GB"
    return f"\nComputation hash: {prog.key.hex()}\n{body}\n"


class Reporter:
    """The subscriber that writes the blocks (subscribed only when the level is above 0)."""

    def after_lookup(self, cause, trace, prog, graph, compiled):
        frames = user_frames(64)
        if compiled:
            padded = prog.extra.get("dynamic")
            _emit(block("Compilation Analysis", "Compilation", CAUSES[cause], prog.key.hex(), len(graph.params),
                        len(graph.roots), frames, graph_name=f"padded ({padded})" if padded else ""))
            _emit(_post_compilation(prog))
        if LEVEL > 1:
            _emit(block("Execution Analysis", "Execution", CAUSES[cause], prog.key.hex(), len(graph.params),
                        len(graph.roots), frames))

    def after_capture(self, region, why, key_hex, where, n_ops):
        _emit(block("Compilation Analysis", "torch.compile region traced",
                    f"dynamo is compiling a FX graph to HLO ({why})", key_hex, 0, 0, user_frames(64),
                    graph_name=f"{region} ({n_ops} ops)"))

    def dynamic(self, kind, *info):
        _emit(f"\nDynamic Shape Analysis: {describe(kind, *info)}\n")

    def after_step(self):
        lines = metrics.performance_report()
        if lines:
            _emit("\n".join(lines) + "\n")
