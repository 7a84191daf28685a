"""A rolled loop: what lowering receives in place of a repeated layer's copies.

Touches nothing.
"""
from __future__ import annotations

import jax

from ..xla.client import jnp_dtype
from ..lowering import program
from ..lowering.rolled import lower_loop, stack_buffers


class Loop:
    """One rolled loop: ``roles`` (iteration 0's nodes, in post-order, the template that is
    lowered), ``iters[k][j]`` the node of role ``j`` in iteration ``k``, ``out_role`` the role
    whose value is the next iteration's carry, ``carry_in`` the first iteration's carry (a
    node outside the loop), ``operands[j]`` each role's operands as ("carry", i) / ("role", j, i)
    / ("in", slot), ``slots[s]`` the loop's inputs: ("shared", (node, i)) or ("rows", [(node, i)
    per iteration]) or ("carry", (node, i), (role, i)): one more carry, its first value from
    outside, the next the role's; ``outputs`` the (role, output index) pairs stacked for use
    outside."""

    __slots__ = ("roles", "iters", "out_role", "carry_in", "operands", "slots", "outputs", "members")

    def __init__(self, roles, iters, out_role, carry_in, operands, slots, outputs):
        self.roles = roles
        self.iters = iters
        self.out_role = out_role
        self.carry_in = carry_in
        self.operands = operands
        self.slots = slots
        self.outputs = outputs
        self.members = {id(n): (k, j) for k, it in enumerate(iters) for j, n in enumerate(it)}

    data = None  # never a device-data leaf (build_program's filter asks)

    def workspace(self):
        """The abstract values of the buffers its stacked outputs are written into, where the
        platform keeps them in the program's workspace (``lowering.rolled.STACK_BUFFERS``)."""
        if stack_buffers(program.platform()) != "workspace":
            return []
        n = len(self.iters)
        return [jax.ShapeDtypeStruct((n,) + tuple(m.shape), jnp_dtype(m.dtype))
                for m in (self.roles[j].sig.outs[i] for j, i in self.outputs)]

    def lower_into(self, env):
        """Lower the loop inside the program being traced: reads its inputs from ``env`` and
        puts every copy's value that is used outside in it."""
        lower_loop(self, env)

    def __repr__(self):
        return f"<Loop {len(self.iters)} x {len(self.roles)} ops>"
