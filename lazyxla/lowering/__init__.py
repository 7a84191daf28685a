"""Lowerings: ATen ops as JAX functions, and the program built from a post-order.

A lowering is ``fn(sig, *args, **kwargs)``: ``args``/``kwargs`` are the op call as PyTorch
made it, with every tensor (and every scalar that became device data) replaced by a JAX
value; ``sig`` is the node's ``OpSig`` (``sig.outs``: output metas from PyTorch's own
shape rules; ``sig.cdtype``: PyTorch's promoted dtype of the inputs). It returns one JAX
array or a tuple, one per output; results are cast to the output dtypes afterwards.
Random ops receive the step's seed (int64) as ``__seed__``.

``build_program`` turns a post-order into one Python function of the parameters, which
``executor`` hands to ``jax.jit`` to lower and compile.

Families live in submodules (``elementwise``, ``reduce``, ``shape``, ``nn``, ``random``,
``factory``); each registers itself on import. May touch: nothing but its registries.
"""
from __future__ import annotations

import torch
from torch._ops import OpOverload, OpOverloadPacket

aten = torch.ops.aten

LOWERINGS: dict = {}
RANDOM: set = set()
DECOMPOSITIONS: dict = {}
# Scalar arguments that decide what the op computes (not just a value in it): they are
# hashed into the node and reach the lowering as Python numbers, never as device data.
STATIC_ARGS: dict = {}
# Ops that take a dim and treat a 0-d tensor as a 1-element vector (PyTorch allows dim 0 or
# -1 there; JAX has no axis on a 0-d array): lower_call runs them on shape (1,) operands and
# reshapes the results back. The value says which operands: "input", "index" (the first
# and the index), "all" (input, index and source).
ZERO_D_AS_VECTOR: dict = {}


def _resolve(op):
    if isinstance(op, OpOverload):
        return [op]
    if isinstance(op, OpOverloadPacket):
        return [getattr(op, o) for o in op.overloads()]
    if isinstance(op, str):
        name, _, ov = op.partition(".")
        packet = getattr(aten, name)
        if ov == "*":
            return [getattr(packet, o) for o in packet.overloads()]
        return [getattr(packet, ov or "default")]
    raise TypeError(op)


def register(*ops, random=False, static=(), zero_d=None):
    """Decorator: ``@register("add.Tensor", aten.sub.Tensor, ..., static=("ord",))``."""
    def deco(fn):
        for op in ops:
            for o in _resolve(op):
                LOWERINGS[o] = fn
                if random:
                    RANDOM.add(o)
                if static:
                    STATIC_ARGS[o] = frozenset(static)
                if zero_d:
                    ZERO_D_AS_VECTOR[o] = zero_d
        return fn
    return deco


def get(func):
    return LOWERINGS.get(func)


def is_random(func) -> bool:
    return func in RANDOM


_FUNCTIONAL: dict = {}


def _writes(f):
    return [a.name for a in f._schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def functional_of(func: OpOverload):
    """The functional overload behind an in-place (``add_``) or out= (``add.out``) op, or None."""
    if func in _FUNCTIONAL:
        return _FUNCTIONAL[func]
    s = func._schema
    name = s.name.split("::", 1)[1]
    if name.endswith("_") and not name.endswith("__"):
        packet = getattr(aten, name[:-1], None)
        f = getattr(packet, s.overload_name or "default", None) if packet is not None else None
        # transpose_ (default) is transpose.int: failing the same overload name, the same arguments
        r = f if f is not None and not _writes(f) else _overload_taking(packet, [a.name for a in s.arguments])
    else:
        written = set(_writes(func))
        r = _overload_taking(getattr(aten, name, None), [a.name for a in s.arguments if a.name not in written])
    _FUNCTIONAL[func] = r
    return r


def _overload_taking(packet, names):
    """The overload of ``packet`` that writes nothing and takes exactly these arguments."""
    for ov in packet.overloads() if packet is not None else ():
        f = getattr(packet, ov)
        if not _writes(f) and [a.name for a in f._schema.arguments] == names:
            return f
    return None


def _load_decompositions():
    from torch._decomp import decomposition_table
    for op, fn in decomposition_table.items():
        if isinstance(op, OpOverload) and op.namespace == "aten":
            DECOMPOSITIONS[op] = fn


# ---------------------------------------------------------------------------------------
# The program: post-order -> one JAX function of the parameters.
def _instantiate(x, vals):
    from ..ir import Slot
    t = type(x)
    if t is Slot:
        return vals[x.i]
    if t is tuple:
        return tuple(_instantiate(y, vals) for y in x)
    return x


def lower_node(node, vals):
    """Evaluate one node on JAX values (inside a trace)."""
    return lower_call(node.sig, vals)


def lower_call(sig, vals):
    """Evaluate a signature's lowering on operand values (JAX arrays or abstract values).
    Results are cast to PyTorch's output dtypes and broadcast where PyTorch broadcasts; a
    shape that cannot be PyTorch's is an error, never silently reshaped."""
    import jax.numpy as jnp
    from ..runtime import jnp_dtype
    if all(0 in m.shape for m in sig.outs):
        # nothing to compute (and some JAX reductions refuse zero-size inputs)
        return tuple(jnp.zeros(m.shape, jnp_dtype(m.dtype)) for m in sig.outs)
    targs, tkw = sig.template
    args = _instantiate(targs, vals)
    kwargs = {k: _instantiate(v, vals) for k, v in tkw}
    as_vector = ZERO_D_AS_VECTOR.get(sig.func)
    if as_vector and getattr(args[0], "ndim", None) == 0:
        args = _as_vectors(args, as_vector)
    out = sig.lower(sig, *args, **kwargs)
    if not isinstance(out, (tuple, list)):
        out = (out,)
    if as_vector and len(out) == len(sig.outs):
        out = [jnp.reshape(o, m.shape) for o, m in zip(out, sig.outs)]
    res = []
    for o, m in zip(out, sig.outs):
        o = jnp.asarray(o)
        want = jnp_dtype(m.dtype)
        if o.dtype != want:
            o = o.astype(want)
        if tuple(o.shape) != m.shape:
            if not _broadcastable(o.shape, m.shape):
                raise ValueError(f"the lowering of {sig.op} gives shape {list(o.shape)} where PyTorch gives "
                                 f"{list(m.shape)}")
            o = jnp.broadcast_to(o, m.shape)
        res.append(o)
    if len(res) != len(sig.outs):
        raise ValueError(f"the lowering of {sig.op} gives {len(res)} outputs where PyTorch gives {len(sig.outs)}")
    return tuple(res)


def _as_vectors(args, which):
    """0-d operands as shape (1,): the input, and for "index"/"all" the index (argument 2)
    and for "all" the source (argument 3)."""
    picks = {0} | ({2} if which in ("index", "all") else set()) | ({3} if which == "all" else set())
    return tuple(a.reshape(1) if i in picks and getattr(a, "ndim", None) == 0 else a
                 for i, a in enumerate(args))


def _broadcastable(src, dst):
    if len(src) > len(dst):
        return False
    for a, b in zip(reversed(src), reversed(dst)):
        if a != b and a != 1:
            return False
    return True


def build_program(post, roots, params):
    """A function ``f(*param_arrays) -> tuple(root arrays)`` evaluating the graph."""
    param_index = {}
    for i, leaf in enumerate(params):
        param_index[id(leaf)] = i
    ops = [n for n in post if n.data is None]

    def program(*arrays):
        env = {}
        for n in post:
            if n.data is not None:
                env[id(n)] = (arrays[param_index[id(n)]],)
        for n in ops:
            vals = [env[id(o)][i] for o, i in n.operands]
            env[id(n)] = lower_node(n, vals)
        return tuple(env[id(r)][i] for r, i in roots)

    return program


# ---------------------------------------------------------------------------------------
# Internal nodes recorded by dispatch itself.
def lower_convert(sig, x):
    return x  # the generic output cast does the conversion; shape broadcasts


def lower_view_scatter(sig, base, src, views=None):
    """Write ``src`` into ``base`` through the chain of views ``sig.func`` ((view OpSig, output
    index) pairs, outermost first): the chain applied to an index map of ``base`` says which
    element of ``base`` each element of ``src`` came from."""
    import jax.numpy as jnp
    n = 1
    for s in base.shape:
        n *= s
    idx = jnp.arange(n, dtype=jnp.int64).reshape(base.shape)
    identity = True
    for vsig, index in sig.func:
        targs, tkw = vsig.template
        mapped = vsig.lower(vsig, *_instantiate(targs, [idx]), **{k: _instantiate(v, [idx]) for k, v in tkw})
        if isinstance(mapped, (tuple, list)):
            mapped = mapped[index]
        idx = jnp.asarray(mapped)
        identity = identity and _is_identity_view(vsig)
    if identity:  # view/reshape/alias only: every element keeps its place
        return jnp.reshape(src, base.shape).astype(base.dtype)
    flat = base.reshape(-1)
    flat = flat.at[idx.reshape(-1)].set(jnp.broadcast_to(src, idx.shape).reshape(-1).astype(base.dtype))
    return flat.reshape(base.shape)


def _is_identity_view(vsig):
    return vsig.op in ("aten::view", "aten::_unsafe_view", "aten::alias", "aten::reshape")


from . import elementwise, reduce, shape, factory, random, nn, more  # noqa: E402,F401

_load_decompositions()
from . import amp  # noqa: E402,F401  (after PyTorch's table: the gradient scaler's ops)
