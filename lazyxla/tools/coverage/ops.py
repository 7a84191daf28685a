"""The core ATen op set (every ``torch.ops.aten`` overload tagged ``torch.Tag.core``) and how the
warm path handles each (``classify``): ``lowered``, ``composite``, ``decomposed`` or ``fallback``;
the ops that stay on the CPU on purpose, and why.

Touches nothing.
"""
from __future__ import annotations

import collections

import torch
from torch._ops import OpOverload

from ... import lowering
from ...frontend.ops import SPECIAL


aten = torch.ops.aten

CATEGORIES = ("lowered", "composite", "decomposed", "fallback")

# Ops that stay on the CPU on purpose, and why (docs/coverage.md says more).
DATA_DEPENDENT = {
    "nonzero": "output shape is the number of nonzero elements",
    "masked_select": "output shape is the number of true mask elements",
    "unique": "output shape is the number of distinct values",
    "_unique2": "output shape is the number of distinct values",
    "unique_dim": "output shape is the number of distinct values",
    "unique_consecutive": "output shape is the number of runs",
    "argwhere": "output shape is the number of nonzero elements",
    "index": "with a boolean mask (`x[m]`), output shape is the number of true mask elements; "
             "integer indexing is lowered",
}
INHERENT = {
    "_local_scalar_dense": "a value read (`.item()`): the value goes to the host by definition",
}
EXPECTED_FALLBACK = set(DATA_DEPENDENT) | set(INHERENT)


# ---------------------------------------------------------------------------------------
# The op set and its classification.
def core_ops() -> list:
    """Every core ATen overload (``torch.Tag.core``), sorted by name."""
    packets = sorted({n[len("aten::"):].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
                      if n.startswith("aten::")})
    out = []
    for name in packets:
        packet = getattr(aten, name, None)
        if packet is None:
            continue
        for ov in packet.overloads():
            op = getattr(packet, ov)
            if torch.Tag.core in op.tags:
                out.append(op)
    return out


def op_name(op: OpOverload) -> str:
    """``add.Tensor``, ``relu`` (the default overload without its suffix)."""
    s = op._schema
    base = s.name.split("::", 1)[1]
    return base + ("." + s.overload_name if s.overload_name else "")


def packet_name(op: OpOverload) -> str:
    return op._schema.name.split("::", 1)[1]


def classify(op: OpOverload):
    """``(category, note)`` for one op, following the warm path's order of preference."""
    name = packet_name(op)
    if op in SPECIAL:
        if name in INHERENT:
            return "fallback", INHERENT[name]
        return "lowered", "handled by lazyxla itself"
    writes = any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)
    target = lowering.functional_of(op) if writes else op
    if op in lowering.LOWERINGS or (target is not None and target in lowering.LOWERINGS):
        return "lowered", ""
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
        return "composite", ""
    if op in lowering.DECOMPOSITIONS or (target is not None and target in lowering.DECOMPOSITIONS):
        return "decomposed", ""
    return "fallback", DATA_DEPENDENT.get(name) or INHERENT.get(name, "")


def classification(ops=None) -> dict:
    """``{op: (category, note)}`` for ``ops`` (default: all core ops)."""
    return {op: classify(op) for op in (core_ops() if ops is None else ops)}


def counts(classes: dict) -> dict:
    c = collections.Counter(cat for cat, _ in classes.values())
    return {k: c.get(k, 0) for k in CATEGORIES}


def fallback_share(classes: dict) -> float:
    return counts(classes)["fallback"] / max(len(classes), 1)
