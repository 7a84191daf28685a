"""The pending IR: nodes, their signatures, values and hashes.

An IR *value* is a pair ``(node, output_index)``. A ``Node`` is one recorded op: an
``OpSig`` (the op, its non-tensor parameters, its output shapes and dtypes and its
lowering; shared by every call with the same signature), its operand values, its
128-bit hash and, for diagnostics only, the user's line that recorded it (``user_line``).
``skeleton`` copies a graph's structure without its buffers; ``post_order`` walks it.

R1.3: a node's hash folds the signature's hash (op, parameters, output shapes and
dtypes) with its operands' value hashes, in order, once, at construction.
R1.4: a device-data leaf hashes only its shape and dtype; which buffer it binds is
the graph hash's parameter sequence (R3 step 4).

Touches nothing outside the objects it creates.
"""
from __future__ import annotations

import torch

from hashlib import blake2b as _blake2b

from ..hashing import encode, fold
from .user_line import resolve_site


DEVICE_DATA = "xla::device_data"


class TensorMeta:
    """Interned (shape, dtype, stride) of one tensor value; compared by identity."""

    __slots__ = ("shape", "dtype", "stride", "numel", "hash", "contiguous")
    _interned: dict = {}

    def __new__(cls, shape, dtype, stride=None):
        shape = tuple(shape)
        if stride is None:
            stride = contiguous_stride(shape)
        key = (shape, dtype, tuple(stride))
        m = cls._interned.get(key)
        if m is None:
            m = object.__new__(cls)
            m.shape, m.dtype, m.stride = key
            n = 1
            for s in shape:
                n *= s
            m.numel = n
            m.contiguous = m.stride == contiguous_stride(shape)
            m.hash = fold(b"meta", encode(shape), encode(dtype))
            cls._interned[key] = m
        return m

    @staticmethod
    def of(t: torch.Tensor) -> "TensorMeta":
        return TensorMeta(t.shape, t.dtype, t.stride())

    def __repr__(self):
        return f"{_short_dtype(self.dtype)}{list(self.shape)}"

    def __lazyxla_encode__(self):
        return b"M" + encode(self.shape) + encode(self.dtype)


def contiguous_stride(shape):
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(stride))


_DT_SHORT = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
             torch.int64: "s64", torch.int32: "s32", torch.int16: "s16", torch.int8: "s8",
             torch.uint8: "u8", torch.bool: "pred", torch.complex64: "c64"}


def _short_dtype(dt):
    return _DT_SHORT.get(dt, str(dt).replace("torch.", ""))


class OpSig:
    """Everything about a call that does not change from one call to the next.

    ``template`` rebuilds the call's (args, kwargs) for lowering: a nested structure in
    which ``Slot(i)`` stands for operand ``i``. ``hb`` is the signature's hash.
    """

    __slots__ = ("op", "func", "lower", "template", "outs", "hb", "hv", "single", "params_text", "cdtype",
                 "__weakref__")

    def __init__(self, op, func, lower, template, outs, params_text="", cdtype=None):
        self.op = op
        self.func = func
        self.lower = lower
        self.template = template
        self.outs = tuple(outs)
        self.single = len(self.outs) == 1
        self.params_text = params_text
        self.cdtype = cdtype
        self.hb = fold(b"op", encode(op), encode(template), encode(self.outs))
        self.hv = (self.hb, _value_hashes(self.hb, self))  # a node without operands hashes as its signature


class Slot:
    """Operand placeholder inside an OpSig template."""

    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i

    def __repr__(self):
        return f"%{self.i}"

    def __lazyxla_encode__(self):
        return b"%" + str(self.i).encode() + b";"


# A steady training loop records the same nodes every step: their hashes are remembered by
# (signature hash, operand hashes). The memo only saves work; the hash is the BLAKE2b fold.
_NODE_HASHES: dict = {}


def _node_hash(k, sig):
    if len(_NODE_HASHES) >= 1 << 18:
        _NODE_HASHES.clear()
    h = _blake2b(b"".join(k), digest_size=16).digest()
    hv = _NODE_HASHES[k] = (h, _value_hashes(h, sig))
    return hv


def _value_hashes(h, sig):
    """The hashes of a node's output values: the node's own for one output, else one each."""
    if sig.single:
        return (h,)
    return tuple(fold(h, i.to_bytes(2, "little")) for i in range(len(sig.outs)))


class Node:
    __slots__ = ("sig", "operands", "hash", "vh", "_at", "data", "owner", "__weakref__")

    def __init__(self, sig: OpSig, operands: tuple, where=None, data=None, owner=None):
        self.sig = sig
        self.operands = operands
        self._at = where  # the user's line, or where it is: a (code, bytecode offset) site
        self.data = data
        self.owner = owner  # device-data leaves: weakref to the storage the buffer belongs to
        if operands:
            n = len(operands)
            if n == 1:
                (o, i), = operands
                k = (sig.hb, o.vh[i])
            elif n == 2:
                (o, i), (p, j) = operands
                k = (sig.hb, o.vh[i], p.vh[j])
            else:
                k = (sig.hb, *[n.vh[i] for n, i in operands])
            hv = _NODE_HASHES.get(k)
            if hv is None:
                hv = _node_hash(k, sig)
            self.hash, self.vh = hv
        else:
            self.hash, self.vh = sig.hv

    @property
    def where(self):
        """(filename, lineno, function) of the user's line that recorded the node, or None;
        captured as a site when recorded, resolved here, when first read."""
        w = self._at
        if w is not None and len(w) == 2:
            w = self._at = resolve_site(w)
        return w

    @where.setter
    def where(self, w):
        self._at = w

    @property
    def op(self):
        return self.sig.op

    @property
    def is_data(self):
        return self.data is not None

    def __repr__(self):
        return f"<{self.sig.op} {self.sig.outs} #{self.hash.hex()[:8]}>"


_DATA_SIGS: dict = {}


def data_sig(meta: TensorMeta, sharding=None) -> OpSig:
    k = meta if sharding is None else (meta, sharding)
    s = _DATA_SIGS.get(k)
    if s is None:
        s = OpSig(DEVICE_DATA, None, None, ((), (("sharding", sharding),)) if sharding else (), (meta,))
        _DATA_SIGS[k] = s
    return s


def data_leaf(array, meta: TensorMeta, owner=None, sharding=None) -> Node:
    """A device-data leaf bound to ``array`` (a jax.Array); hashes shape and dtype only, and
    under SPMD its sharding (``sharding``: the HLO sharding text). ``owner`` (a weakref to a
    storage) makes the buffer a donation candidate; scalars and the RNG seed have none."""
    return Node(data_sig(meta, sharding), (), None, array, owner)


class Skeleton:
    """A node's structure without its buffers: what diagnostics keep of an old graph."""

    __slots__ = ("op", "outs", "hash", "where", "operands", "params", "layout")

    def __init__(self, node, operands):
        self.op = node.sig.op
        self.outs = node.sig.outs
        self.hash = node.hash
        self.where = node.where
        self.operands = operands
        self.params = node.sig.template if node.data is None else None
        # device data under SPMD: its HLO sharding text (data_sig's one parameter)
        self.layout = dict(node.sig.template[1]).get("sharding") if node.data is not None and node.sig.template \
            else None

    @property
    def is_data(self):
        return self.params is None


def skeleton(value, memo=None):
    """Copy the DAG below an IR value as Skeletons (iterative; shares repeated nodes)."""
    memo = {} if memo is None else memo
    root, idx = value
    stack = [root]
    while stack:
        n = stack[-1]
        if id(n) in memo:
            stack.pop()
            continue
        missing = [o for o, _ in n.operands if id(o) not in memo]
        if missing:
            stack.extend(missing)
            continue
        stack.pop()
        memo[id(n)] = Skeleton(n, tuple((memo[id(o)], i) for o, i in n.operands))
    return (memo[id(root)], idx)


def post_order(roots, skip=()):
    """Nodes reachable from ``roots`` (IR values), operands before users, each once; the nodes
    whose ids are in ``skip`` are neither visited nor listed (a captured region's inputs).

    Operands are visited in reverse order (the last operand first), as torch's lazy core's
    iterative traversal does; the parameter sequence inherits that order.
    """
    done = set(skip)
    opened = set()  # nodes whose operands are on the stack already
    order = []
    for root, _ in roots:
        if id(root) in done:
            continue
        stack = [root]
        while stack:
            node = stack.pop()
            i = id(node)
            if i in done:
                continue
            operands = node.operands
            if operands and i not in opened:
                opened.add(i)
                stack.append(node)
                for o, _ in operands:
                    if id(o) not in done:
                        stack.append(o)
                continue
            done.add(i)
            order.append(node)
    return order
