"""The two places where lazyxla reaches inside PyTorch's compiler stack (torch.compile).

``teach(LazyTensor)`` makes Dynamo and AOTAutograd take a lazy tensor for what it is to them: a
tensor on a device. Dynamo wraps only plain tensors and traceable wrapper subclasses as
tensors; a ``LazyTensor`` is neither (its ``__torch_dispatch__`` is the lazy path), so without
this Dynamo would trace into lazyxla's own Python. Two facts of torch 2.13, checked here:
Dynamo's table of wrappers by exact type (``VariableBuilder._type_dispatch``) gets
``LazyTensor`` -> the plain tensor wrapper, so inputs become fake tensors on the lazyxla
device; and AOTAutograd, which compares a tangent's type with the traced output's, is told
that a lazy tangent is the tensor it traced (``__coerce_same_metadata_as_tangent__``). And
lazyxla's and JAX's files join Dynamo's skip list (``trace_rules.add``), as PyTorch's own are.

Imported only when a backend is used: importing Dynamo costs about two seconds.
May touch: Dynamo's wrapper table, the LazyTensor class.
"""
from __future__ import annotations

import torch

CHECKED_TORCH = "2.13"


class DynamoInternalsChanged(RuntimeError):
    """This torch's Dynamo lacks what lazyxla's torch.compile backends rely on."""


def teach(cls) -> None:
    try:
        from torch._dynamo.variables.builder import VariableBuilder
        table = VariableBuilder._type_dispatch()
        plain = table[torch.Tensor]
    except (ImportError, AttributeError, KeyError, TypeError) as e:
        raise DynamoInternalsChanged(
            f"lazyxla's torch.compile backends were checked with torch {CHECKED_TORCH}; this torch "
            f"({torch.__version__}) has no VariableBuilder._type_dispatch table with torch.Tensor ({e})") from e
    table[cls] = plain
    cls.__coerce_same_metadata_as_tangent__ = _same_tangent
    # ... and a plain tensor to Dynamo's variables too: not a __torch_function__ subclass, whose
    # attributes (.grad) Dynamo refuses to trace
    from torch._dynamo.variables import builder
    infer = builder.infer_subclass_type
    if not getattr(infer, "_lazyxla", False):
        def infer_subclass_type(value):
            return None if type(value) is cls else infer(value)
        infer_subclass_type._lazyxla = True
        builder.infer_subclass_type = infer_subclass_type
    # lazyxla's own Python (reached from code Dynamo runs: a backward after a graph break, a
    # captured region's call) and JAX's are never Dynamo's to trace
    from torch._dynamo import trace_rules
    trace_rules.add("lazyxla")
    trace_rules.add("jax")


def _same_tangent(self, expected_metadata, expected_type=None):
    """AOTAutograd traced a plain tensor where this lazy tensor now is: it is that tensor."""
    return self
