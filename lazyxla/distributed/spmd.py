"""torch_xla's SPMD API (``import lazyxla.distributed.spmd as xs``): meshes and sharding
annotations (R12).

A ``Mesh`` arranges device ids (positions in ``jax.devices()``) in a shape with optional axis
names. ``mark_sharding(t, mesh, spec)`` gives ``t`` a layout: one spec entry per dimension, a
mesh axis index, an axis name, a tuple of them (that dimension split over several axes) or
None (not split). Device data is laid out at once (one upload per device's shard); a pending
tensor gets an ``xla::sharding`` node, a constraint on the program. Either way the tensor's
value never changes, its hash covers the layout (the same operations sharded differently are
different programs), and in-place updates keep it. ``get_sharding_spec`` is XLA's HLO text of
the layout. Errors (a spec of the wrong length, an unknown axis, a dimension that does not
split, SPMD off) name the tensor, the mesh and the spec at the user's line and change nothing.

May touch: the tensors it annotates, the global mesh.
"""
from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ..errors import LazyXlaError
from ..run.execution import resolve
from ..ir.node import TensorMeta
from ..ir.user_line import fmt_where, user_frame
from ..xla.jax_internals import hlo_sharding_text
from ..run.storage import SHARDING_OP, Storage, TensorState, constrained
from ..frontend.tensor import LazyTensor
from ..xla import client as xla

__all__ = ["Mesh", "get_1d_mesh", "set_global_mesh", "get_global_mesh", "mark_sharding", "clear_sharding",
           "get_sharding_spec", "global_tensor"]

_GLOBAL_MESH = None


class Mesh:
    """``Mesh(device_ids, mesh_shape, axis_names=None)``, as torch_xla's."""

    def __init__(self, device_ids, mesh_shape, axis_names=None):
        ids = [int(i) for i in np.asarray(device_ids).reshape(-1)]
        shape = tuple(int(n) for n in mesh_shape)
        devs = jax.devices()
        if math.prod(shape) != len(ids):
            raise LazyXlaError(f"lazyxla: Mesh: {len(ids)} device ids do not fill a mesh of shape {shape}")
        if not set(ids) <= set(range(len(devs))):
            raise LazyXlaError(f"lazyxla: Mesh: device ids {ids} are not among the {len(devs)} devices "
                               f"(ids 0..{len(devs) - 1})")
        if len(set(ids)) != len(ids):
            raise LazyXlaError(f"lazyxla: Mesh: device ids {ids} repeat")
        if len(ids) != len(devs):
            raise LazyXlaError(f"lazyxla: Mesh: {len(ids)} device ids {ids} for {len(devs)} devices: an SPMD "
                               f"program runs on every device, so the mesh must hold them all")
        if ids != sorted(ids):
            # JAX runs a program on one ordered device list, and data not annotated lives on the
            # devices in id order; a mesh in another order could not meet it in one program.
            raise LazyXlaError(f"lazyxla: Mesh: device ids {ids} are in a custom order, which lazyxla does not "
                               f"support yet; use them in order (np.arange({len(devs)})): values are the same, "
                               f"only which device holds which shard differs")
        if axis_names is not None and len(axis_names) != len(shape):
            raise LazyXlaError(f"lazyxla: Mesh: {len(axis_names)} axis names {tuple(axis_names)} for a mesh of "
                               f"{len(shape)} dimensions {shape}")
        self.device_ids = np.array(ids)
        self.mesh_shape = shape
        self.axis_names = tuple(axis_names) if axis_names is not None else None
        names = self.axis_names or tuple(f"axis{i}" for i in range(len(shape)))
        self.jax_mesh = jax.sharding.Mesh(np.array([devs[i] for i in ids]).reshape(shape), names)

    def size(self) -> int:
        return len(self.device_ids)

    def shape(self):
        return dict(zip(self.jax_mesh.axis_names, self.mesh_shape))

    def __repr__(self):
        return f"Mesh(shape={self.mesh_shape}, axis_names={self.axis_names})"

    def sharding(self, spec, shape, where=None, check_split=True) -> NamedSharding:
        """The jax sharding of ``spec`` for a tensor of ``shape``; a clear error when it cannot be
        (``check_split=False``: the split dimensions' sizes are not checked)."""
        def bad(why):
            return LazyXlaError(f"lazyxla: mark_sharding: tensor of shape {list(shape)}, {self!r}, partition spec "
                                f"{tuple(spec)}: {why} at {fmt_where(where)}")
        if len(spec) != len(shape):
            raise bad(f"the spec has {len(spec)} entries for {len(shape)} dimensions")
        names = self.jax_mesh.axis_names
        entries = []
        for d, entry in enumerate(spec):
            if entry is None:
                entries.append(None)
                continue
            axes = entry if isinstance(entry, tuple) else (entry,)
            got = []
            for a in axes:
                if isinstance(a, int) and not isinstance(a, bool) and 0 <= a < len(names):
                    got.append(names[a])
                elif isinstance(a, str) and self.axis_names is not None and a in self.axis_names:
                    got.append(a)
                else:
                    raise bad(f"{a!r} is not an axis of the mesh (axes {self.axis_names or tuple(range(len(names)))})")
            parts = math.prod(self.mesh_shape[names.index(a)] for a in got)
            if check_split and shape[d] % parts:
                raise bad(f"dimension {d} of size {shape[d]} does not split into {parts} equal parts")
            entries.append(tuple(got) if len(got) > 1 else got[0])
        used = [a for e in entries if e is not None for a in (e if isinstance(e, tuple) else (e,))]
        if len(used) != len(set(used)):
            raise bad("a mesh axis is used twice")
        return NamedSharding(self.jax_mesh, PartitionSpec(*entries))


def get_1d_mesh(axis_name=None) -> Mesh:
    n = len(jax.devices())
    return Mesh(np.arange(n), (n,), (axis_name,) if axis_name is not None else None)


def set_global_mesh(mesh: Mesh) -> None:
    global _GLOBAL_MESH
    _GLOBAL_MESH = mesh


def get_global_mesh():
    return _GLOBAL_MESH


def _need_spmd(what):
    if not xla.spmd():
        raise LazyXlaError(f"lazyxla: {what} needs SPMD: call lazyxla.runtime.use_spmd() first, before any "
                           f"tensor is on the device (at {fmt_where(user_frame(3))})")


def mark_sharding(t, mesh: Mesh, partition_spec):
    """Lay ``t`` out over ``mesh`` as ``partition_spec`` says; returns ``t``."""
    _need_spmd("mark_sharding")
    where = user_frame(2)
    state = t._state
    ns = mesh.sharding(tuple(partition_spec), tuple(t.shape), where)
    if state.chain is not None:
        raise LazyXlaError(f"lazyxla: mark_sharding: tensor of shape {list(t.shape)} is a view; annotate the "
                           f"tensor it views (at {fmt_where(where)})")
    st = state.storage
    old = get_sharding_spec(t)
    new = hlo_sharding_text(ns, t.dim())
    if old and old != "{replicated}" and old != new:
        raise LazyXlaError(f"lazyxla: mark_sharding: tensor of shape {list(t.shape)} is already sharded as {old}; "
                           f"existing annotation must be cleared first (clear_sharding) (at {fmt_where(where)})")
    if st.data is not None:  # device data: laid out now
        st.set_data(jax.device_put(resolve(st.data), ns))
    else:
        st.set_ir(constrained(st.ir, st.meta, ns))
    st.ir[0].where = where  # recompile explanations name the line that set the layout
    st.set_sharding(ns)
    return t


def global_tensor(local, mesh: Mesh, partition_spec):
    """The tensor, laid out over ``mesh`` as ``partition_spec``, whose blocks on this process's
    devices hold ``local`` (a CPU tensor: this process's part of it, such as its part of a
    batch). With several processes each passes its own part, in rank order along the split
    dimensions; in one process it is ``local`` itself, annotated."""
    _need_spmd("global_tensor")
    where = user_frame(2)
    spec = tuple(partition_spec)
    ns = mesh.sharding(spec, tuple(local.shape), where, check_split=False)
    try:
        array = jax.make_array_from_process_local_data(ns, xla.host_array(local))
    except ValueError as e:
        raise LazyXlaError(f"lazyxla: global_tensor: this process's part of shape {list(local.shape)}, {mesh!r}, "
                           f"partition spec {spec}: {e} at {fmt_where(where)}") from None
    mesh.sharding(spec, tuple(array.shape), where)  # the whole tensor must split as asked
    meta = TensorMeta(tuple(array.shape), local.dtype)
    state = TensorState(Storage.of_data(array, meta), meta)
    state.storage.set_sharding(ns)
    state.storage.ir[0].where = where
    return LazyTensor(state)


def clear_sharding(t):
    """Forget ``t``'s annotation: it is replicated again."""
    _need_spmd("clear_sharding")
    st = t._state.storage
    st.set_sharding(None)
    if st.data is not None:
        st.set_data(jax.device_put(resolve(st.data), xla.placement()))
    elif st.ir[0].sig.op == SHARDING_OP:
        st.set_ir(st.ir[0].operands[0])
    return t


def get_sharding_spec(t) -> str:
    """XLA's HLO sharding text of ``t``'s layout; "" when it has none."""
    if not xla.spmd():
        return ""
    st = t._state.storage
    if st.data is not None:
        return xla.sharding_tag(st.data)
    node = st.ir[0]
    if node.sig.op == SHARDING_OP:
        return dict(node.sig.template[1])["sharding"]  # the text its signature (and hash) carries
    return ""
