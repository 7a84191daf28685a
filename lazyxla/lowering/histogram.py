"""Histograms with PyTorch's CPU rules: ``histogram`` (bins as a count or as a tensor of
edges) and ``histogramdd``'s three ops (``_histogramdd_bin_edges``,
``_histogramdd_from_bin_cts``, ``_histogramdd_from_bin_tensors``), with optional range,
weight and density. PyTorch has no meta kernel for any of them: their shape rules are here
(the shapes follow from the bin counts or the edge tensors' lengths, never the values).

Rules followed (PyTorch's):
- Edges from a bin count: ``range`` if given, else the input's minimum and maximum (0 and 1
  for an empty input), each dimension on its own; an empty range is widened by 0.5 each way
  (in float64). The edges are PyTorch's CPU linspace in the input dtype: with the step
  (end - start) / bins, the first half start + step * i, the second half end - step * (bins - i),
  each a fused multiply-add (emulated: exact but for a rounding tie that an endpoint many
  orders of magnitude smaller than the range would break).
- An element goes to the bin whose edges hold it, the last bin closed on the right: the
  binary search PyTorch's kernel does (``searchsorted`` on the edges); an element outside
  the outer edges, or NaN, is not counted. Each element adds its weight (1 without one).
- ``density``: the counts divided by their sum and by each bin's width along each dimension
  (an empty histogram gives NaNs, as PyTorch's does).

PyTorch refuses a data range that is not finite (an infinite or NaN element and no
``range``): the device cannot raise there, so its edges are not finite instead.
Touches only the registries.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from ..xla.widths import long_dtype
from ..xla.client import jnp_dtype
from .registry import register, shape_rule


# ---------------------------------------------------------------------------------------
# Shape rules.
def _check_input(name, x, weight, n=None):
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"torch.{name}: input tensor and bins tensors should have the same dtype (float)")
    if weight is not None and tuple(weight.shape) != (tuple(x.shape[:-1]) if n is not None else tuple(x.shape)):
        raise RuntimeError(f"torch.{name}: if weight tensor is provided it should have the same shape as the "
                           f"input tensor excluding its innermost dimension")
    if weight is not None and weight.dtype != x.dtype:
        raise RuntimeError(f"torch.{name}: if weight tensor is provided, input tensor and weight tensor should "
                           f"have the same dtype")


def _check_counts(name, bins, rng, n):
    if len(bins) != n:
        raise RuntimeError(f"torch.{name}: expected {n} sequences of bin edges for a {n}-dimensional histogram "
                           f"but got {len(bins)}")
    for b in bins:
        if b <= 0:
            raise RuntimeError(f"torch.{name}(): bins must be > 0, but got {b} for dimension")
    if rng is not None:
        if len(rng) != 2 * n:
            raise RuntimeError(f"torch.{name}: for a {n}-dimensional histogram range should have {2 * n} elements, "
                               f"but got {len(rng)}")
        for d in range(n):
            lo, hi = rng[2 * d], rng[2 * d + 1]
            if not (math.isfinite(lo) and math.isfinite(hi)):
                raise RuntimeError(f"torch.{name}: dimension {d}'s range [{lo}, {hi}] is not finite")
            if lo > hi:
                raise RuntimeError(f"torch.{name}: min should not exceed max, but got min {lo} max {hi} for "
                                   f"dimension {d}")


def _meta(shape, dtype):
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


@shape_rule("histogram.bin_ct")
def _histogram_ct_shapes(x, bins=100, *, range=None, weight=None, density=False):
    _check_input("histogram", x, weight)
    _check_counts("histogram", [bins], range, 1)
    return _meta((bins,), x.dtype), _meta((bins + 1,), x.dtype)


@shape_rule("histogram.bins_tensor")
def _histogram_tensor_shapes(x, bins, *, weight=None, density=False):
    _check_input("histogram", x, weight)
    if bins.dtype != x.dtype:
        raise RuntimeError(f"torch.histogram: input tensor and bins tensors should have the same dtype, but got "
                           f"input with dtype {x.dtype} and bins with dtype {bins.dtype}")
    if bins.dim() != 1 or bins.numel() == 0:
        raise RuntimeError("torch.histogram: bins tensor should have one dimension and at least 1 element")
    return _meta((bins.numel() - 1,), x.dtype), _meta((bins.numel(),), x.dtype)


def _dd_dims(x):
    if x.dim() < 2:
        raise RuntimeError("torch.histogramdd: input tensor should have at least 2 dimensions, but got "
                           f"{x.dim()}")
    return x.shape[-1]


@shape_rule("_histogramdd_bin_edges.default")
def _histogramdd_edges_shapes(x, bins, *, range=None, weight=None, density=False):
    n = _dd_dims(x)
    _check_input("histogramdd", x, weight, n)
    _check_counts("histogramdd", list(bins), range, n)
    return [_meta((b + 1,), x.dtype) for b in bins]


@shape_rule("_histogramdd_from_bin_cts.default")
def _histogramdd_cts_shapes(x, bins, *, range=None, weight=None, density=False):
    n = _dd_dims(x)
    _check_input("histogramdd", x, weight, n)
    _check_counts("histogramdd", list(bins), range, n)
    return _meta(tuple(bins), x.dtype)


@shape_rule("_histogramdd_from_bin_tensors.default")
def _histogramdd_tensors_shapes(x, bins, *, weight=None, density=False):
    n = _dd_dims(x)
    _check_input("histogramdd", x, weight, n)
    if len(bins) != n:
        raise RuntimeError(f"torch.histogramdd: expected {n} sequences of bin edges for a {n}-dimensional "
                           f"histogram but got {len(bins)}")
    for b in bins:
        if b.dtype != x.dtype:
            raise RuntimeError("torch.histogramdd: input tensor and bins tensors should have the same dtype")
        if b.dim() != 1 or b.numel() == 0:
            raise RuntimeError("torch.histogramdd: bins tensor should have one dimension and at least 1 element")
    return _meta(tuple(b.numel() - 1 for b in bins), x.dtype)


# ---------------------------------------------------------------------------------------
# Lowerings.
def _outer_edges(x, rng, n):
    """(lo, hi) per dimension, float64 [n] each: ``range``, else the data's min and max (0
    and 1 without data); an empty range widened by 0.5 each way."""
    if rng is not None:
        lo = jnp.asarray(rng[0::2], jnp.float64)
        hi = jnp.asarray(rng[1::2], jnp.float64)
    elif x.shape[0] == 0:
        lo, hi = jnp.zeros((n,), jnp.float64), jnp.ones((n,), jnp.float64)
    else:
        lo = jnp.min(x, axis=0).astype(jnp.float64)
        hi = jnp.max(x, axis=0).astype(jnp.float64)
    same = lo == hi
    return jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)


def _fma_index(a, i, c):
    """a * i + c rounded once (a fused multiply-add), for float64 ``a``, ``c`` and integers
    0 <= i < 2^26, whatever XLA fuses: a splits into a high part of 27 significant bits and
    the rest, so that both products are exact; the sum is then taken without loss (two-sum)
    and rounded at the end."""
    bits = lax.bitcast_convert_type(a, jnp.uint64)
    hi = lax.bitcast_convert_type(bits & jnp.uint64(~((1 << 26) - 1) & (2 ** 64 - 1)), jnp.float64)
    lo = a - hi
    fi = i.astype(jnp.float64)
    ph, pl = hi * fi, lo * fi
    s = c + ph
    bb = s - c
    t = (c - (s - bb)) + (ph - bb)
    return s + (t + pl)


def _linspace(lo, hi, steps, dt):
    """PyTorch's CPU linspace in dtype ``dt``: start and end rounded to it, the step computed
    in it, each value one fused multiply-add: start + step * i, or end - step * (steps - 1
    - i) for the second half. Below float64 the products and sums are exact in float64 and
    rounded once; in float64 ``_fma_index`` rounds once."""
    start, end = lo.astype(dt), hi.astype(dt)
    diff = end - start
    # a true division: XLA turns one by a constant into a product with its rounded reciprocal
    step = diff / jnp.where(diff != diff, diff, jnp.asarray(steps - 1, dt))
    start, end, step = start.astype(jnp.float64), end.astype(jnp.float64), step.astype(jnp.float64)
    i = jnp.arange(steps)
    j = steps - 1 - i
    if dt == jnp.float64:
        first, second = _fma_index(step, i, start), _fma_index(-step, j, end)
    else:
        first, second = start + step * i.astype(jnp.float64), end - step * j.astype(jnp.float64)
    return jnp.where(i < steps // 2, first, second).astype(dt)


def _count_edges(x2, bins, rng):
    """The edges of each dimension for bin counts ``bins``: x2 is the input as [points, n]."""
    n = x2.shape[1]
    lo, hi = _outer_edges(x2, rng, n)
    return [_linspace(lo[d], hi[d], b + 1, x2.dtype) for d, b in enumerate(bins)]


def _hist(x2, edges, weight, density):
    """The (weighted) counts of the points x2 [points, n] in the bins the edges make."""
    shape = tuple(e.shape[0] - 1 for e in edges)
    dt = x2.dtype
    flat = jnp.zeros((x2.shape[0],), long_dtype())
    inside = jnp.ones((x2.shape[0],), bool)
    for d, e in enumerate(edges):
        v = x2[:, d]
        inside &= (v >= e[0]) & (v <= e[-1])                       # NaN: outside
        pos = jnp.searchsorted(e, v, side="right") - 1
        pos = jnp.clip(jnp.where(pos == e.shape[0] - 1, pos - 1, pos), 0, shape[d] - 1)
        flat = flat * shape[d] + pos
    w = jnp.ones((x2.shape[0],), dt) if weight is None else weight.reshape(-1).astype(dt)
    hist = jnp.zeros((math.prod(shape),), dt).at[flat].add(jnp.where(inside, w, 0)).reshape(shape)
    if density:
        hist = hist / jnp.sum(hist)
        for d, e in enumerate(edges):
            widths = (e[1:] - e[:-1]).reshape((1,) * d + (-1,) + (1,) * (len(shape) - d - 1))
            hist = hist / widths
    return hist


@register("histogram.bin_ct")
def histogram_bin_ct(sig, x, bins=100, *, range=None, weight=None, density=False):
    x2 = x.reshape(-1, 1).astype(jnp_dtype(sig.outs[0].dtype))
    edges = _count_edges(x2, [bins], range)
    return _hist(x2, edges, weight, density), edges[0]


@register("histogram.bins_tensor")
def histogram_bins_tensor(sig, x, bins, *, weight=None, density=False):
    x2 = x.reshape(-1, 1)
    return _hist(x2, [bins], weight, density), bins


def _points(x):
    return x.reshape(-1, x.shape[-1])


@register("_histogramdd_bin_edges.default")
def histogramdd_bin_edges(sig, x, bins, *, range=None, weight=None, density=False):
    return tuple(_count_edges(_points(x), list(bins), range))


@register("_histogramdd_from_bin_cts.default")
def histogramdd_from_bin_cts(sig, x, bins, *, range=None, weight=None, density=False):
    x2 = _points(x)
    return _hist(x2, _count_edges(x2, list(bins), range), weight, density)


@register("_histogramdd_from_bin_tensors.default")
def histogramdd_from_bin_tensors(sig, x, bins, *, weight=None, density=False):
    return _hist(_points(x), list(bins), weight, density)
