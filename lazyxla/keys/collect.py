"""Collect and order: the pending IR below a set of roots, as one lookup needs it.

A ``Graph`` holds the roots (IR values), their post-order (operands before users, each node
once; ``ir.post_order``), the program's parameters (the distinct device-data leaves, in
post-order) and the parameter sequence: for every use of a device-data leaf by an op node
(op nodes in post-order, operands in order), the index of the parameter it binds. Leaves
hash only shape and dtype (R1.4), so the sequence is what tells ``x - y + x`` from
``x - y + y`` (R3 step 4).

Touches nothing but the Graph it makes.
"""
from __future__ import annotations

from ..ir.node import post_order


class Graph:
    __slots__ = ("roots", "post", "params", "sequence", "rolled")

    def __init__(self, roots):
        self.roots = roots
        self.rolled = None  # ((post-order with its layers rolled, workspace), ns it took): ``compiler.rolled``, once asked
        post = post_order(roots)
        self.post = post
        params, seq, index = [], [], {}
        for n in post:
            d = n.data
            if d is not None:
                if id(d) not in index:
                    index[id(d)] = len(params)
                    params.append(n)
                continue
            for o, _ in n.operands:
                od = o.data
                if od is not None:
                    seq.append(index[id(od)])
        self.params = params
        self.sequence = seq

    @property
    def n_ops(self) -> int:
        """How many op nodes (not device data) the graph has."""
        return sum(1 for n in self.post if n.data is None)
