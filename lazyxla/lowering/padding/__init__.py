"""Padding rules: how each op family is lowered when a dimension is padded to its bound.

A padded program (``lazyxla.dynamic``) keeps one invariant: along every padded dimension the
real values lead (indices ``0 .. real-1``) and what follows is unspecified, possibly NaN. A
dimension's *kind* says where its real values are: None (not padded), ``("p", v, a, b)`` (real
size ``a*s_v + b`` for size variable ``v``, leading), or ``("m", ((size, kind), ...))``: several
dimensions merged by a reshape (``[b, S] -> [b*S]``), each keeping its own kind, so the real
values are a pattern rather than a block (only elementwise ops, reductions and the reshape
back may touch such a dimension).

``RULES`` maps an op (``OpOverload.name()``, or lazyxla's own op name) to its ``Rule``; one
table, by family. A rule's ``check(ctx)`` (a ``Ctx``) runs once when the padded graph is
built: it returns the output kinds, or a string saying why the op cannot be padded exactly
(the graph then stays exact-shape). ``ctx.moving`` holds the template's integers that follow a
size (``view``'s sizes, ``slice``'s end): each rule accepts only those it knows the meaning of.
Its ``lower(inner, vals, sizes, info)`` computes the op at the bounds:
``inner`` is the op's own signature at the padded shapes, ``sizes`` the size variables' real
values (int32 scalars, program inputs). What a rule masks: whatever the op would mix across a
padded dimension (reductions, contractions, softmax, losses, scatters) gets the op's identity
in the padding; everything else computes on the padding and leaves it behind.

May touch: nothing; reads ``registry`` through ``program.lower_call``.


Modules: ``core`` (kinds, masks, ``Ctx``, ``Rule``, ``lower_padded``, the elementwise rule),
``layout`` (views, slices, writes into them, cat, flip, factories), ``reductions`` (reductions,
softmax, matrix products), ``nn`` (layer norm, embeddings and indexing, losses and
``lazyxla::cross_entropy``), ``attention``
(``lazyxla::attention`` and its backward: padded keys masked out); this file is the table. May touch: nothing; reads ``registry`` through ``program.lower_call``.
"""
from __future__ import annotations

import torch

from .core import Ctx, Rule, lower_padded, overload_name, pointwise  # noqa: F401
from .core import _highest, _lowest
from .attention import attention, attention_backward, attention_backward_lower, attention_lower
from .layout import (_moved, _permute, _sizes_at, _t, _transpose, _unsqueeze, along, cat, expand, flip, flip_lower,
                     scatter_view, scatter_view_lower, select, select_lower, slice_, slice_lower, squeeze, stack, view)
from .nn import (cross_entropy, cross_entropy_lower, index, index_lower, isin, layer_norm, layer_norm_backward,
                 layer_norm_backward_lower, nll, nll_lower, refuse, rows, summed_operand)
from .reductions import (_var, _var_lower, contraction, contraction_lower, reduction, softmax_backward_lower,
                         softmax_lower)


_zero = lambda dt: 0  # noqa: E731
_one = lambda dt: 1  # noqa: E731

RULES = {}


def _add(names, rule):
    for n in names.split():
        RULES[n if "::" in n else "aten::" + n] = rule


POINTWISE = Rule(pointwise)
_add("lazyxla::convert _to_copy.default clone.default alias.default detach.default lift_fresh_copy.default "
     "copy.default fill.Scalar fill.Tensor zeros_like.default ones_like.default empty_like.default "
     "full_like.default rand_like.default randn_like.default native_dropout.default bernoulli.p "
     "native_dropout_backward.default _masked_scale.default", POINTWISE)
_add("view.default _unsafe_view.default reshape.default _reshape_alias.default", Rule(view, sizes=True))
_add("expand.default", Rule(expand, sizes=True))
_add("permute.default", Rule(_moved(_permute)))
_add("transpose.int", Rule(_moved(_transpose)))
_add("t.default", Rule(_moved(_t)))
_add("unsqueeze.default", Rule(_moved(_unsqueeze)))
_add("squeeze.dim squeeze.dims squeeze.default", Rule(squeeze))
_add("slice.Tensor", Rule(slice_, slice_lower, sizes=True))
_add("select.int", Rule(select, select_lower, sizes=True))
_add("cat.default", Rule(cat))
_add("select_scatter.default slice_scatter.default", Rule(scatter_view, scatter_view_lower, sizes=True))
_add("stack.default", Rule(stack))
_add("full.default zeros.default ones.default empty.memory_format scalar_tensor.default", Rule(_sizes_at({0}), sizes=True))
_add("new_zeros.default new_ones.default new_empty.default new_full.default empty_strided.default",
     Rule(_sizes_at({1}), sizes=True))
_add("arange.default arange.start arange.start_step", Rule(_sizes_at({0, "end"}), sizes=True))
_add("sum.dim_IntList sum.default nansum.default", reduction(_zero))
_add("mean.dim mean.default", reduction(_zero, count="mean"))
_add("amax.default max.dim argmax.default logsumexp.default", reduction(_lowest))
_add("amin.default min.dim argmin.default", reduction(_highest))
_add("max.default", reduction(_lowest, dim_arg=9))
_add("min.default", reduction(_highest, dim_arg=9))
_add("any.dim any.dims any.default", reduction(lambda dt: False))
_add("all.dim all.dims all.default", reduction(lambda dt: True))
_add("prod.dim_int prod.default", reduction(_one))
_add("linalg_vector_norm.default", reduction(_zero, dim_arg=2))
_add("var.correction std.correction var_mean.correction", Rule(_var, _var_lower))
_add("_softmax.default _log_softmax.default", Rule(along(1), softmax_lower))
_add("_softmax_backward_data.default _log_softmax_backward_data.default", Rule(along(2), softmax_backward_lower))
_add("cumsum.default cumprod.default", Rule(along(1)))  # the real values lead: a prefix scan is exact
_add("mm.default bmm.default addmm.default baddbmm.default mv.default addmv.default dot.default",
     Rule(contraction, contraction_lower))
_add("native_layer_norm.default", Rule(layer_norm))
_add("native_layer_norm_backward.default", Rule(layer_norm_backward, layer_norm_backward_lower))
_add("embedding.default index_select.default gather.default", Rule(rows))
_add("index.Tensor", Rule(index, index_lower))
_add("isin.Tensor_Tensor isin.Tensor_Scalar", Rule(isin))
_add("embedding_dense_backward.default", Rule(rows, summed_operand(0)))
_add("nll_loss_forward.default nll_loss_backward.default nll_loss2d_forward.default "
     "nll_loss2d_backward.default", Rule(nll, nll_lower))
_add("flip.default", Rule(flip, flip_lower))
_add("lazyxla::cross_entropy.default lazyxla::cross_entropy_backward.default",
     Rule(cross_entropy, cross_entropy_lower))
_add("lazyxla::attention.default", Rule(attention, attention_lower))
_add("lazyxla::attention_backward.default", Rule(attention_backward, attention_backward_lower))
for _name in ("roll.default", "sort.default", "sort.stable", "topk.default", "argsort.default"):
    RULES["aten::" + _name] = Rule(refuse("moves values along a dimension (not padded yet)"))


def rule_for(sig):
    """The padding rule of a node's op: by the overload's name, then pointwise ops by
    PyTorch's tag; None when the op has none."""
    f = sig.func
    if f is None:
        return RULES.get(sig.op)
    r = RULES.get(overload_name(f))
    if r is not None:
        return r
    if torch.Tag.pointwise in f.tags:
        return POINTWISE
    return None


def opaque(sig) -> bool:
    """Signatures lowered from more than their template and outputs (writes through views,
    compiled regions, fused optimizers): never padded, so every integer is structure."""
    return sig.op in ("lazyxla::view_scatter", "lazyxla::region") or (sig.func is None and sig.op not in RULES
                                                                       and sig.lower is not None)
