"""PyTorch's argument checks that its meta kernels leave out, made while recording.

lazyxla learns an op's shapes and dtypes from PyTorch's meta kernels (``signature``), and some
of PyTorch's checks live only in its CPU kernels: eager refuses those calls, and without the
checks here lazyxla would return a value. Each is refused when the op is recorded, before
anything is (no node, no tensor changed, no RNG step), with PyTorch's own message and
exception type (``LazyXlaError`` is a RuntimeError; ``errors.refusal`` for other types), the
op's name and the user's line:

- ``check_call`` (once per signature, from ``signature.new_entry``): a call's arguments, from
  what its signature key holds (shapes, dtypes, the non-value arguments), by the rules of
  ``RULES``: complex of mixed dtypes, index_add's and index_reduce's source shape,
  masked_scatter's mask, bucketize's boundaries, a convolution's negative padding or
  output_padding and non-positive stride or dilation, uniform_'s range, as_strided_scatter
  past its storage, multinomial's input, sample count, categories and out= dtype;
- ``check_out_dtypes`` (once per signature): each out= tensor's dtype against the result's, as
  PyTorch's CPU kernel wants it: the same dtype (``SAME_DTYPE``: structured kernels, which
  check the dtype when they resize out=; ``BOOL_OR_SAME``: all, any), or one the result can be
  cast to (``CASTS``, and TensorIterator's rule for every pointwise op); any other op keeps
  lazyxla's conversion of its result to the out= dtype;
- ``check_overlap`` (every call of an out= op with an ``overlap_rule``: the warm path, since
  which storage a tensor lives in is not in the signature key): an out= tensor that shares
  elements with an input, as PyTorch's ``assert_no_overlap`` (any shared element) and
  ``assert_no_partial_overlap`` (shared, but not the very same elements) refuse it, decided
  as PyTorch decides it (``overlap``): by storage, first element, length and strides.

The tables were measured against PyTorch 2.13's CPU kernels. Touches nothing.
"""
from __future__ import annotations

import torch

from .device import is_lazy
from ..errors import LazyXlaError, refusal
from ..ir.user_line import fmt_where, user_frame
from ..run.storage import storage_offset

# PyTorch's two names for a dtype in its messages: the ScalarType's (``Float``) and the C++
# type's (``float``, from TypeMeta).
SCALAR_NAMES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
    torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
    torch.complex32: "ComplexHalf", torch.uint16: "UInt16", torch.uint32: "UInt32", torch.uint64: "UInt64",
}
CPP_NAMES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16",
    torch.int64: "long int", torch.int32: "int", torch.int16: "short int", torch.int8: "signed char",
    torch.uint8: "unsigned char", torch.bool: "bool", torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
}


def scalar_name(dt) -> str:
    return SCALAR_NAMES.get(dt, str(dt).replace("torch.", ""))


def cpp_name(dt) -> str:
    return CPP_NAMES.get(dt, str(dt).replace("torch.", ""))


def refuse(name, msg, where, kind=RuntimeError):
    """The error for a call eager refuses with ``msg`` (its own text), naming the op and the line."""
    return refusal(kind)(f"{name}: {msg} (at {fmt_where(where)})")


def base_name(func) -> str:
    """The op without namespace, overload or in-place mark: ``index_add`` for ``index_add_.out``."""
    n = func._schema.name.split("::", 1)[-1]
    return n[:-1] if n.endswith("_") and not n.endswith("__") else n


def bound(func, args, kwargs) -> dict:
    """The call's arguments by their schema names, defaults filled in."""
    out = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out[a.name] = args[i]
        elif kwargs and a.name in kwargs:
            out[a.name] = kwargs[a.name]
        else:
            out[a.name] = a.default_value if a.has_default_value() else None
    return out


# ---------------------------------------------------------------------------------------
# Per-op rules: ``rule(a)`` with the bound arguments, returning eager's message (or, for an
# exception type other than RuntimeError, (type, message)), or None when the call is valid.
def _complex(a):
    real, imag = a["real"], a["imag"]
    floats = (torch.float16, torch.float32, torch.float64)
    if real.dtype not in floats or imag.dtype not in floats:
        return (f"Expected both inputs to be Half, Float or Double tensors but got {scalar_name(real.dtype)} and "
                f"{scalar_name(imag.dtype)}")
    if real.dtype != imag.dtype:
        return (f"Expected object of scalar type {scalar_name(real.dtype)} but got scalar type "
                f"{scalar_name(imag.dtype)} for second argument")
    return None


def _index_func(a):
    """index_add / index_reduce: the source has the input's shape outside ``dim``."""
    self, source, dim = a["self"], a["source"], a["dim"]
    ss, rs = list(self.shape), list(source.shape)
    if ss and rs:
        d = dim + len(ss) if dim < 0 else dim
        if not (0 <= d < len(ss) and d < len(rs)):
            return None  # a dim out of range: PyTorch's meta kernel says so
        del ss[d], rs[d]
    if ss != rs:
        return ("source tensor shape must match self tensor shape, excluding the specified dimension. "
                f"Got self.shape = {list(self.shape)} source.shape = {list(source.shape)}")
    return None


def _masked_scatter(a):
    mask = a["mask"]
    if mask.dtype != torch.bool:
        return f"masked_scatter_ only supports boolean masks, but got mask with dtype {scalar_name(mask.dtype)}"
    return None


def _bucketize(a):
    b = a["boundaries"]
    if b.dim() != 1:
        return f"boundaries tensor must be 1 dimension, but got dim({b.dim()})"
    return None


def _convolution(a):
    if any(p < 0 for p in a["padding"]):
        return "negative padding is not supported"
    if any(p < 0 for p in a["output_padding"] or ()):
        return "negative output_padding is not supported"
    if any(s <= 0 for s in a["stride"]):
        return "non-positive stride is not supported"
    dil = list(a["dilation"])
    if any(d < 0 for d in dil):
        return "dilation should be greater than zero"
    if any(d == 0 for d in dil):
        return f"dilation should be greater than zero, but got {dil}"
    return None


def _uniform(a):
    lo, hi, dt = float(a["from"]), float(a["to"]), a["self"].dtype
    if lo > hi:
        return f"uniform_ expects to return a [from, to) range, but found from={lo:g} > to={hi:g}"
    if dt.is_floating_point and hi - lo > torch.finfo(dt).max:
        return (f"uniform_ expects to-from <= std::numeric_limits<{scalar_name(dt)}>::max(), but found "
                f"to={hi:g} and from={lo:g} which result in to-from to exceed the limit")
    return None


def _as_strided_scatter(a):
    """PyTorch writes ``src`` into a strided view of a copy of the input, whose storage holds
    exactly the input's elements."""
    self, size, stride = a["self"], list(a["size"]), list(a["stride"])
    off = a["storage_offset"] or 0
    if any(n == 0 for n in size):
        return None
    item = self.dtype.itemsize
    need = item * (off + 1 + sum(st * (n - 1) for n, st in zip(size, stride)))
    have = item * self.numel()
    if need > have:
        return (f"setStorage: sizes {size}, strides {stride}, storage offset {off}, and itemsize {item} requiring "
                f"a storage size of {need} are out of bounds for storage of size {have}")
    return None


def _multinomial(a):
    """PyTorch's checks, in its order (``multinomial_out``)."""
    p, n, out = a["self"], a["num_samples"], a.get("out")
    if not 0 < p.dim() <= 2:
        return "prob_dist must be 1 or 2 dim"
    if not p.dtype.is_floating_point:
        return f"multinomial only supports floating-point dtypes for input, got: {scalar_name(p.dtype)}"
    if out is not None and out.dtype != torch.int64:
        return f"multinomial expects Long tensor out, got: {scalar_name(out.dtype)}"
    if n <= 0:
        return "cannot sample n_sample <= 0 samples"
    cats = p.shape[-1]
    if not a["replacement"] and n > cats:
        return "cannot sample n_sample > prob_dist.size(-1) samples without replacement"
    if cats > 1 << 24:
        return "number of categories cannot exceed 2^24"
    return None


RULES = {
    "complex": _complex, "index_add": _index_func, "index_reduce": _index_func, "masked_scatter": _masked_scatter,
    "bucketize": _bucketize, "convolution": _convolution, "_convolution": _convolution, "uniform": _uniform,
    "as_strided_scatter": _as_strided_scatter, "multinomial": _multinomial,
}


def check_call(func, info, args, kwargs, where):
    """Refuse a call PyTorch's CPU kernel refuses on its arguments' metadata (``RULES``)."""
    rule = RULES.get(base_name(func))
    if rule is None:
        return
    msg = rule(bound(func, args, kwargs))
    if msg is not None:
        kind, msg = msg if isinstance(msg, tuple) else (RuntimeError, msg)
        raise refuse(info.name, msg, where, kind) from None


# ---------------------------------------------------------------------------------------
# out= dtypes, by out= overload: eager's message when an out= tensor's dtype is refused (a
# tuple: one per output, the last one for the rest). {res}, {out}: the result's and the out=
# tensor's C++ type names; {RES}, {OUT}: their ScalarType names; {FLAG}: whether the result is
# int32 (searchsorted's out_int32).
_STRUCTURED = "Expected out tensor to have dtype {res}, but got {out} instead"
_ITERATOR = "result type {RES} can't be cast to the desired output type {OUT}"
_CAN_CAST = ("Expected canCast( typeMetaToScalarType(self.dtype()), typeMetaToScalarType(out.dtype())) to be true, "
             "but got false.  (Could this error message be improved?  If so, please report an enhancement request "
             "to PyTorch.)")
_CASTABLE = "Expected {what} to be safely castable from {{RES}} dtype, but got {what} with dtype {{OUT}}"
_SEARCH = ("torch.searchsorted(): output tensor's dtype is wrong, it can only be Int(int32) or Long(int64) depending "
           "on whether out_int32 flag is True, but we got output tensor's dtype {OUT} and out_int32 flag is {FLAG}")


def _table(groups):
    out = {}
    for names, msg in groups:
        out.update(dict.fromkeys(names.split(), msg))
    return out


# The out= tensor must have the result's dtype: structured kernels (which check it when they
# resize out=) and the kernels that compare dtypes themselves.
SAME_DTYPE = _table([
    ("_linalg_det.result _linalg_eigh.eigenvalues _linalg_slogdet.sign _linalg_solve_ex.result _linalg_svd.U "
     "_log_softmax.out _softmax.out addmm.out addmv.out alias_copy.out aminmax.out argmax.out argmin.out "
     "as_strided_copy.out avg_pool2d.out avg_pool3d.out baddbmm.out bmm.out diag_embed.out diagonal_copy.out "
     "expand_copy.out gather.out index_add.out index_copy.out index_reduce.out isin.Tensor_Tensor_out "
     "isin.Tensor_Scalar_out isin.Scalar_Tensor_out linalg_cholesky_ex.L linalg_cross.out linalg_inv_ex.inverse "
     "linalg_ldl_factor_ex.out linalg_ldl_solve.out linalg_lu.out linalg_lu_factor_ex.out linalg_lu_solve.out "
     "linalg_qr.out linalg_vector_norm.out linear.out log_softmax.int_out lu_unpack.out max.dim_max min.dim_min "
     "mm.out permute_copy.out renorm.out scatter.src_out scatter.value_out scatter.reduce_out "
     "scatter.value_reduce_out scatter_add.out scatter_reduce.two_out slice_scatter.out softmax.int_out "
     "sort.values sort.values_stable squeeze_copy.out t_copy.out topk.values transpose_copy.int_out "
     "triangular_solve.X tril.out triu.out unfold_copy.out unsqueeze_copy.out view_copy.out", _STRUCTURED),
    ("abs.out ceil.out clamp.out clamp_max.out clamp_min.out conj_physical.out elu.out floor.out frac.out gelu.out "
     "hardshrink.out hardsigmoid.out hardswish.out hardtanh.out leaky_relu.out lerp.Tensor_out mish.out neg.out "
     "round.out round.decimals_out sgn.out sign.out silu.out softplus.out softshrink.out trunc.out",
     "Found dtype {OUT} but expected {RES}"),
    ("cummax.out cummin.out logcumsumexp.out", "expected scalar_type {RES} but found {OUT}"),
    ("linalg_solve_triangular.out log_sigmoid_forward.output native_batch_norm.out",
     "expected scalar type {RES} but found {OUT}"),
    ("amax.out amin.out", "Expected the dtype for input and out to match, but got {RES} for input's dtype and {OUT} "
                          "for out's dtype."),
    ("complex.out polar.out", "Expected object of scalar type {RES} but got scalar type {OUT} for argument 'out'"),
    ("dot.out vdot.out", "result dtype {OUT} does not match input dtype {RES}"),
    ("histc.out histogram.bin_ct_out histogram.bins_tensor_out",
     ("torch.histogram: input tensor and hist tensor should have the same dtype, but got input {res} and hist {out}",
      "torch.histogram: input tensor and bin_edges tensor should have the same dtype, but got input {res} and "
      "bin_edges {out} for dimension 0")),
    ("searchsorted.Tensor_out searchsorted.Scalar_out bucketize.Tensor_out bucketize.Scalar_out", _SEARCH),
    ("signbit.out", "signbit does not support non-boolean outputs."),
    ("isposinf.out", "isposinf does not support non-boolean outputs."),
    ("isneginf.out", "isneginf does not support non-boolean outputs."),
    ("addbmm.out", "self and mat2 must have the same dtype, but got {OUT} and {RES}"),
    ("mv.out", "addmv input tensors must have the same dtype, but got {OUT}, {RES}, and {RES}"),
    ("heaviside.out", "heaviside is not yet implemented for tensors with different dtypes."),
    ("narrow_copy.out", "Expected self.dtype() == output.dtype() to be true, but got false.  (Could this error "
                        "message be improved?  If so, please report an enhancement request to PyTorch.)"),
    ("hash_tensor.out", "Expected result to be of dtype uint64, but got {OUT}"),
    ("ormqr.out", "torch.ormqr: Expected input and result to have the same dtype, but input has dtype{RES} and "
                  "result has dtype {OUT}"),
    ("frexp.Tensor_out", ("torch.frexp() expects mantissa to have dtype {res} but got {out}",
                          "torch.frexp() expects exponent to have int dtype but got {out}")),
    ("index_select.out", "index_select(): self and result must have the same scalar type"),
    ("masked_select.out", "masked_select(): self and result must have the same scalar type"),
    ("kthvalue.values", ("output values must be of same type as input", "output indices must be of scalar type Long")),
    ("mode.values", ("expected scalar type '{RES}' but got '{OUT}' for values output",
                     "expected scalar type '{RES}' but got '{OUT}' for indices output")),
    ("nan_to_num.out", "nan_to_num: dtype of out: {OUT} should be same as input: {RES}"),
    ("take.out", "take(): self and out expected to have the same dtype, but got self.dtype = {RES} and "
                 "out.dtype = {OUT}"),
    ("where.self_out", "Expected out type to be {RES} but got {OUT}"),
])
# all/any: a bool out= always, or the result's dtype (uint8 for a uint8 input).
BOOL_OR_SAME = _table([("all.all_out all.out all.dims_out", "all only supports bool tensor for result, got: {OUT}"),
                       ("any.all_out any.out any.dims_out", "any only supports bool tensor for result, got: {OUT}")])
# The result is cast to the out= tensor's dtype, if it can be (torch.can_cast): every pointwise
# op (TensorIterator), and these; with eager's exception type.
CASTS = {name: (RuntimeError, msg) for name, msg in _table([
    ("addr.out floor_divide.out mean.out std.correction_out threshold.out var.correction_out", _ITERATOR),
    ("max.unary_out min.unary_out", _CAN_CAST),
    ("mean.dtype_out", "mean.dtype_out(): input types can't be cast to the desired output type {OUT}"),
    ("logsumexp.out", "logsumexp(): Expected floating point type for result tensor, but got: {OUT}"),
    ("cholesky.out", "cholesky: " + _CASTABLE.format(what="result")),
    ("cholesky_inverse.out", "cholesky_inverse: " + _CASTABLE.format(what="result")),
    ("cholesky_solve.out", "cholesky_solve: " + _CASTABLE.format(what="result")),
    ("geqrf.a", "torch.geqrf: " + _CASTABLE.format(what="a")),
    ("linalg_householder_product.out", "torch.linalg.householder_product: " + _CASTABLE.format(what="result")),
    ("linalg_lstsq.out", "torch.linalg.lstsq: " + _CASTABLE.format(what="solution")),
    ("linalg_pinv.out linalg_pinv.atol_rtol_tensor_out linalg_pinv.atol_rtol_float_out",
     "linalg.pinv: " + _CASTABLE.format(what="result")),
    ("linalg_eig.out", ("torch.linalg.eig: " + _CASTABLE.format(what="eigenvalues"),
                        "torch.linalg.eig: " + _CASTABLE.format(what="eigenvectors"))),
    ("linalg_eigvals.out", "torch.linalg.eigvals: " + _CASTABLE.format(what="eigenvalues")),
]).items()}
CASTS.update(dict.fromkeys(("cat.out", "stack.out", "_chunk_cat.out"),
                           (TypeError, "torch.cat(): input types can't be cast to the desired output type {OUT}")))
_TENSOR_ITERATOR = (RuntimeError, _ITERATOR)


def _out_name(func) -> str:
    s = func._schema
    return s.name.split("::", 1)[-1] + ("." + s.overload_name if s.overload_name else "")


def _nth(text, i):
    return text if isinstance(text, str) else text[min(i, len(text) - 1)]


def check_out_dtypes(func, info, kwargs, results, where):
    """Refuse out= tensors of a dtype eager refuses for this op; ``results`` are the op's
    results (meta tensors of the functional form), in the order of ``info.written``."""
    name = _out_name(func)
    same, cast, also = SAME_DTYPE.get(name), None, None
    if same is None:
        same = BOOL_OR_SAME.get(name)
        if same is not None:
            also = torch.bool
    if same is None:
        cast = CASTS.get(name)
        if cast is None:
            if torch.Tag.pointwise not in func.tags:
                return  # any other op: its result is converted to the out= dtype
            cast = _TENSOR_ITERATOR
    for i, w in enumerate(info.written):
        out = (kwargs or {}).get(w)
        if i >= len(results) or not isinstance(out, torch.Tensor) or not isinstance(results[i], torch.Tensor):
            continue
        res, got = results[i].dtype, out.dtype
        if res == got or got == also or (cast is not None and torch.can_cast(res, got)):
            continue
        kind, text = cast if cast is not None else (RuntimeError, same)
        msg = _nth(text, i).format(res=cpp_name(res), out=cpp_name(got), RES=scalar_name(res), OUT=scalar_name(got),
                                   FLAG=res == torch.int32)
        raise refuse(info.name, msg, where, kind) from None


# ---------------------------------------------------------------------------------------
# Memory overlap of out= with the inputs. By out= overload: the inputs that may share no
# element with an out= tensor (PyTorch's assert_no_overlap), and those that may share all of
# its elements or none (assert_no_partial_overlap). An input argument that is a list: each of
# its tensors. Every other pointwise out= op: each tensor input, partial overlap refused.
NO_OVERLAP = {
    "kthvalue.values": ("self",), "masked_select.out": ("self", "mask"), "take.out": ("self", "index"),
    "index_select.out": ("self", "index"), "index_select.dimname_out": ("self", "index"), "gather.out": ("self",),
    "index.Tensor_out": ("self", "indices"), "index_add.out": ("index", "source"),
    "index_copy.out": ("index", "source"), "index_reduce.out": ("index", "source"),
    "scatter.src_out": ("index", "src"), "scatter.reduce_out": ("index", "src"), "scatter.value_out": ("index",),
    "scatter.value_reduce_out": ("index",), "scatter_add.out": ("index", "src"),
    "scatter_reduce.two_out": ("index", "src"), "linalg_cross.out": ("self", "other"), "cat.out": ("tensors",),
    "stack.out": ("tensors",), "nonzero.out": ("self",),
}
PARTIAL_OVERLAP = {
    "gather.out": ("index",), "index_add.out": ("self",), "index_reduce.out": ("self",), "scatter.src_out": ("self",),
    "scatter.reduce_out": ("self",), "scatter.value_out": ("self",), "scatter.value_reduce_out": ("self",),
    "scatter_add.out": ("self",), "scatter_reduce.two_out": ("self",), "where.self_out": ("condition", "self", "other"),
    "addmm.out": ("self",), "addmv.out": ("self",), "baddbmm.out": ("self",), "addbmm.out": ("self",),
    "addr.out": ("self", "vec1", "vec2"), "bernoulli.out": ("self",), "cumsum.out": ("self",),
    "cumprod.out": ("self",), "logcumsumexp.out": ("self",), "gelu.out": ("self",), "hardshrink.out": ("self",),
    "softplus.out": ("self",), "softshrink.out": ("self",), "elu.out": ("self",), "leaky_relu.out": ("self",),
    "hardsigmoid.out": ("self",), "hardswish.out": ("self",), "hardtanh.out": ("self",), "mish.out": ("self",),
    "renorm.out": ("self",), "max.dim_max": ("self",),
    "min.dim_min": ("self",), "mode.values": ("self",), "sort.values": ("self",), "sort.values_stable": ("self",),
    "topk.values": ("self",), "linalg_solve_triangular.out": ("B",), "linear.out": ("bias",),
    "triangular_solve.X": ("self",),
}
_NOT_TENSOR_ITERATOR = ("mvlgamma.out",)  # pointwise, but eager allows a partial overlap


def overlap_rule(func, info):
    """For an out= op: ``(((argument position, name, any overlap refused), ...))`` of the
    inputs ``check_overlap`` looks at, or None when PyTorch checks none."""
    name = _out_name(func)
    full, partial = NO_OVERLAP.get(name, ()), PARTIAL_OVERLAP.get(name, ())
    if not full and not partial:
        if torch.Tag.pointwise not in func.tags or name in _NOT_TENSOR_ITERATOR:
            return None
        partial = tuple(a.name for a in func._schema.arguments
                        if a.name not in info.written and "Tensor" in str(a.type))
    rule = []
    for i, a in enumerate(func._schema.arguments):
        if a.name in full or a.name in partial:
            rule.append((i if not a.kwarg_only else 1 << 30, a.name, a.name in full))
    return tuple(rule) or None


NO, FULL, PARTIAL, TOO_HARD = "no", "full", "partial", "too hard"


def _dense(shape, stride) -> bool:
    """PyTorch's ``is_non_overlapping_and_dense``: the elements fill a block of the storage
    without gaps or repeats, in some order of the dimensions (dimensions of size 1 aside)."""
    expected = 1
    for n, st in sorted(((n, st) for n, st in zip(shape, stride) if n != 1), key=lambda x: (x[1], x[0])):
        if st != expected:
            return False
        expected *= n
    return True


def _extent(t, new_shape=None):
    """(first element, end, strides) of ``t`` in its storage; with ``new_shape``, as it will be
    once resized (an out= tensor PyTorch resizes to the result's shape before it checks); None
    when PyTorch could not say (not dense) or lazyxla cannot (an offset it cannot work out)."""
    s = t._state
    if s.meta.dtype != s.storage.meta.dtype:
        return None
    shape, stride = tuple(s.meta.shape), tuple(s.meta.stride)
    if new_shape is not None and tuple(new_shape) != shape:
        shape = tuple(new_shape)
        stride, acc = [], 1
        for n in reversed(shape):
            stride.append(acc)
            acc *= max(n, 1)
        stride = tuple(reversed(stride))
    if not _dense(shape, stride):
        return None
    off = storage_offset(s)
    if off is None:
        return None
    n = 1
    for d in shape:
        n *= d
    return off, off + n, stride


def overlap(out, inp, out_shape=None) -> str:
    """PyTorch's ``get_overlap_status`` of two lazy tensors (``out`` taken at ``out_shape``)."""
    if out is inp or out._state is inp._state:
        return FULL
    if out._state.storage is not inp._state.storage:
        return NO
    a, b = _extent(out, out_shape), _extent(inp)
    if a is None or b is None:
        return TOO_HARD
    if a[0] == a[1] or b[0] == b[1]:
        return NO
    if a[:2] == b[:2]:
        return FULL if a[2] == b[2] else PARTIAL
    return PARTIAL if a[0] < b[1] and b[0] < a[1] else NO


_OVERLAP_MSG = ("unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
                "single memory location. Please clone() the tensor before performing the operation.")


def check_overlap(rule, info, sig, args, kwargs):
    """Refuse an out= tensor that shares elements with an input, as ``rule`` (``overlap_rule``)
    says eager does. Cheap unless an out= tensor and an input share a storage. ``sig``: the
    call's signature, when it records a node (its output shapes: out= is resized to them)."""
    outs = [(kwargs or {}).get(w) for w in info.written]
    for pos, name, full in rule:
        v = args[pos] if pos < len(args) else (kwargs or {}).get(name)
        for t in (v if isinstance(v, (list, tuple)) else (v,)):
            if t is None or not is_lazy(t):
                continue
            st = t._state.storage
            for i, o in enumerate(outs):
                if not is_lazy(o) or o._state.storage is not st:
                    continue
                shape = sig.outs[i].shape if sig is not None and i < len(sig.outs) else None
                status = overlap(o, t, shape)
                if status == PARTIAL or (full and status == FULL):
                    raise LazyXlaError(f"{info.name}: {_OVERLAP_MSG} (at {fmt_where(user_frame(1))})")
