"""Tensors kept as the rows of one device buffer: made, and recognized again.

A group of same-shaped tensors the optimizer's step updates together (the moments of all the
layers' ``fc1.weight``, and with ``param_stacks`` the parameters themselves) lives as one buffer
``[L, *shape]``; each tensor is a view of its row (``select(stack, 0, k)``: one view node per
read, never a node with every row as an output), so users see the same tensors and a program
takes the whole buffer as one operand and writes it as one output. ``stack_of`` says whether
tensors are, right now, the rows of one such buffer in order (a tensor given another value
with ``.data =`` or ``set_`` is no longer a row, and its group is stepped one by one).

May touch: the stacked tensors' states (they become views of the new buffer), the arena's
storages, metrics counters.
"""
from __future__ import annotations

import weakref

import torch

from .. import metrics
from ..frontend import ops
from ..run import storage
from ..frontend.tensor import LazyTensor, _tensor
from ..xla.client import download

aten = torch.ops.aten

# a stack's storage -> the view chain of each row, by row, and id(chain) -> its row (a member is
# row k while its state has this storage and exactly this chain object)
_ROWS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def stack_of(members):
    """The storage these tensors are the rows of, in order, or None."""
    s0 = members[0]._state
    st = s0.storage
    rows = _ROWS.get(st)
    if rows is None or len(rows[0]) != len(members):
        return None
    for t, chain in zip(members, rows[0]):
        s = t._state
        if s.storage is not st or s.chain is not chain:
            return None
    return st


def row_of(t):
    """(storage, k, rows) when tensor ``t`` is row ``k`` of a stack of ``rows`` made here, else
    None (run for every parameter of every fused step: a lookup, no search)."""
    s = t._state
    rows = _ROWS.get(s.storage)
    if rows is None:
        return None
    k = rows[1].get(id(s.chain))
    return None if k is None or rows[0][k] is not s.chain else (s.storage, k, len(rows[0]))


def can_stack(members, aliased, pending=False) -> bool:
    """Whether these tensors can become rows of one stack: lazy tensors of one meta, not sharded,
    sharing their storage with no other live tensor (``aliased``: a write to one would no longer
    reach the other); for ``stack`` also device data and not views, for ``stack_pending``
    (``pending``: a step's gradients, the stack computed by the program) any value."""
    m0 = members[0]._state.meta
    for t in members:
        s = t._state
        st = s.storage
        if type(t) is not LazyTensor or st.sharding is not None or s.meta != m0 or id(st) in aliased:
            return False
        if not pending and (s.chain is not None or st.data is None):
            return False
    return True


def stack(members, counter):
    """Make the tensors the rows of one new buffer holding their values (read back, stacked on
    the host, sent as one buffer); returns its storage. Counts ``counter`` once per member."""
    hosts = download([t._state.storage.data for t in members], [t._state.meta.dtype for t in members])
    return _rows_of(_tensor(storage.upload(torch.stack(hosts))), members, counter)


def _rows_of(whole, members, counter):
    """Make each member a view of its row of ``whole``; returns the stack's storage. Each row
    keeps a storage of its own (``untyped_storage``, made when first asked: tied tensors are
    told apart by it). Counts ``counter`` once per member."""
    rows = []
    for k, t in enumerate(members):
        ops.become(t, aten.select.int(whole, 0, k))
        rows.append(t._state.chain)
    st = whole._state.storage
    _ROWS[st] = (tuple(rows), {id(c): k for k, c in enumerate(rows)})
    st.untyped = dict.fromkeys([id(c) for c in rows] + [None])
    metrics.counter_inc(counter, len(members))
    return st


def stack_pending(members, counter):
    """Make the tensors the rows of one new stack computed by the program (``aten::stack`` of
    their values: nothing read or sent); returns its storage. The program then writes the
    stack as one output where it wrote each tensor (a replay hands out one buffer). Counts
    ``counter`` once per member."""
    return _rows_of(torch.stack(members), members, counter)


def aliased(tensor_lists) -> set:
    """Ids of the storages of these tensors that another live tensor shares (an alias a stack
    would leave behind)."""
    mine = {id(t._state.storage) for ts in tensor_lists for t in ts}
    seen, out = set(), set()
    for s in storage.live_states():
        k = id(s.storage)
        if k in mine:
            if k in seen:
                out.add(k)
            seen.add(k)
    return out
