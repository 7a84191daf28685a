"""torch.compile backends: ``lazyxla`` (training, through AOTAutograd) and ``lazyxla_eval``
(inference, the graph as Dynamo captured it), torch_xla's ``openxla`` and ``openxla_eval``.

Each graph Dynamo hands over becomes a ``capture.Region``: traced once on the lazy device and
then recorded as one IR node per call, so a step made of compiled regions and lazily recorded
ops (a backward outside the compiled function, an optimizer step) runs as one program at
``lazyxla.sync()``. The names resolve through PyTorch's ``torch_dynamo_backends`` entry point
(this package's metadata): Dynamo imports this module the first time one is asked for.

Importing this module imports Dynamo (about two seconds); ``import lazyxla`` does not.
May touch: Dynamo's backend registry and wrapper table (``dynamo_internals``).
"""
from __future__ import annotations

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_compiler

from . import dynamo_internals
from .region import Region
from ..frontend.device import DEVICE
from ..errors import LazyXlaError
from ..frontend.tensor import LazyTensor

dynamo_internals.teach(LazyTensor)


def _check_devices(name, example_inputs):
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor) and x.device.type != DEVICE.type and not (x.device.type == "cpu" and x.dim() == 0):
            raise LazyXlaError(
                f"torch.compile(backend={name!r}): graph input {i} is on {x.device}, not on {DEVICE} "
                f"(shape {list(x.shape)}, {x.dtype}); move the model and its inputs with .to(lazyxla.device())")


_SEEN_FAILURES: dict = {}  # code object -> how many of Dynamo's guard failures were already told


def _why() -> str:
    """Why Dynamo is compiling now: the guard failures it noted since the last compile (a
    recompile: a new batch size, a new dtype, ...), or a first compile."""
    from torch._dynamo.utils import guard_failures
    new = []
    for code, reasons in list(guard_failures.items()):
        seen = _SEEN_FAILURES.get(code, 0)
        if len(reasons) > seen:
            new += [f"{code.co_name} ({code.co_filename}:{code.co_firstlineno}): {r}" for r in reasons[seen:]]
            _SEEN_FAILURES[code] = len(reasons)
    return "Dynamo recompiled, a guard failed: " + "; ".join(new) if new else "first trace"


def lazyxla_eval(gm: torch.fx.GraphModule, example_inputs):
    """Inference: the graph as Dynamo captured it, as one region."""
    _check_devices("lazyxla_eval", example_inputs)
    return Region(gm, "lazyxla_eval", keeps_aliases=True, why=_why())


def _aot_compiler(kind):
    def compile_graph(gm, example_inputs):
        _check_devices("lazyxla", example_inputs)
        return Region(gm, kind, keeps_aliases=False, why=_why())
    return make_boxed_compiler(compile_graph)


# Training: AOTAutograd splits forward and backward into two ATen graphs, each a region.
# A graph without autograd (an optimizer step) keeps its writes to its inputs: the region node
# gives the new values, instead of one copy_ per written tensor recorded after each call.
lazyxla = aot_autograd(fw_compiler=_aot_compiler("lazyxla forward"), bw_compiler=_aot_compiler("lazyxla backward"),
                       inference_compiler=_aot_compiler("lazyxla inference"), keep_inference_input_mutations=True)
