"""Linear algebra with PyTorch's conventions: factorizations (Cholesky, LU, QR, Householder
products), triangular, LU and Cholesky solves, inverses, determinants (as decompositions),
SVD, symmetric and general eigendecompositions, LDL, pseudo-inverse and matrix exponential.

Conventions followed (PyTorch's, not JAX's):
- LU: LAPACK's packed ``LU`` with 1-based int32 ``pivots`` (JAX's are 0-based); ``info`` is
  getrf's: the 1-based index of the first exactly-zero diagonal entry of U, else 0.
- Cholesky reads one triangle only (JAX's default averages A and A^H); ``info`` is potrf's:
  0, or the order of the first leading minor that is not positive definite. JAX's own
  factorization reports a failure as NaNs; only then a column-by-column factorization
  finds which minor failed (``_first_bad_minor``).
- ``_linalg_det`` and ``_linalg_slogdet`` are decompositions, not lowerings: PyTorch
  factors ``A^T`` instead of ``A`` when A is contiguous and real, and the LU and pivots they
  return (read by their backward formulas, which ask ``A.is_contiguous()`` again) follow.
  Only the tensor, at dispatch time, knows its strides, so these run there and record
  ``linalg_lu_factor_ex``. (``_linalg_solve_ex`` factors A itself, whatever its strides.)
- SVD and eigenvectors come from the same LAPACK routines PyTorch calls on the CPU (gesdd,
  syevd, geev), but PyTorch's are MKL's: singular vectors and eigenvectors may differ from
  PyTorch's by a sign (complex: a phase), which PyTorch documents as not unique and its
  OpInfo tests compare up to (``abs``, ``U @ Vh``). Everything else matches the values.
- ``check_errors=True`` raises nothing here, as lazyxla's ``_linalg_check_errors`` (which
  ``torch.linalg.cholesky``, ``inv``, ``solve`` call) records nothing: ``info`` is computed.
- Pivot-free LU (``pivot=False``) and an SVD ``driver`` are refused, as PyTorch's CPU does.
- LDL (``linalg_ldl_factor_ex``, ``linalg_ldl_solve``): JAX has no symmetric-indefinite
  factorization, so LAPACK's unblocked Bunch-Kaufman (sytf2/hetf2) and its solve
  (sytrs/hetrs) are written out here, row by row, giving the same blocks and pivots as the
  CPU's sytrf and its packed format.

Not lowered (they stay CPU fallbacks): ``geqrf`` and ``linalg_lstsq`` have no meta kernel in
PyTorch, so lazyxla cannot infer their shapes without the values (and lstsq's residuals'
shape depends on the rank).

Touches only the registries (``LOWERINGS``; ``DECOMPOSITIONS`` for det and slogdet).
"""
from __future__ import annotations

import jax.numpy as jnp
import jax.scipy.linalg as jsl
import torch
from jax import lax

from ..xla import jnp_dtype
from .registry import DECOMPOSITIONS, register

aten = torch.ops.aten
HI = lax.Precision.HIGHEST


# ---------------------------------------------------------------------------------------
# Helpers.
def _mm(a, b):
    return jnp.matmul(a, b, precision=HI)


def _mH(x):
    x = jnp.swapaxes(x, -1, -2)
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


def _dt(sig, i=0):
    return jnp_dtype(sig.outs[i].dtype)


def _batch(sig, i=0, core=2):
    s = sig.outs[i].shape
    return tuple(s[:len(s) - core])


def _to_batch(x, batch, core=2):
    """``x`` broadcast to the batch dims ``batch`` (its last ``core`` dims kept)."""
    return jnp.broadcast_to(x, tuple(batch) + tuple(x.shape[x.ndim - core:]))


def _empty(sig, i):
    """An output PyTorch leaves empty (``compute_uv=False``, QR mode ``"r"``, ...)."""
    m = sig.outs[i]
    return jnp.zeros(m.shape, jnp_dtype(m.dtype))


def _eye_out(sig, i):
    """Output ``i`` as the identity (its own shape): PyTorch's U and Vh of an empty SVD."""
    m = sig.outs[i]
    r, c = m.shape[-2:]
    return jnp.broadcast_to(jnp.eye(r, c, dtype=jnp_dtype(m.dtype)), m.shape)


def _trsm(a, b, *, lower, left=True, adjoint=False, transpose=False, unit=False):
    """Triangular solve reading one triangle of ``a``: op(a) x = b (``left``) or x op(a) = b."""
    return lax.linalg.triangular_solve(a, b, left_side=left, lower=lower,
                                       transpose_a=adjoint or transpose,
                                       conjugate_a=adjoint and jnp.iscomplexobj(a), unit_diagonal=unit)


# ---------------------------------------------------------------------------------------
# LU.
def _lu(a):
    """getrf: (LU, 1-based int32 pivots, 0-based row permutation with a[perm] = L @ U, info)."""
    m, n = a.shape[-2:]
    batch = a.shape[:-2]
    if min(m, n) == 0:
        return (a, jnp.zeros(batch + (0,), jnp.int32), jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), batch + (m,)),
                jnp.zeros(batch, jnp.int32))
    lu, piv, perm = lax.linalg.lu(a)
    zero = jnp.diagonal(lu, axis1=-2, axis2=-1) == 0
    info = jnp.where(jnp.any(zero, axis=-1), jnp.argmax(zero, axis=-1) + 1, 0).astype(jnp.int32)
    return lu, piv.astype(jnp.int32) + 1, perm, info


def _perm_of(pivots, m):
    """The row permutation (0-based) that LAPACK's 1-based pivots stand for."""
    if pivots.shape[-1] == 0:
        return jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), pivots.shape[:-1] + (m,))
    return lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


def _rows(x, perm):
    """x[..., perm, :] with a batched permutation."""
    return jnp.take_along_axis(x, perm[..., :, None], axis=-2)


def _lu_solve_left(lu, perm, b, adjoint):
    """A x = b (or A^H x = b) with A = P L U packed in ``lu``, where P^T A = A[perm]."""
    if not adjoint:
        y = _trsm(lu, _rows(b, perm), lower=True, unit=True)
        return _trsm(lu, y, lower=False)
    y = _trsm(lu, b, lower=False, adjoint=True)
    y = _trsm(lu, y, lower=True, unit=True, adjoint=True)
    return _rows(y, jnp.argsort(perm, axis=-1))  # x[perm] = y


@register("linalg_lu_factor_ex.default")
def lu_factor_ex(sig, A, *, pivot=True, check_errors=False):
    if not pivot:
        raise NotImplementedError("linalg.lu_factor: LU without pivoting is not implemented on the CPU")
    lu, piv, _, info = _lu(A)
    return lu, piv, info


def _solve(lu, pivots, B, batch, dt, left, adjoint):
    """X with op(A) X = B (``left``) or X op(A) = B, A = P L U packed in (lu, pivots); op the
    conjugate transpose if ``adjoint``; batch dims broadcast to ``batch``."""
    lu, B = _to_batch(lu, batch).astype(dt), _to_batch(B, batch).astype(dt)
    if lu.shape[-1] == 0:
        return B
    perm = _perm_of(_to_batch(pivots, batch, 1), lu.shape[-1])
    if left:
        return _lu_solve_left(lu, perm, B, adjoint)
    # X A = B  <=>  A^H X^H = B^H;  X A^H = B  <=>  A X^H = B^H
    return _mH(_lu_solve_left(lu, perm, _mH(B), not adjoint))


@register("linalg_lu_solve.default")
def lu_solve(sig, LU, pivots, B, *, left=True, adjoint=False):
    return _solve(LU, pivots, B, _batch(sig), _dt(sig), left, adjoint)


@register("_linalg_solve_ex.default")
def solve_ex(sig, A, B, *, left=True, check_errors=False):
    """(X, LU, pivots, info): PyTorch factors A itself here (unlike det and slogdet, below);
    B is a batch of vectors when it has A's shape without its last dim (or is 1-d)."""
    lu, piv, _, info = _lu(A)
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])
    if vector:
        X = _solve(lu, piv, B[..., None], _batch(sig, 0, 1), _dt(sig), left, False)[..., 0]
    else:
        X = _solve(lu, piv, B, _batch(sig), _dt(sig), left, False)
    return X, lu, piv, info


@register("linalg_inv_ex.default")
def inv_ex(sig, A, *, check_errors=False):
    """(A^-1, info), as PyTorch computes it: A X = I through the LU of A."""
    lu, piv, _, info = _lu(A)
    n = A.shape[-1]
    return _solve(lu, piv, jnp.eye(n, dtype=A.dtype), A.shape[:-2], A.dtype, True, False), info


def _unpack(lu, pivots, dt, data=True, perm=True):
    m, n = lu.shape[-2:]
    k = min(m, n)
    P = L = U = None
    if perm:
        p = _perm_of(pivots, m)
        P = (p[..., None, :] == jnp.arange(m, dtype=p.dtype)[:, None]).astype(dt)  # P[i, j] = (perm[j] == i)
    if data:
        L = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=dt)
        U = jnp.triu(lu[..., :k, :])
    return P, L, U


@register("lu_unpack.default")
def lu_unpack(sig, LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    dt = _dt(sig, 1)
    P, L, U = _unpack(LU_data.astype(dt), LU_pivots, dt, unpack_data, unpack_pivots)
    return (P if unpack_pivots else _empty(sig, 0), L if unpack_data else _empty(sig, 1),
            U if unpack_data else _empty(sig, 2))


@register("linalg_lu.default")
def linalg_lu(sig, A, *, pivot=True):
    if not pivot:
        raise NotImplementedError("linalg.lu: LU without pivoting is not implemented on the CPU")
    lu, piv, _, _ = _lu(A)
    return _unpack(lu, piv, lu.dtype)


# det and slogdet: PyTorch factors A^T when A is contiguous and real: decompositions, run
# where A's strides are known (see the module docstring).
def _factored(A):
    """PyTorch's choice: the LU of A^T when A is contiguous and real (no copy for LAPACK)."""
    return A.is_contiguous() and not A.is_complex()


def _perm_sign(pivots):
    """+1 or -1 (int64): the sign of the permutation the pivots stand for."""
    k = pivots.shape[-1]
    swaps = (torch.arange(1, k + 1, dtype=pivots.dtype, device=pivots.device) != pivots).sum(-1)
    return 1 - 2 * torch.fmod(swaps, 2)


def det(A):
    """``_linalg_det``: (det, LU, pivots)."""
    LU, pivots, _ = aten.linalg_lu_factor_ex.default(A.mT if _factored(A) else A)
    return _perm_sign(pivots) * LU.diagonal(0, -2, -1).prod(-1), LU, pivots


def slogdet(A):
    """``_linalg_slogdet``: (sign, log|det|, LU, pivots)."""
    LU, pivots, _ = aten.linalg_lu_factor_ex.default(A.mT if _factored(A) else A)
    d = LU.diagonal(0, -2, -1)
    return d.sgn().prod(-1) * _perm_sign(pivots), d.abs().log().sum(-1), LU, pivots


DECOMPOSITIONS[aten._linalg_det.default] = det
DECOMPOSITIONS[aten._linalg_slogdet.default] = slogdet


# ---------------------------------------------------------------------------------------
# Cholesky.
def _first_bad_minor(x):
    """potrf's info for the lower triangle of ``x``: the 1-based order of the first leading
    minor that is not positive definite (NaN included), else 0; column by column."""
    n = x.shape[-1]
    rows = jnp.arange(n)
    real = jnp.real(x).dtype

    def step(j, carry):
        L, info = carry
        lj = L[..., j, :]  # row j: columns < j are done, the rest are 0
        d = jnp.real(x[..., j, j]) - jnp.sum(jnp.real(lj * jnp.conj(lj)), axis=-1)
        bad = jnp.logical_not(d > 0)
        info = jnp.where((info == 0) & bad, j + 1, info)
        ljj = jnp.sqrt(jnp.where(bad, 1, d)).astype(real)
        col = (x[..., :, j] - jnp.matmul(L, jnp.conj(lj)[..., None], precision=HI)[..., 0]) / ljj[..., None]
        col = jnp.where(rows > j, col, jnp.where(rows == j, ljj[..., None].astype(x.dtype), 0))
        return L.at[..., :, j].set(col), info

    init = (jnp.zeros_like(x), jnp.zeros(x.shape[:-2], jnp.int32))
    return lax.fori_loop(0, n, step, init)[1]


def _cholesky(x):
    """(L, info) for the lower triangle of x; on a failure JAX gives NaNs, and only then the
    failing minor is looked for."""
    n = x.shape[-1]
    if n == 0:
        return x, jnp.zeros(x.shape[:-2], jnp.int32)
    L = lax.linalg.cholesky(x, symmetrize_input=False)
    failed = jnp.any(jnp.isnan(L), axis=(-2, -1))
    first = lax.cond(jnp.any(failed), _first_bad_minor, lambda v: jnp.zeros(v.shape[:-2], jnp.int32), x)
    info = jnp.where(failed, jnp.where(first == 0, n, first), 0).astype(jnp.int32)
    return L, info


@register("linalg_cholesky_ex.default")
def cholesky_ex(sig, A, *, upper=False, check_errors=False):
    L, info = _cholesky(_mH(A) if upper else A)  # upper: A = U^H U, U^H the lower factor of A^H
    return (_mH(L) if upper else L), info


@register("cholesky.default")
def cholesky(sig, A, upper=False):
    L, _ = _cholesky(_mH(A) if upper else A)
    return _mH(L) if upper else L


@register("cholesky_solve.default")
def cholesky_solve(sig, B, L, upper=False):
    """A X = B with A = L L^H (or U^H U)."""
    batch = _batch(sig)
    dt = _dt(sig)
    B, L = _to_batch(B, batch).astype(dt), _to_batch(L, batch).astype(dt)
    if upper:
        return _trsm(L, _trsm(L, B, lower=False, adjoint=True), lower=False)
    return _trsm(L, _trsm(L, B, lower=True), lower=True, adjoint=True)


@register("cholesky_inverse.default")
def cholesky_inverse(sig, L, upper=False):
    n = L.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(n, dtype=L.dtype), L.shape)
    inv = _trsm(L, eye, lower=not upper)
    return _mm(inv, _mH(inv)) if upper else _mm(_mH(inv), inv)


def _ldl_factor(A, herm):
    """LAPACK's sytf2 (hetf2 if ``herm``), lower: Bunch-Kaufman, A = P L D L^T P^T with 1x1
    and 2x2 blocks, in sytrf's packed form (which MKL's sytrf gives too). Batched: ``k`` runs
    over the rows, each matrix picks its pivot and block at ``k`` unless ``k`` is the second
    row of its last 2x2 block. Magnitudes are LAPACK's: |re| + |im| for complex (|re| on a
    Hermitian diagonal). The matrix is kept whole, its upper triangle mirroring the lower one,
    so that the symmetric interchange of rows and columns is a plain swap."""
    n = A.shape[-1]
    batch = A.shape[:-2]
    idx = jnp.arange(n)
    rows, cols = idx[:, None], idx[None, :]
    alpha = (1 + 17 ** 0.5) / 8
    cplx = jnp.iscomplexobj(A)
    cj = jnp.conj if herm else (lambda z: z)
    mag = (lambda z: jnp.abs(jnp.real(z)) + jnp.abs(jnp.imag(z))) if cplx else jnp.abs
    dmag = (lambda z: jnp.abs(jnp.real(z))) if herm else mag
    real = jnp.real if herm else (lambda z: z)
    if herm:  # hetf2 makes each diagonal entry real before it is read
        A = jnp.where(rows == cols, jnp.real(A).astype(A.dtype), A)

    def pick_rows(M, i):  # row i[b] of each matrix
        return jnp.sum(jnp.where(rows == i[..., None, None], M, 0), axis=-2)

    def pick(v, i):  # v[b, i[b]]
        return jnp.sum(jnp.where(idx == i[..., None], v, 0), axis=-1)

    def step(k, carry):
        M, piv, info, skip = carry
        M0 = M = jnp.where(rows >= cols, M, cj(jnp.swapaxes(M, -1, -2)))  # the upper triangle mirrors the lower
        col = M[..., :, k]
        absakk = dmag(M[..., k, k])
        below = jnp.where(idx > k, mag(col), -1)
        imax = jnp.argmax(below, axis=-1)
        colmax = jnp.where(k < n - 1, jnp.max(below, axis=-1), 0)
        singular = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        row_imax = mag(pick_rows(M, imax))  # row imax: columns k..imax-1 are A(imax, j), the rest A(j, imax)
        rowmax = jnp.max(jnp.where((idx >= k) & (idx != imax[..., None]), row_imax, 0), axis=-1)
        keep = singular | (absakk >= alpha * colmax) | (absakk >= alpha * colmax * (colmax / rowmax))
        two = ~keep & ~(dmag(pick(pick_rows(M, imax), imax)) >= alpha * rowmax)
        kp = jnp.where(keep, k, imax)
        kk = k + two.astype(kp.dtype)
        # interchange rows and columns kk and kp of the trailing matrix (rows and columns >= k)
        at_kk, at_kp = rows == kk[..., None, None], rows == kp[..., None, None]
        R = jnp.where(at_kk, pick_rows(M, kp)[..., None, :], jnp.where(at_kp, pick_rows(M, kk)[..., None, :], M))
        Rt = jnp.swapaxes(R, -1, -2)
        Mp = jnp.where(jnp.swapaxes(at_kk, -1, -2), pick_rows(Rt, kp)[..., :, None],
                       jnp.where(jnp.swapaxes(at_kp, -1, -2), pick_rows(Rt, kk)[..., :, None], R))
        trailing = (rows >= k) & (cols >= k)
        M = jnp.where(trailing, Mp, M)
        # the update of the trailing matrix
        ck, ck1 = M[..., :, k], M[..., :, jnp.minimum(k + 1, n - 1)]
        dkk = real(M[..., k, k])
        r1 = 1 / dkk
        x = jnp.where(idx > k, ck, 0)
        M1 = M + x[..., :, None] * (-r1[..., None] * cj(x))[..., None, :]
        M1 = jnp.where((rows > k) & (cols > k), M1, M)
        M1 = jnp.where((cols == k) & (rows > k), (x * r1[..., None])[..., :, None], M1)
        k1 = jnp.minimum(k + 1, n - 1)
        e = M[..., k1, k]
        if herm:
            d = jnp.abs(e)
            d11, d22 = jnp.real(M[..., k1, k1]) / d, jnp.real(M[..., k, k]) / d
            tt = 1 / (d11 * d22 - 1)
            d21 = e / d
            d = tt / d
            wk = d[..., None] * (d11[..., None] * ck - d21[..., None] * ck1)
            wk1 = d[..., None] * (d22[..., None] * ck1 - jnp.conj(d21)[..., None] * ck)
        else:
            d11, d22 = M[..., k1, k1] / e, M[..., k, k] / e
            d21 = (1 / (d11 * d22 - 1)) / e
            wk = d21[..., None] * (d11[..., None] * ck - ck1)
            wk1 = d21[..., None] * (d22[..., None] * ck1 - ck)
        M2 = M - ck[..., :, None] * cj(wk)[..., None, :] - ck1[..., :, None] * cj(wk1)[..., None, :]
        M2 = jnp.where((rows > k1) & (cols > k1), M2, M)
        M2 = jnp.where((cols == k) & (rows > k1), wk[..., :, None], M2)
        M2 = jnp.where((cols == k1) & (rows > k1), wk1[..., :, None], M2)
        new = jnp.where(two[..., None, None], M2, jnp.where(singular[..., None, None], M, M1))
        if herm:
            new = jnp.where(rows == cols, jnp.real(new).astype(new.dtype), new)
        p1 = (kp + 1).astype(jnp.int32)
        newpiv = jnp.where(idx == k, jnp.where(two, -p1, p1)[..., None], piv)
        newpiv = jnp.where((idx == k + 1) & two[..., None], -p1[..., None], newpiv)
        newinfo = jnp.where(singular & (info == 0), k + 1, info).astype(jnp.int32)
        s = skip[..., None, None]
        return (jnp.where(s, M0, new), jnp.where(skip[..., None], piv, newpiv), jnp.where(skip, info, newinfo),
                ~skip & two)

    init = (A, jnp.zeros(batch + (n,), jnp.int32), jnp.zeros(batch, jnp.int32), jnp.zeros(batch, bool))
    M, piv, info, _ = lax.fori_loop(0, n, step, init)
    return jnp.tril(M), piv, info


@register("linalg_ldl_factor_ex.default")
def ldl_factor_ex(sig, A, *, hermitian=False, check_errors=False):
    if A.shape[-1] == 0:
        return A, jnp.zeros(A.shape[:-1], jnp.int32), jnp.zeros(A.shape[:-2], jnp.int32)
    return _ldl_factor(A, hermitian and jnp.iscomplexobj(A))


def _ldl_solve(LD, piv, B, herm):
    """LAPACK's sytrs (hetrs if ``herm``), lower: A X = B with A = P L D L^T P^T packed in
    (LD, 1-based pivots) as sytrf leaves them: ``piv[k] > 0`` a 1x1 block and the swap of
    rows k and piv[k]; ``piv[k] == piv[k+1] < 0`` a 2x2 block and the swap of k+1 and -piv[k].
    Batched: each step computes both kinds of block and keeps the one each matrix has."""
    n = LD.shape[-1]
    idx = jnp.arange(n)
    cj = jnp.conj if herm else (lambda z: z)
    neg = piv < 0
    # a run of negative pivots is a run of 2x2 blocks: its even positions start one
    last_pos = lax.cummax(jnp.where(neg, -1, idx), axis=neg.ndim - 1)
    first = neg & ((idx - last_pos - 1) % 2 == 0)

    def row(B, k):
        return B[..., k, :]

    def swap(B, i, j):  # rows i (one index) and j (one per matrix)
        rows = idx[:, None]
        at_j = rows == j[..., None, None]
        bi, bj = row(B, i), jnp.sum(jnp.where(at_j, B, 0), axis=-2)
        return jnp.where(at_j, bi[..., None, :], jnp.where(rows == i, bj[..., None, :], B))

    def below(k, c):  # column c of L below row k
        return jnp.where(idx > k, LD[..., :, c], 0)

    def pick(one, two, B1, B2, B):
        return jnp.where(one[..., None, None], B1, jnp.where(two[..., None, None], B2, B))

    def fwd(k, B):  # L D y = P^T b, block by block
        p = piv[..., k]
        k1 = jnp.minimum(k + 1, n - 1)
        B1 = swap(B, k, p - 1)
        B1 = B1 - below(k, k)[..., :, None] * row(B1, k)[..., None, :]
        d = jnp.real(LD[..., k, k]) if herm else LD[..., k, k]
        B1 = B1.at[..., k, :].set(row(B1, k) / d[..., None])
        B2 = swap(B, k1, jnp.clip(-p - 1, 0, n - 1))
        B2 = B2 - below(k1, k)[..., :, None] * row(B2, k)[..., None, :] \
            - below(k1, k1)[..., :, None] * row(B2, k1)[..., None, :]
        e = LD[..., k1, k]
        a, c = LD[..., k, k] / cj(e), LD[..., k1, k1] / e
        denom = (a * c - 1)[..., None]
        b0, b1 = row(B2, k) / cj(e)[..., None], row(B2, k1) / e[..., None]
        B2 = B2.at[..., k, :].set((c[..., None] * b0 - b1) / denom).at[..., k1, :].set((a[..., None] * b1 - b0) / denom)
        return pick(p > 0, first[..., k], B1, B2, B)

    def bwd(t, B):  # P L^T x = y (L^H if herm), from the last row up
        k = n - 1 - t
        p = piv[..., k]
        k0 = jnp.maximum(k - 1, 0)

        def minus(B, r, c):  # row r -= (column c of L below k)^T B
            return B.at[..., r, :].add(-jnp.sum(cj(below(k, c))[..., :, None] * B, axis=-2))
        B1 = swap(minus(B, k, k), k, jnp.clip(p - 1, 0, n - 1))
        B2 = swap(minus(minus(B, k, k), k0, k0), k, jnp.clip(-p - 1, 0, n - 1))
        return pick(p > 0, neg[..., k] & ~first[..., k], B1, B2, B)

    B = lax.fori_loop(0, n, fwd, B)
    return lax.fori_loop(0, n, bwd, B)


@register("linalg_ldl_solve.default")
def ldl_solve(sig, LD, pivots, B, *, hermitian=False):
    """With the factors ``linalg_ldl_factor_ex`` gives (on the CPU: see the module docstring)."""
    batch = _batch(sig)
    dt = _dt(sig)
    LD, B = _to_batch(LD, batch).astype(dt), _to_batch(B, batch).astype(dt)
    if LD.shape[-1] == 0:
        return B
    piv = _to_batch(pivots, batch, 1).astype(jnp.int32)
    return _ldl_solve(LD, piv, B, hermitian and jnp.iscomplexobj(LD))


# ---------------------------------------------------------------------------------------
# Triangular solves.
@register("linalg_solve_triangular.default")
def solve_triangular(sig, A, B, *, upper, left=True, unitriangular=False):
    batch = _batch(sig)
    dt = _dt(sig)
    return _trsm(_to_batch(A, batch).astype(dt), _to_batch(B, batch).astype(dt), lower=not upper, left=left,
                 unit=unitriangular)


@register("triangular_solve.default")
def triangular_solve(sig, b, A, upper=True, transpose=False, unitriangular=False):
    """(X, a copy of A broadcast): op(A) X = b, op a transpose (not conjugated) if asked."""
    batch = _batch(sig)
    dt = _dt(sig)
    A = _to_batch(A, _batch(sig, 1)).astype(dt)
    X = _trsm(_to_batch(A, batch), _to_batch(b, batch).astype(dt), lower=not upper, transpose=transpose,
              unit=unitriangular)
    return X, A


# ---------------------------------------------------------------------------------------
# QR and Householder products.
@register("linalg_qr.default")
def linalg_qr(sig, A, mode="reduced"):
    if mode == "r":
        return _empty(sig, 0), jnp.linalg.qr(A, mode="r")
    return tuple(jnp.linalg.qr(A, mode=mode))


@register("linalg_householder_product.default")
def householder_product(sig, A, tau):
    return lax.linalg.householder_product(A, tau.astype(A.dtype))


@register("ormqr.default")
def ormqr(sig, A, tau, C, left=True, transpose=False):
    """op(Q) C or C op(Q), Q the full (mn x mn) product of the reflectors in (A, tau);
    op the conjugate transpose if ``transpose``."""
    dt = _dt(sig)
    mn = C.shape[-2] if left else C.shape[-1]
    k = tau.shape[-1]
    refl = A[..., :, :k].astype(dt)
    refl = jnp.pad(refl, [(0, 0)] * (refl.ndim - 1) + [(0, mn - k)])
    Q = lax.linalg.householder_product(refl, tau.astype(dt))
    if transpose:
        Q = _mH(Q)
    C = C.astype(dt)
    return _mm(Q, C) if left else _mm(C, Q)


# ---------------------------------------------------------------------------------------
# SVD, eigendecompositions, pseudo-inverse.
@register("_linalg_svd.default")
def svd(sig, A, full_matrices=False, compute_uv=True, *, driver=None):
    if driver is not None:
        raise NotImplementedError("torch.linalg.svd: keyword argument `driver=` is only supported on CUDA "
                                  "inputs with cuSOLVER backend.")
    if min(A.shape[-2:]) == 0:  # no values; PyTorch's U and Vh are identities (full) or empty
        S = jnp.zeros(sig.outs[1].shape, _dt(sig, 1))
        return (_eye_out(sig, 0), S, _eye_out(sig, 2)) if compute_uv else (_empty(sig, 0), S, _empty(sig, 2))
    if not compute_uv:
        return _empty(sig, 0), jnp.linalg.svd(A, compute_uv=False), _empty(sig, 2)
    U, S, Vh = jnp.linalg.svd(A, full_matrices=full_matrices)
    return U, S, Vh


@register("_linalg_eigh.default")
def eigh(sig, A, UPLO="L", compute_v=True):
    v, w = lax.linalg.eigh(A, lower=UPLO.upper() == "L", symmetrize_input=False)
    return w, (v if compute_v else _empty(sig, 1))


@register("linalg_eig.default")
def eig(sig, A):
    w, v = lax.linalg.eig(A, compute_left_eigenvectors=False, compute_right_eigenvectors=True)
    return w, v


@register("_linalg_eigvals.default")
def eigvals(sig, A):
    return lax.linalg.eig(A, compute_left_eigenvectors=False, compute_right_eigenvectors=False)[0]


@register("linalg_pinv.atol_rtol_tensor")
def pinv(sig, A, *, atol=None, rtol=None, hermitian=False):
    """PyTorch's rule: singular values (|eigenvalues| if hermitian) above
    max(atol, rtol * largest) are inverted, the rest dropped; tolerances in float64; rtol
    defaults to eps * max(m, n), or 0 when a positive atol is given."""
    f64 = jnp.float64
    m, n = A.shape[-2:]
    atol_ = jnp.zeros((), f64) if atol is None else atol.astype(f64)
    if rtol is not None:
        rtol_ = rtol.astype(f64)
    else:
        default = float(jnp.finfo(A.dtype).eps) * max(m, n)
        rtol_ = jnp.full((), default, f64) if atol is None else jnp.where(atol_ > 0, 0.0, default)
    if hermitian:
        v, w = lax.linalg.eigh(A, lower=True, symmetrize_input=False)
        wa = jnp.abs(w)
        tol = jnp.maximum(atol_[..., None], rtol_[..., None] * jnp.max(wa, axis=-1, keepdims=True).astype(f64))
        wp = jnp.where(wa.astype(f64) > tol, 1 / w, 0).astype(A.dtype)
        return _mm(v * wp[..., None, :], _mH(v))
    U, S, Vh = jnp.linalg.svd(A, full_matrices=False)
    tol = jnp.maximum(atol_[..., None], rtol_[..., None] * S[..., :1].astype(f64))
    sp = jnp.where(S.astype(f64) > tol, 1 / S, 0).astype(A.dtype)
    return _mm(_mH(Vh) * sp[..., None, :], _mH(U))


# ---------------------------------------------------------------------------------------
@register("linalg_matrix_exp.default")
def matrix_exp(sig, A):
    return jsl.expm(A)
