"""Order statistics with PyTorch's CPU tie rules: ``kthvalue``, ``median`` and ``nanmedian``
(of the whole tensor, and along a dim with indices), ``mode``.

Which index PyTorch's CPU kernels return among equal values is a consequence of their
algorithms, so where values repeat these lowerings run the same algorithms:

- ``kthvalue``: ATen's ``quick_select_template`` (median-of-three quickselect, NaN the
  largest), swap for swap;
- ``median``/``nanmedian`` along a dim: ``std::nth_element`` with a comparator that orders
  equal values by index, so the index is that of the k-th element of a stable sort (NaN
  last); ``median`` of a row holding a NaN is its first NaN; ``nanmedian`` of an all-NaN row
  is ``nth_element`` over equivalent elements, whose answer depends on the length only
  (worked out on the host);
- ``mode``: libstdc++'s ``std::sort`` (introsort, heapsort past the depth limit, then a final
  insertion sort) of (value, index) pairs compared by value; the mode is the longest run
  (the smallest value among equally long runs) and its index that of the run's last pair.

Rows without repeated values take a sort instead (any algorithm gives the same answer
there); the emulations run as ``lax.while_loop``s only when some row needs them. Values
always equal PyTorch's: k = (n - 1) // 2 is the lower median. Touches only the registry.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ..xla.widths import long_dtype
from .registry import register


# ---------------------------------------------------------------------------------------
# Rows: the reduced dim moved last, the others flattened.
def _rows(x, dim):
    d = dim % x.ndim
    xm = jnp.moveaxis(x, d, -1)
    return xm.reshape((-1, xm.shape[-1])), xm.shape[:-1], d


def _unrows(v, lead, d, keepdim):
    v = v.reshape(lead)
    return jnp.expand_dims(v, d) if keepdim else v


def _isnan(v):
    return jnp.isnan(v) if jnp.issubdtype(v.dtype, jnp.inexact) else jnp.zeros(jnp.shape(v), bool)


def _gt_nan_largest(a, b):
    """ATen's ``(isnan(a) && !isnan(b)) || a > b``."""
    return (_isnan(a) & ~_isnan(b)) | (a > b)


def _put(ix, i, v):
    return lax.dynamic_update_index_in_dim(ix, v, i, 0)


def _swap(ix, a, b):
    """Swap positions a and b of a permutation (a == b: nothing). The emulations below move
    only the permutation of a row and read its values through it: ``v[ix[i]]``."""
    ia, ib = ix[a], ix[b]
    return _put(_put(ix, a, ib), b, ia)


def _per_row(fn, rows):
    """``fn`` on each row in turn (``lax.map``: a loop of scalar steps compiles far faster
    than the same loop batched over rows)."""
    return lax.map(fn, rows)


def _stable_order(rows):
    """Per row, the positions in stable ascending order with NaN last (-0.0 == 0.0)."""
    return jnp.argsort(rows, axis=-1, stable=True)


def _repeats(rows, value):
    """Whether ``value`` (one per row) occurs more than once in its row (NaN equal to NaN)."""
    v = value[:, None]
    same = (rows == v) | (_isnan(rows) & _isnan(v))
    return jnp.sum(same, axis=-1) > 1


# ---------------------------------------------------------------------------------------
# kthvalue: ATen's quick_select_template.
def _quickselect(v, k):
    """(value, index) that ATen's quickselect leaves at position k of one row."""
    n = v.shape[0]
    gt = _gt_nan_largest

    def body(s):
        ix, lo, hi = s
        two = hi == lo + 1        # two elements: one compare-and-swap, then done
        p = lo + (hi - lo) // 2
        ix = _swap(ix, p, jnp.where(two, p, lo + 1))
        a = jnp.where(two, lo, lo + 1)
        ix = _swap(ix, a, jnp.where(gt(v[ix[a]], v[ix[hi]]), hi, a))
        ix = _swap(ix, lo, jnp.where(~two & gt(v[ix[lo]], v[ix[hi]]), hi, lo))
        ix = _swap(ix, lo + 1, jnp.where(~two & gt(v[ix[lo + 1]], v[ix[lo]]), lo, lo + 1))
        piv = v[ix[lo]]

        def step(q):
            ix, i, j, _ = q
            i = lax.while_loop(lambda i: (i < hi) & gt(piv, v[ix[i]]), lambda i: i + 1, i + 1)
            j = lax.while_loop(lambda j: (j > lo) & gt(v[ix[j]], piv), lambda j: j - 1, j - 1)
            stop = j < i
            return _swap(ix, i, jnp.where(stop, i, j)), i, j, stop

        ix2, i, j, _ = lax.while_loop(lambda q: ~q[3], step, (ix, lo + 1, hi, two))
        ix = jnp.where(two, ix, _swap(ix2, lo, j))
        return (ix, jnp.where(two, hi, jnp.where(j <= k, i, lo)), jnp.where(two, hi, jnp.where(j >= k, j - 1, hi)))

    init = (jnp.arange(n, dtype=long_dtype()), jnp.asarray(0, long_dtype()), jnp.asarray(n - 1, long_dtype()))
    ix, _, _ = lax.while_loop(lambda s: s[2] > s[1], body, init)
    return v[ix[k]], ix[k]


@register("kthvalue.default", zero_d="input")
def kthvalue(sig, x, k, dim=-1, keepdim=False):
    rows, lead, d = _rows(x, dim)
    order = _stable_order(rows)
    pos = order[:, k - 1]
    value = jnp.take_along_axis(rows, pos[:, None], axis=1)[:, 0]
    # Only a repeated k-th value makes the algorithm matter.
    value, index = lax.cond(jnp.any(_repeats(rows, value)),
                            lambda r: _per_row(lambda row: _quickselect(row, k - 1), r),
                            lambda r: (value, pos), rows)
    return _unrows(value, lead, d, keepdim), _unrows(index, lead, d, keepdim)


# ---------------------------------------------------------------------------------------
# median / nanmedian.
def _nth_of_equivalents(n, nth):
    """Which original position libstdc++'s ``nth_element`` leaves at ``nth`` when every
    comparison is false (an all-NaN row of ``nanmedian``): a function of n alone."""
    idx = list(range(n))
    first, last = 0, n
    while last - first > 3:
        mid = first + (last - first) // 2
        idx[first], idx[mid] = idx[mid], idx[first]   # the median of three, all equivalent
        lo, hi = first + 1, last
        while True:                                     # the unguarded partition
            hi -= 1
            if not lo < hi:
                break
            idx[lo], idx[hi] = idx[hi], idx[lo]
            lo += 1
        if lo <= nth:
            first = lo
        else:
            last = lo
    return idx[nth]


def _median_rows(rows, ignore_nan):
    n = rows.shape[1]
    order = _stable_order(rows)
    nan = _isnan(rows)
    if not ignore_nan:
        pos = order[:, (n - 1) // 2]
        has_nan = jnp.any(nan, axis=-1)
        pos = jnp.where(has_nan, jnp.argmax(nan, axis=-1), pos)
    else:
        m = n - jnp.sum(nan, axis=-1)
        k = jnp.where(m > 0, (m - 1) // 2, 0)
        pos = jnp.take_along_axis(order, k[:, None], axis=1)[:, 0]
        pos = jnp.where(m > 0, pos, _nth_of_equivalents(n, 0))
    value = jnp.take_along_axis(rows, pos[:, None], axis=1)[:, 0]
    return value, pos


@register("median.dim", zero_d="input")
def median_dim(sig, x, dim, keepdim=False):
    rows, lead, d = _rows(x, dim)
    v, i = _median_rows(rows, False)
    return _unrows(v, lead, d, keepdim), _unrows(i, lead, d, keepdim)


@register("nanmedian.dim", zero_d="input")
def nanmedian_dim(sig, x, dim, keepdim=False):
    rows, lead, d = _rows(x, dim)
    v, i = _median_rows(rows, True)
    return _unrows(v, lead, d, keepdim), _unrows(i, lead, d, keepdim)


@register("median.default", zero_d="input")
def median(sig, x):
    return _median_rows(x.reshape(1, -1), False)[0][0]


@register("nanmedian.default", zero_d="input")
def nanmedian(sig, x):
    return _median_rows(x.reshape(1, -1), True)[0][0]


# ---------------------------------------------------------------------------------------
# mode: libstdc++'s std::sort of (value, index) pairs, compared by value.
_THRESHOLD = 16  # libstdc++'s _S_threshold: shorter ranges are left to the insertion sort


def _introsort(v):
    """The permutation of one row after libstdc++'s introsort loop (before its final
    insertion sort), and the ranges that reached the depth limit (``heaps[:count]``; they are
    heapsorted after the loop). Ranges are disjoint, so the order they are worked in does not
    matter: a stack of (first, last, depth) replaces the recursion."""
    n = v.shape[0]
    depth0 = 2 * (n.bit_length() - 1)

    def partition(ix, f, l):
        a, b, c = f + 1, f + (l - f) // 2, l - 1          # __move_median_to_first
        va, vb, vc = v[ix[a]], v[ix[b]], v[ix[c]]
        ab, bc, ac = va < vb, vb < vc, va < vc
        t = jnp.where(ab, jnp.where(bc, b, jnp.where(ac, c, a)), jnp.where(ac, a, jnp.where(bc, c, b)))
        ix = _swap(ix, f, t)
        piv = v[ix[f]]

        def step(q):                                        # __unguarded_partition(f + 1, l, f)
            ix, lo, hi, _ = q
            lo = lax.while_loop(lambda i: (i < l - 1) & (v[ix[i]] < piv), lambda i: i + 1, lo)
            hi = lax.while_loop(lambda j: (j > f + 1) & (piv < v[ix[j]]), lambda j: j - 1, hi - 1)
            done = lo >= hi
            return _swap(ix, lo, jnp.where(done, lo, hi)), jnp.where(done, lo, lo + 1), hi, done

        ix, cut, _, _ = lax.while_loop(lambda q: ~q[3], step, (ix, f + 1, l, jnp.asarray(False)))
        return ix, cut

    def inner(s):   # keep the left part, push the right one
        ix, f, l, d, st, sp = s
        ix, cut = partition(ix, f, l)
        return ix, f, cut, d - 1, _put(st, sp, jnp.stack([cut, l, d - 1])), sp + 1

    def outer(s):
        ix, st, sp, heaps, count = s
        sp = sp - 1
        ix, f, l, d, st, sp = lax.while_loop(lambda q: (q[2] - q[1] > _THRESHOLD) & (q[3] > 0), inner,
                                             (ix, st[sp, 0], st[sp, 1], st[sp, 2], st, sp))
        heap = l - f > _THRESHOLD   # the depth limit was reached
        heaps = _put(heaps, count, jnp.where(heap, jnp.stack([f, l]), heaps[count]))
        return ix, st, sp, heaps, count + heap.astype(long_dtype())

    st = jnp.zeros((depth0 + 2, 3), long_dtype()).at[0].set(jnp.asarray([0, n, depth0], long_dtype()))
    heaps = jnp.zeros((n // (_THRESHOLD + 1) + 1, 2), long_dtype())
    init = (jnp.arange(n, dtype=long_dtype()), st, jnp.asarray(1, long_dtype()), heaps, jnp.asarray(0, long_dtype()))
    ix, _, _, heaps, count = lax.while_loop(lambda s: s[2] > 0, outer, init)
    return ix, heaps, count


def _heapsort(v, ix, f, length):
    """libstdc++'s ``__partial_sort(first, last, last)`` on ``ix[f:f + length]``: make_heap,
    then sort_heap (with ``__adjust_heap`` and ``__push_heap``)."""

    def adjust(ix, hole, ln, vix):
        top, val = hole, v[vix]

        def down(q):
            ix, hole, child = q
            child = 2 * (child + 1)
            child = jnp.where(v[ix[f + child]] < v[ix[f + child - 1]], child - 1, child)
            return _put(ix, f + hole, ix[f + child]), child, child

        ix, hole, child = lax.while_loop(lambda q: q[2] < (ln - 1) // 2, down, (ix, hole, hole))
        last_one = ((ln & 1) == 0) & (child == (ln - 2) // 2)
        c2 = 2 * (child + 1) - 1
        ix = _put(ix, f + hole, jnp.where(last_one, ix[f + c2], ix[f + hole]))
        hole = jnp.where(last_one, c2, hole)

        def up(q):
            ix, hole = q
            parent = (hole - 1) // 2
            return _put(ix, f + hole, ix[f + parent]), parent

        ix, hole = lax.while_loop(lambda q: (q[1] > top) & (v[q[0][f + (q[1] - 1) // 2]] < val), up, (ix, hole))
        return _put(ix, f + hole, vix)

    def make(i, ix):
        parent = (length - 2) // 2 - i
        return adjust(ix, parent, length, ix[f + parent])

    ix = lax.fori_loop(0, jnp.where(length >= 2, (length - 2) // 2 + 1, 0), make, ix)

    def pop(i, ix):
        last = length - 1 - i
        vix = ix[f + last]
        return adjust(_put(ix, f + last, ix[f]), jnp.asarray(0, long_dtype()), last, vix)

    return lax.fori_loop(0, jnp.maximum(length - 1, 0), pop, ix)


def _mode_sorted(arr, ix):
    """The mode of sorted pairs: the first longest run, and the index of its last pair."""
    n = arr.shape[-1]
    pos = jnp.arange(n, dtype=long_dtype())
    ends = jnp.concatenate([arr[..., :-1] != arr[..., 1:], jnp.ones(arr.shape[:-1] + (1,), bool)], axis=-1)
    starts = jnp.concatenate([jnp.zeros(arr.shape[:-1] + (1,), long_dtype()),
                              jnp.where(ends[..., :-1], pos[:-1] + 1, 0)], axis=-1)
    run = pos - lax.cummax(starts, axis=starts.ndim - 1) + 1
    best = jnp.argmax(jnp.where(ends, run, 0), axis=-1)
    return (jnp.take_along_axis(arr, best[..., None], axis=-1)[..., 0],
            jnp.take_along_axis(ix, best[..., None], axis=-1)[..., 0])


def _insertion_sort(v, ix):
    """libstdc++'s ``__final_insertion_sort`` of a permutation: guarded for the first 16
    positions (an element smaller than the first goes to the front), unguarded after."""
    n = ix.shape[0]
    p = jnp.arange(n, dtype=long_dtype())

    def insert(i, ix):
        vix = ix[i]
        val = v[vix]
        front = (i < _THRESHOLD) & (val < v[ix[0]])
        j = lax.while_loop(lambda j: (j >= 0) & (front | (val < v[ix[jnp.maximum(j, 0)]])), lambda j: j - 1, i - 1)
        moved = (p > j + 1) & (p <= i)     # [j + 1, i) moves one place up
        return _put(ix[jnp.where(moved, p - 1, p)], j + 1, vix)

    return lax.fori_loop(1, n, insert, ix)


def _std_sort_row(v):
    """The permutation libstdc++'s std::sort leaves one row's (value, index) pairs in."""
    n = v.shape[0]
    if n > _THRESHOLD:
        ix, heaps, count = _introsort(v)
        ix = lax.fori_loop(0, count, lambda h, ix: _heapsort(v, ix, heaps[h, 0], heaps[h, 1] - heaps[h, 0]), ix)
    else:
        ix = jnp.arange(n, dtype=long_dtype())
    # the final insertion sort is a stable sort while the values are ordered (no NaN)
    return lax.cond(jnp.any(_isnan(v)), lambda ix: _insertion_sort(v, ix),
                    lambda ix: ix[jnp.argsort(v[ix], stable=True)], ix)


@register("mode.default", zero_d="input")
def mode(sig, x, dim=-1, keepdim=False):
    rows, lead, d = _rows(x, dim)
    order = _stable_order(rows)
    srt = jnp.take_along_axis(rows, order, axis=1)
    # Where no value repeats (and none is NaN), every sort gives the same order.
    odd = jnp.any(srt[:, :-1] == srt[:, 1:]) | jnp.any(_isnan(rows))
    ix = lax.cond(odd, lambda r: _per_row(_std_sort_row, r), lambda r: order.astype(long_dtype()), rows)
    v, i = _mode_sorted(jnp.take_along_axis(rows, ix, axis=1), ix)
    return _unrows(v, lead, d, keepdim), _unrows(i, lead, d, keepdim)
