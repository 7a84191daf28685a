"""A tensor's value: storages, views and their replay, writes, device data, and the arena.

Every lazy tensor (``tensor.LazyTensor``, the torch-facing object) carries one
``TensorState`` as its ``_state``; nothing else about its value lives anywhere else.

- A ``Storage`` is the value shared by a tensor and every view or alias of it (``.data``,
  ``detach()``, slices). ``storage.ir`` is the current value as an IR value ``(node, index)``:
  pending IR, or a device-data leaf whose node holds a ``jax.Array`` (then ``storage.data``
  is that array). ``version`` moves on at every change.
- A ``TensorState`` is one tensor's view of a storage: the storage, the chain of view
  signatures from the storage's value to the tensor's (None for the storage itself), the
  tensor's meta, and its unique id (R0: from a counter starting at 1). A view rebuilds its
  IR from the storage when the storage's version has moved on (``value()``); a write through
  a view is scattered into the storage in one step by the chain's index map (``write()``).
- The arena (R0 "live tensors") holds a weak reference to each state in creation order; a
  sync walks it (``pending()``). A state lives as long as its tensor.
- Device data: ``upload`` (a host tensor) and ``scalar_value`` (a Python scalar, R1.5). A
  view of device data is read by replaying its views on the host copy of the storage
  (``reads_on_host``, ``view_on_host``): after a sync, every live tensor reads without a
  program.

Two counters let a replayed step (``replay``) check in O(1) that nothing changed under it:
``PENDING_BORN`` (a storage got pending IR) and ``REBOUND`` (a tensor took another storage);
while a step is captured, ``upload_hook`` hears of every upload; while the code walk records,
``watch_births`` hears of every new state.

May touch: storages and states, the arena, the transfer metrics and the tensor counters.
Knows nothing about torch ops, compiling or running programs.
"""
from __future__ import annotations

import itertools
import weakref

import torch

from .. import metrics
from ..errors import LazyXlaError, refusal
from ..ir.node import _DATA_SIGS, Node, OpSig, Slot, TensorMeta, data_leaf, data_sig
from ..ir.user_line import fmt_where, user_frame
from ..xla.jax_internals import hlo_sharding_text
from ..lowering import lower_convert, lower_sharding, lower_view_scatter
from ..lowering.program import instantiate
from ..xla.client import TORCH_TO_JNP, scalar_array, sharding_tag, spmd, upload as _upload_array

SHARDING_OP = "xla::sharding"  # torch_xla's custom-call name for a sharding annotation

_weakref = weakref.ref
_new = object.__new__
_counters = metrics.COUNTERS

# Moves on whenever a storage gets pending IR (a new op's output, an in-place write), never
# for device data: a replayed step (``replay``) knows from it alone, without walking the
# arena, that nothing was recorded since it last looked.
PENDING_BORN = 0
# Moves on whenever a tensor takes another storage (``set_``, ``.data =``, in-place view ops)
# or a storage another layout (``set_sharding``): a replay checks its bindings again only then.
REBOUND = 0


class Storage:
    """The value shared by a tensor and all its aliases. ``sharding`` (SPMD): the layout the
    user annotated (``mark_sharding``), kept through in-place updates."""

    __slots__ = ("ir", "data", "version", "meta", "donate", "sharding", "untyped", "uploaded", "__weakref__")

    def __init__(self, ir, meta, data=None):
        global PENDING_BORN
        self.ir = ir
        self.data = data
        self.meta = meta
        self.version = 0
        self.donate = False
        self.sharding = None
        self.untyped = None  # the meta storage a tensor's untyped_storage() shows, made when asked
        self.uploaded = -1   # the step (``STEP``) in which the host sent this storage's buffer
        if ir is not None:
            PENDING_BORN += 1

    @staticmethod
    def of_data(array, meta):
        st = Storage(None, meta, array)
        st.ir = (data_leaf(array, meta, _weakref(st), sharding_tag(array)), 0)
        return st

    def set_ir(self, value):
        global PENDING_BORN
        if self.sharding is not None:  # an annotated tensor keeps its layout when written
            value = constrained(value, self.meta, self.sharding)
        self.ir = value
        self.data = None
        self.version += 1
        self.uploaded = -1
        if value[0].data is None:  # a copy of device data (copy_) records no op
            PENDING_BORN += 1

    def set_data(self, array, shared=False):
        """The storage's value is now this device buffer (after a sync). ``shared``: another
        storage holds the same buffer, so it must never be donated through this one (the
        leaf gets no owner)."""
        self.ir = (data_leaf(array, self.meta, None if shared else _weakref(self), sharding_tag(array)), 0)
        self.data = array
        self.version += 1
        self.donate = False  # a user's donation mark belongs to the old buffer
        self.uploaded = -1

    def set_leaf(self, leaf):
        """The storage's value is now ``leaf``, a device-data leaf of no storage that others may
        hold too (a Python scalar's buffer, R1.5): never donated, not pending."""
        self.ir = (leaf, 0)
        self.data = leaf.data
        self.version += 1
        self.donate = False
        self.uploaded = -1

    @staticmethod
    def set_all(storages, arrays):
        """``set_data`` of each storage to its array (a sync's outputs, in order), in one loop:
        a warm sync gives every output its buffer here."""
        if spmd():
            for st, a in zip(storages, arrays):
                st.set_data(a)
            return
        sigs, new_node = _DATA_SIGS, Node
        for st, a in zip(storages, arrays):
            m = st.meta
            sig = sigs.get(m)
            if sig is None:
                sig = data_sig(m)
            st.ir = (new_node(sig, (), None, a, _weakref(st)), 0)
            st.data = a
            st.version += 1
            st.donate = False
            st.uploaded = -1

    def take_output(self, array, sig, owner):
        """``set_data`` for a replay's output, whose leaf signature (``ir.data_sig`` of this
        storage's meta) and owner reference (a weakref to this storage) are known already.
        The leaf the last replay made is reused: a replay starts with nothing pending, so no
        recorded op refers to it (a view rebuilds its IR: the version moves on)."""
        leaf = self.ir[0]
        if leaf.owner is owner and leaf.sig is sig:
            leaf.data = array
        else:
            self.ir = (Node(sig, (), None, array, owner), 0)
        self.data = array
        self.version += 1
        self.donate = False
        self.uploaded = -1

    def set_sharding(self, sharding):
        """Annotate the storage's layout (``mark_sharding``; None: ``clear_sharding``)."""
        global REBOUND
        REBOUND += 1  # a replay bound to the old layout checks its bindings again
        self.sharding = sharding

    def restore(self, ir, data):
        """Put back a value this storage had before (a graph capture that ran nothing)."""
        self.ir = ir
        self.data = data
        self.version += 1  # never back: views rebuild their IR from the restored value


_SHARDING_SIGS: dict = {}


def constrained(value, meta, sharding):
    """``value`` laid out as ``sharding`` (a jax NamedSharding) inside the program; the
    signature carries the sharding's HLO text, so the hash covers it (R12)."""
    if value[0].sig.op == SHARDING_OP and value[0].sig.func == sharding:
        return value
    k = (meta, sharding)
    sig = _SHARDING_SIGS.get(k)
    if sig is None:
        text = hlo_sharding_text(sharding, len(meta.shape))
        sig = _SHARDING_SIGS[k] = OpSig(SHARDING_OP, sharding, lower_sharding, ((Slot(0),), (("sharding", text),)),
                                        (meta,))
    return (Node(sig, (value,), None), 0)


# ---------------------------------------------------------------------------------------
# The arena: weak references to live states, in creation order, keyed by the state's id (a
# dict keeps insertion order). Not keyed by the weak reference itself: a dead reference keeps
# the hash of the address its state had, and new states reuse freed addresses, so a step that
# makes and drops many tensors (aliases, a region's outputs) piled equal hashes into long
# probe chains (measured: 36 us per insert in a loop of detach()). A dead state's reference
# stays until the arena is next walked (a sync, a read of the counters, or every 2**14 new
# states): no Python callback on each tensor's death, and the creation and destruction
# counters are settled then too.
LIVE: dict = {}
_ids = itertools.count(1)  # next() is atomic: ids stay unique when states are made on several threads
_last_uid = 0      # the id of the newest state (CreateXlaTensor is settled from it when read)
_counted_uid = 0   # the newest state already counted in CreateXlaTensor


def prune():
    """Drop the references of dead states and count them (DestroyXlaTensor, in
    ``live_states``); count the states made since the last count (CreateXlaTensor)."""
    global _counted_uid
    live_states()
    made, _counted_uid = _last_uid - _counted_uid, _last_uid
    if made:
        _counters["CreateXlaTensor"] = _counters.get("CreateXlaTensor", 0) + made


metrics.BEFORE_READ.append(prune)


def _enter_arena(state):
    """Give a new state its id (R0) and its place in the arena."""
    global _last_uid
    state.uid = _last_uid = uid = next(_ids)
    LIVE[uid] = _weakref(state)
    if not uid & 0x3FFF:
        prune()


_plain_enter_arena = _enter_arena


def watch_births(hook) -> None:
    """While ``hook`` is set, ``hook(state)`` runs as each new state enters the arena (the
    code walk, ``debug.walk``, notes the user's line that made each tensor); ``None`` stops it.
    Off, the arena's entry is the plain function: nothing is paid per tensor."""
    global _enter_arena
    if hook is None:
        _enter_arena = _plain_enter_arena
        return

    def _watched(state):
        _plain_enter_arena(state)
        hook(state)
    _enter_arena = _watched


class TensorState:
    """One lazy tensor's value: which storage, through which views, with what meta."""

    __slots__ = ("storage", "chain", "ir", "version", "meta", "uid", "copy_of_view", "__weakref__")

    def __init__(self, storage: Storage, meta: TensorMeta, chain=None, ir=None, version=-1):
        self.storage = storage
        self.chain = chain  # ((view OpSig, output index), ...) from the storage's value, or None
        self.ir = ir        # a view's IR value, valid while version == storage.version
        self.version = version
        self.meta = meta
        self.copy_of_view = None  # the view op whose CPU result this is (a copy, not an alias)
        _enter_arena(self)

    def value(self):
        """The tensor's current IR value, rebuilding a view's IR if its storage moved on."""
        st = self.storage
        chain = self.chain
        if chain is None:
            return st.ir
        if self.version != st.version:
            v = st.ir
            for vsig, i in chain:
                v = (Node(vsig, (v,)), i)
            self.ir = v
            self.version = st.version
        return self.ir

    def alias(self) -> "TensorState":
        """A new tensor's state sharing this one's storage and view (``.data``, ``detach()``)."""
        s = _new(TensorState)  # TensorState's constructor, inlined (as in ``fresh``)
        chain = self.chain
        s.storage, s.chain, s.meta, s.copy_of_view = self.storage, chain, self.meta, None
        s.ir, s.version = (None, -1) if chain is None else (self.ir, self.version)
        _enter_arena(s)
        return s

    def view(self, node, sig, from_storage=False) -> list:
        """The states of a view op's outputs: the same storage, one more link in the chain
        (the first link, when the view op addresses the storage itself: as_strided)."""
        st = self.storage
        base = () if from_storage else (self.chain or ())
        return [TensorState(st, m, base + ((sig, i),), (node, i), st.version) for i, m in enumerate(sig.outs)]

    def become(self, other: "TensorState"):
        """Take ``other``'s storage, view and meta, keeping this tensor's id (``set_``,
        ``.data =``, in-place view ops)."""
        global REBOUND
        REBOUND += 1
        self.storage, self.chain, self.ir, self.version, self.meta = \
            other.storage, other.chain, other.ir, other.version, other.meta

    def rebind(self, storage: Storage, chain, meta):
        """Be again the view ``chain`` of ``storage`` with ``meta`` (what a graph capture puts
        back when its step made the tensor another's alias)."""
        global REBOUND
        REBOUND += 1
        self.storage, self.chain, self.meta, self.ir, self.version = storage, chain, meta, None, -1

    def write(self, value):
        """Make ``value`` (an IR value of this tensor's meta) the new value of the tensor and
        its aliases. Through a view, the new value is scattered into the storage in one step,
        by the index map of the whole view chain: only the elements of this tensor are
        written, even where an outer view repeats elements of the storage (a row of an
        ``expand``ed tensor)."""
        if self.copy_of_view is not None:
            raise LazyXlaError(f"{self.copy_of_view}: this tensor is a view that lazyxla computed on the CPU (the op "
                               f"has no lowering), so it is a copy: a write to it would not reach the tensor it views "
                               f"(at {fmt_where(user_frame(1))}); write the viewed tensor instead")
        st = self.storage
        chain = self.chain
        if not chain:
            st.set_ir(value)
            return
        ssig = _SCATTER_SIGS.get(chain)
        if ssig is None:
            _check_scatterable(chain)
            ssig = _SCATTER_SIGS[chain] = OpSig(
                "lazyxla::view_scatter", chain, lower_view_scatter,
                ((Slot(0), Slot(1)), (("views", tuple((vsig.hb, i) for vsig, i in chain)),)), (st.meta,))
        st.set_ir((Node(ssig, (st.ir, value), None), 0))
        self.ir = value
        self.version = st.version


# Views that change the dtype or the values themselves (PyTorch's conjugate and negative views)
_NOT_SCATTERABLE = ("aten::view_as_real", "aten::view_as_complex", "aten::view.dtype", "aten::_conj",
                    "aten::_neg_view")


def _check_scatterable(chain):
    """A write through a view is scattered by an index map of the storage, which carries
    positions only: a view that changes the dtype or the values cannot be written through.
    Refused, never written wrong."""
    for vsig, i in chain:
        if vsig.op in _NOT_SCATTERABLE:
            raise LazyXlaError(f"{vsig.op}: lazyxla cannot write through a view that changes the dtype or the "
                               f"values ({vsig.outs[i]!r}) at {fmt_where(user_frame(1))}; compute the new value "
                               f"and assign the viewed tensor")


_SCATTER_SIGS: dict = {}
_CONVERT_SIGS: dict = {}


def fresh(value, meta: TensorMeta) -> TensorState:
    """The state of a new tensor whose value is ``value`` in a storage of its own: what
    ``TensorState(Storage(value, meta), meta)`` makes, without the two constructor calls (the
    warm path makes one for every output of a recorded op or a compiled region)."""
    global PENDING_BORN
    st = _new(Storage)
    st.ir, st.data, st.meta, st.version, st.donate, st.sharding, st.untyped = value, None, meta, 0, False, None, None
    st.uploaded = -1
    if value is not None:
        PENDING_BORN += 1
    s = _new(TensorState)
    s.storage, s.chain, s.ir, s.version, s.meta, s.copy_of_view = st, None, None, -1, meta, None
    _enter_arena(s)
    return s


def converted(value, src_meta: TensorMeta, dst_meta: TensorMeta):
    """``value`` (of ``src_meta``) as a value of ``dst_meta``: cast, and broadcast."""
    if src_meta is dst_meta or (src_meta.dtype == dst_meta.dtype and src_meta.shape == dst_meta.shape):
        return value
    k = (src_meta, dst_meta)
    sig = _CONVERT_SIGS.get(k)
    if sig is None:
        sig = _CONVERT_SIGS[k] = OpSig("lazyxla::convert", None, lower_convert, ((Slot(0),), ()), (dst_meta,))
    return (Node(sig, (value,)), 0)


def _slots(x, out):
    t = type(x)
    if t is Slot:
        out.append(x.i)
    elif t is tuple or t is list:
        for y in x:
            _slots(y, out)
    return out


_HOST_VIEWABLE: dict = {}


def _replayable(chain) -> bool:
    """Whether PyTorch can replay the view chain on a host tensor (every link a view op of
    its one operand)."""
    ok = _HOST_VIEWABLE.get(chain)
    if ok is None:
        ok = _HOST_VIEWABLE[chain] = all(
            vsig.func is not None and set(_slots(vsig.template, [])) == {0} for vsig, _ in chain)
    return ok


def reads_on_host(state: TensorState) -> bool:
    """Whether reading the tensor needs no program: a view of a storage that holds device
    data, through view ops PyTorch can replay on the host copy of that storage."""
    chain = state.chain
    return chain is not None and state.storage.data is not None and _replayable(chain)


_OFFSETS: dict = {}


def storage_offset(state: TensorState):
    """Where the tensor's first element sits in its storage (PyTorch's ``storage_offset()``),
    or None when that cannot be said (an empty view, a chain PyTorch cannot replay)."""
    chain = state.chain
    if chain is None:
        return 0
    meta = state.storage.meta
    k = (chain, meta)
    if k not in _OFFSETS:
        off = None
        if _replayable(chain) and meta.numel:
            v = view_on_host(torch.arange(meta.numel).reshape(meta.shape), chain)
            off = int(v.reshape(-1)[0]) if v.numel() else None
        _OFFSETS[k] = off
    return _OFFSETS[k]


def view_on_host(host, chain):
    """The view chain replayed by PyTorch on a host tensor holding the storage's value."""
    for vsig, i in chain:
        targs, tkw = vsig.template
        out = vsig.func(*instantiate(targs, [host]), **{k: instantiate(v, [host]) for k, v in tkw})
        host = out[i] if isinstance(out, (tuple, list)) else out
    return host


def live_states() -> list:
    """Live states in creation order; the references of dead ones are dropped (and counted)."""
    out = []
    dead = 0
    for uid, ref in list(LIVE.items()):
        s = ref()
        if s is None:
            del LIVE[uid]
            dead += 1
        else:
            out.append(s)
    if dead:
        _counters["DestroyXlaTensor"] = _counters.get("DestroyXlaTensor", 0) + dead
    return out


def pending():
    """What a sync computes: (storages, roots) for each distinct storage of a live tensor
    whose value is pending IR, in arena order; a root is (tensor id, the storage's IR value).
    Walks the arena once, dropping (and counting) dead states' references as ``live_states``."""
    storages, roots, seen = [], [], set()
    dead = 0
    for uid, ref in list(LIVE.items()):
        s = ref()
        if s is None:
            del LIVE[uid]
            dead += 1
            continue
        st = s.storage
        if st.data is None:
            sid = id(st)
            if sid in seen:
                continue
            seen.add(sid)
            storages.append(st)
            roots.append((uid, st.ir))
    if dead:
        _counters["DestroyXlaTensor"] = _counters.get("DestroyXlaTensor", 0) + dead
    return storages, roots


def set_donation(state: TensorState, donate: bool) -> bool:
    """Mark the storage's device buffer for donation at the next sync (R9.3); False when it
    has none (pending IR)."""
    st = state.storage
    if st.data is None:
        return False
    st.donate = bool(donate)
    return True


# ---------------------------------------------------------------------------------------
# Device data.
STEP = 0  # moves on at the end of every step (``next_step``): an upload is "of this step" until then
STEP_START = 0  # the newest state's id when this step began (``move_to_step_start``)


def next_step() -> None:
    global STEP, STEP_START
    STEP += 1
    STEP_START = _last_uid


def mark_step_start() -> None:
    """States made from now on are "of this step" (``made_this_step``): a graph capture's start,
    where nothing is pending, is a step's start."""
    global STEP_START
    STEP_START = _last_uid


def made_this_step(state) -> bool:
    """Whether ``state`` was made during this step (since ``next_step`` or ``mark_step_start``)."""
    return state.uid > STEP_START


def move_to_step_start(states) -> None:
    """Give these states (made during this step) the arena's places at the step's start, before
    every other state made during it: the order they will have in every later step (a sync's
    roots follow the arena; ``optimizer_state``)."""
    uids = {s.uid for s in states if s.uid > STEP_START}
    if not uids:
        return
    items = list(LIVE.items())
    before = [it for it in items if it[0] <= STEP_START]
    moved = [it for it in items if it[0] in uids]
    after = [it for it in items if it[0] > STEP_START and it[0] not in uids]
    LIVE.clear()
    LIVE.update(before + moved + after)


def from_host(st: Storage, leaf) -> bool:
    """Whether ``leaf`` is ``st``'s buffer as the host sent it (an upload no program has written
    since): a step's data rather than a program's output."""
    return st.uploaded >= 0 and st.ir[0] is leaf


def uploaded_this_step(st: Storage, leaf) -> bool:
    """Whether ``leaf`` is ``st``'s buffer as the host sent it during this step (no op wrote it since)."""
    return st.uploaded == STEP and st.ir[0] is leaf


upload_hook = None  # while a step is captured: called as upload_hook(host, state) after each upload


def upload(host) -> TensorState:
    """A CPU tensor's value as device data, at once (no IR): a new tensor's state."""
    if host.dtype not in TORCH_TO_JNP:
        raise LazyXlaError(f"lazyxla does not support dtype {host.dtype} (at {fmt_where(user_frame(1))})")
    if host.layout != torch.strided:
        raise LazyXlaError(f"lazyxla does not support {host.layout} tensors, only dense ones "
                           f"(at {fmt_where(user_frame(1))}); use .to_dense()")
    src, host = host, host.detach()
    meta = TensorMeta(host.shape, host.dtype)
    state = device_data(_to_device(host, "upload"), meta)
    state.storage.uploaded = STEP
    if upload_hook is not None:
        upload_hook(src, state)
    return state


def take_host(state: TensorState, host) -> bool:
    """A pending tensor (not a view) whose value the host computed takes that value as its
    device data, sent by the host this step: nothing is left to compute for it. False, and
    nothing changes, for a view or a tensor that is device data already."""
    st = state.storage
    if state.chain is not None or st.data is not None or st.sharding is not None:
        return False
    st.set_data(_to_device(host.detach().to(st.meta.dtype), "a host-computed value"))
    st.uploaded = STEP
    return True


def _to_device(host, what):
    """``xla.upload``, its refusal of a value the device cannot hold (an int64 outside the 32
    bits a TPU holds it in: ``xla.widths``) named with the user's line."""
    try:
        return _upload_array(host)
    except OverflowError as e:
        raise refusal(OverflowError)(f"lazyxla: {what} at {fmt_where(user_frame(2))}: {e}") from None


def device_data(array, meta: TensorMeta) -> TensorState:
    """A new tensor's state whose value is the device buffer ``array`` (no IR)."""
    return TensorState(Storage.of_data(array, meta), meta)


SCALAR_LEAVES: dict = {}  # (Python type, value, dtype, op, operand) -> device-data IR value


def forget_scalars():
    """Drop the cached scalar buffers (SPMD placed new ones on every device)."""
    SCALAR_LEAVES.clear()


def scalar_value(v, dtype, op=None, slot=None):
    """A Python scalar as a device-data IR value (R1.5), cached by value and dtype for its role:
    the op (its counter name) and operand slot that take it. Two roles never share a buffer
    because their values happen to be equal: that would bind the program's inputs otherwise
    than when they differ, and compile it twice (NAdam's and RAdam's first step: 1 - beta2 ** 1
    equal to another scalar of the step, which differs from the second step on)."""
    k = (type(v), v, dtype, op, slot)
    leaf = SCALAR_LEAVES.get(k)
    if leaf is None:
        _counters["DeviceDataCacheMiss"] = _counters.get("DeviceDataCacheMiss", 0) + 1
        if len(SCALAR_LEAVES) > 4096:
            SCALAR_LEAVES.clear()
        try:
            array = scalar_array(v, dtype)
        except OverflowError as e:
            raise refusal(OverflowError)(f"lazyxla: {op or 'a scalar'} at {fmt_where(user_frame(1))}: {e}") from None
        leaf = SCALAR_LEAVES[k] = (data_leaf(array, TensorMeta((), dtype)), 0)
    return leaf
