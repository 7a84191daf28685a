"""Linear algebra with PyTorch's conventions: factorizations (Cholesky, LU, QR, Householder
QR as ``geqrf``, Householder products), triangular, LU and Cholesky solves, inverses,
determinants (as decompositions), SVD, symmetric and general eigendecompositions, LDL,
least squares (``linalg_lstsq``), pseudo-inverse and matrix exponential.

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

- ``geqrf``: LAPACK's Householder QR (the reflectors below the diagonal, R above, tau), written
  out column by column (JAX's geqrf is private): the same reflectors as the CPU's blocked
  geqrf, and its column-major layout.
- ``linalg_lstsq``, per ``driver`` (default gelsy, the CPU's): gels (QR, or the minimum-norm
  solution when m < n; A taken as full rank), gelsy (QR with column pivoting, the rank by
  LAPACK's incremental condition estimation against ``rcond``, the minimum-norm solution of
  the leading block), gelsd and gelss (SVD, singular values up to ``rcond`` times the
  largest dropped). Outputs as PyTorch's CPU gives them: residuals (the squared norms of
  the columns of A X - B) only when m > n and not for gelsy; rank for all but gels;
  singular values for gelsd and gelss; the others empty. For gelsd and gelss with m > n
  the residuals are there only if every matrix has rank n, a value: those calls stay on
  the CPU. gelsy follows LAPACK's reference semantics (every column free to pivot):
  PyTorch's CPU passes geqp3 uninitialized pivot flags, so on a rank-deficient matrix its
  own rank and solution vary from call to call; on a full-rank one the solution is the
  same either way.

PyTorch has no meta kernel for ``geqrf`` or ``linalg_lstsq``: their shape rules
(``shape_rule``) give the CPU kernel's shapes and strides.

Touches only the registries (``LOWERINGS``, ``SHAPE_RULES``; ``DECOMPOSITIONS`` for det and slogdet).
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import jax.scipy.linalg as jsl
import torch
from jax import lax

from ..xla import precision, widths
from ..xla.client import jnp_dtype
from .registry import DECOMPOSITIONS, register, shape_rule

aten = torch.ops.aten
HI = precision.of("algorithm")  # HIGHEST at every setting


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
# XLA's TPU compiler factors LU in float32 and complex64 only ("Only F32 and C64 types are
# implemented in LuDecomposition", a v5e): the ops that factor (solve, inv, lu_factor, lu and
# matrix_exp, whose Pade step solves) run on the CPU there in float64 and complex128
# (``registry.NATIVE_FLOAT64``)
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


@register("linalg_lu_factor_ex.default", native_float64=True)
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


@register("_linalg_solve_ex.default", native_float64=True)
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


@register("linalg_inv_ex.default", native_float64=True)
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


@register("linalg_lu.default", native_float64=True)
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


def _fortran_meta(shape, dtype, ld=None):
    """A meta tensor laid out as LAPACK leaves its matrices: each one column-major with
    leading dimension ``ld`` (its rows by default), the batch dims outermost."""
    shape = tuple(shape)
    m, n = shape[-2:]
    ld = max(m if ld is None else ld, 1)
    stride, acc = [1, ld], ld * max(n, 1)
    for s in reversed(shape[:-2]):
        stride.insert(0, acc)
        acc *= max(s, 1)
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta")


@shape_rule("geqrf.default")
def _geqrf_shapes(A):
    if A.dim() < 2:
        raise RuntimeError("torch.geqrf: The input tensor A must have at least 2 dimensions.")
    if not (A.dtype.is_floating_point or A.dtype.is_complex) or A.dtype in (torch.float16, torch.bfloat16):
        raise RuntimeError(f"torch.geqrf: Expected a floating point or complex tensor as input. Got {A.dtype}")
    m, n = A.shape[-2:]
    return _fortran_meta(A.shape, A.dtype), torch.empty(tuple(A.shape[:-2]) + (min(m, n),), dtype=A.dtype,
                                                        device="meta")


def _householder_qr(A):
    """LAPACK's geqr2 (geqrf's unblocked form, the same reflectors): column by column,
    H(i) = I - tau v v^H with v[i] = 1 zeroes A[i+1:, i] (larfg: beta = -sign(Re alpha) *
    ||(alpha, x)||, tau = (beta - alpha) / beta, v = x / (alpha - beta); tau = 0 when x = 0
    and alpha is real), then H(i)^H is applied to the columns on the right. Returns
    (the packed reflectors and R, tau)."""
    m, n = A.shape[-2:]
    k = min(m, n)
    batch = A.shape[:-2]
    cplx = jnp.iscomplexobj(A)
    rows = jnp.arange(m)
    cols = jnp.arange(n)

    def step(i, carry):
        A, tau = carry
        col = lax.dynamic_index_in_dim(A, i, axis=-1, keepdims=False)         # [..., m]
        below = rows > i
        x = jnp.where(below, col, 0)
        alpha = jnp.sum(jnp.where(rows == i, col, 0), axis=-1)
        ar = jnp.real(alpha)
        ai = jnp.imag(alpha) if cplx else jnp.zeros_like(ar)
        xnorm = jnp.sqrt(jnp.sum(jnp.real(x * jnp.conj(x)), axis=-1))
        keep = (xnorm == 0) & (ai == 0)                                     # H = I
        norm = jnp.hypot(jnp.hypot(ar, ai), xnorm)
        beta = -jnp.where(ar >= 0, norm, -norm)
        safe_beta = jnp.where(keep, 1, beta)
        t = (beta - ar) / safe_beta
        t = (t - 1j * ai / safe_beta).astype(A.dtype) if cplx else t
        t = jnp.where(keep, 0, t)
        scale = 1 / jnp.where(keep, 1, alpha - beta)
        v = jnp.where(rows == i, 1, x * scale[..., None]).astype(A.dtype)   # zero above i
        # H(i)^H on the columns right of i: A -= conj(tau) v (v^H A)
        w = jnp.einsum("...m,...mn->...n", jnp.conj(v), A, precision=HI)
        upd = A - (jnp.conj(t)[..., None, None] * v[..., :, None]) * w[..., None, :]
        A = jnp.where(cols > i, upd, A)
        newcol = jnp.where(rows == i, beta[..., None].astype(A.dtype), v)
        newcol = jnp.where(rows < i, col, newcol)
        A = jnp.where((cols == i) & ~keep[..., None, None], newcol[..., :, None], A)
        tau = jnp.where(jnp.arange(k) == i, t[..., None], tau)
        return A, tau

    tau = jnp.zeros(batch + (k,), A.dtype)
    if k == 0:
        return A, tau
    return lax.fori_loop(0, k, step, (A, tau))


@register("geqrf.default")
def geqrf(sig, A):
    return _householder_qr(A)


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


# XLA's TPU float64 (two float32s) eigh gave NaN eigenvectors (a v5e, 2026-12-07, the float64
# OpInfo row): float64 calls run on the CPU there (``registry.NATIVE_FLOAT64``)
@register("_linalg_eigh.default", native_float64=True)
def eigh(sig, A, UPLO="L", compute_v=True):
    v, w = lax.linalg.eigh(_hermitian_from(A, UPLO.upper() == "L"), lower=True, symmetrize_input=False)
    return w, (v if compute_v else _empty(sig, 1))


def _hermitian_from(A, lower):
    """The Hermitian matrix whose ``lower`` (or upper) triangle is A's, the diagonal's real part:
    what LAPACK reads. XLA's TPU eigh reads the whole matrix whatever ``lower`` says (a v5e:
    eigh of a matrix that is not symmetric, UPLO's triangle ignored), so the lowering writes
    the matrix out itself."""
    tri = jnp.tril(A) if lower else jnp.triu(A)
    strict = jnp.tril(A, -1) if lower else jnp.triu(A, 1)
    full = tri + _mH(strict)
    if jnp.iscomplexobj(A):
        eye = jnp.eye(A.shape[-1], dtype=bool)
        full = jnp.where(eye, jnp.real(full).astype(A.dtype), full)
    return full


# XLA's TPU compiler has no nonsymmetric eigendecomposition (a v5e: "could not compile"): on a
# TPU linalg.eig and eigvals run on the CPU (``registry.PLATFORMS``)
@register("linalg_eig.default", platforms=("cpu", "gpu"))
def eig(sig, A):
    w, v = lax.linalg.eig(A, compute_left_eigenvectors=False, compute_right_eigenvectors=True)
    return w, v


@register("_linalg_eigvals.default", platforms=("cpu", "gpu"))
def eigvals(sig, A):
    return lax.linalg.eig(A, compute_left_eigenvectors=False, compute_right_eigenvectors=False)[0]


@register("linalg_pinv.atol_rtol_tensor")
def pinv(sig, A, *, atol=None, rtol=None, hermitian=False):
    """PyTorch's rule: singular values (|eigenvalues| if hermitian) above
    max(atol, rtol * largest) are inverted, the rest dropped; tolerances in float64; rtol
    defaults to eps * max(m, n), or 0 when a positive atol is given. The tolerances are float32
    where float64 is not native (a TPU: ``xla.widths.FLOAT64_NATIVE``)."""
    f64 = jnp.float64 if widths.float64_native() else jnp.float32
    m, n = A.shape[-2:]
    atol_ = jnp.zeros((), f64) if atol is None else atol.astype(f64)
    if rtol is not None:
        rtol_ = rtol.astype(f64)
    else:
        default = float(jnp.finfo(A.dtype).eps) * max(m, n)
        rtol_ = jnp.full((), default, f64) if atol is None else jnp.where(atol_ > 0, 0.0, default)
    if hermitian:
        v, w = lax.linalg.eigh(_hermitian_from(A, True), lower=True, symmetrize_input=False)
        wa = jnp.abs(w)
        tol = jnp.maximum(atol_[..., None], rtol_[..., None] * jnp.max(wa, axis=-1, keepdims=True).astype(f64))
        wp = jnp.where(wa.astype(f64) > tol, 1 / w, 0).astype(A.dtype)
        return _mm(v * wp[..., None, :], _mH(v))
    U, S, Vh = jnp.linalg.svd(A, full_matrices=False)
    tol = jnp.maximum(atol_[..., None], rtol_[..., None] * S[..., :1].astype(f64))
    sp = jnp.where(S.astype(f64) > tol, 1 / S, 0).astype(A.dtype)
    return _mm(_mH(Vh) * sp[..., None, :], _mH(U))


# ---------------------------------------------------------------------------------------
# Least squares (linalg_lstsq), driver by driver as PyTorch's CPU calls LAPACK.
_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def _lstsq_layout(a_shape, b_shape, driver):
    """(driver, vector case, m, n, k, broadcast batch) from the shapes; PyTorch's checks."""
    driver = "gelsy" if driver is None else driver  # the CPU's default
    if driver not in _LSTSQ_DRIVERS:
        raise RuntimeError(f"torch.linalg.lstsq: parameter `driver` should be one of {_LSTSQ_DRIVERS}")
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    if len(a_shape) < 2:
        raise RuntimeError("torch.linalg.lstsq: input must have at least 2 dimensions.")
    if len(b_shape) < 1:
        raise RuntimeError("torch.linalg.lstsq: other must have at least 1 dimension.")
    d = len(a_shape) - len(b_shape)
    if d not in (0, 1):
        raise RuntimeError("torch.linalg.lstsq: input.dim() must be greater or equal to other.dim() and "
                           "(input.dim() - other.dim()) <= 1")
    vector = len(b_shape) == 1 or (d == 1 and b_shape == a_shape[:-1])
    if d == 1 and not vector:
        # PyTorch then broadcasts B's rows as a batch dim: left to the CPU
        raise NotImplementedError("linalg_lstsq: a matrix right-hand side one dim short of the input")
    m, n = a_shape[-2:]
    if (b_shape[-1] if vector else b_shape[-2]) != m:
        raise RuntimeError("torch.linalg.lstsq: input.size(-2) should match other.size(-2)")
    k = 1 if vector else b_shape[-1]
    b_batch = b_shape[:-1] if vector else b_shape[:-2]
    batch = tuple(torch.broadcast_shapes(a_shape[:-2], b_batch))
    return driver, vector, m, n, k, batch


def _real_torch(dt):
    return {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dt, dt)


@shape_rule("linalg_lstsq.default")
def _lstsq_shapes(A, B, rcond=None, *, driver=None):
    """PyTorch's CPU shapes: solution (*, n, k) (the first n rows of a column-major
    (max(m, n), k) buffer); residuals (*, k) when m > n for gels, and for gelsd/gelss only if
    every matrix has rank n (values: left to the CPU, unless that holds trivially), else
    empty; rank (A's batch) for all but gels; singular values (A's batch, min(m, n)) for
    gelsd/gelss."""
    if A.dtype != B.dtype:
        raise RuntimeError(f"torch.linalg.lstsq: Expected input and other to have the same dtype, but got "
                           f"input's dtype {A.dtype} and other's dtype {B.dtype}")
    if A.dtype not in (torch.float32, torch.float64, torch.complex64, torch.complex128):
        raise RuntimeError(f"torch.linalg.lstsq: Expected a floating point or complex tensor as input. Got {A.dtype}")
    driver, vector, m, n, k, batch = _lstsq_layout(A.shape, B.shape, driver)
    real = _real_torch(A.dtype)
    empty = lambda dt: torch.empty((0,), dtype=dt, device="meta")  # noqa: E731
    sol = _fortran_meta(batch + (n, k), A.dtype, ld=max(m, n))
    if vector:
        sol = sol[..., 0]
    a_batch = tuple(A.shape[:-2])
    residuals = empty(real)
    if m > n and driver != "gelsy":
        if driver in ("gelsd", "gelss") and n > 0 and math.prod(a_batch) > 0:
            raise NotImplementedError("linalg_lstsq: the residuals' shape depends on the rank")
        residuals = torch.empty(batch + (k,), dtype=real, device="meta")
    rank = empty(torch.int64) if driver == "gels" else torch.empty(a_batch, dtype=torch.int64, device="meta")
    sv = torch.empty(a_batch + (min(m, n),), dtype=real, device="meta") if driver in ("gelsd", "gelss") \
        else empty(real)
    return sol, residuals, rank, sv


def _solve_min_norm(M, c, r):
    """The minimum-norm least-squares solution of ``M x = c`` with M (p x n, p <= n) upper
    trapezoidal of full row rank ``r`` (per matrix, a device value): rows of M and c from r
    on are dropped. Through the QR of M^H: M = T^H U^H, x = U T^-H c; the dropped rows are
    zero columns of M^H, whose factor rows and columns become the identity."""
    p = M.shape[-2]
    idx = jnp.arange(p)
    live = idx < r[..., None]                                             # [..., p]
    Mh = _mH(jnp.where(live[..., :, None], M, 0))
    U, T = jnp.linalg.qr(Mh, mode="reduced")                              # U [n, p], T [p, p]
    both = live[..., :, None] & live[..., None, :]
    T = jnp.where(both, T, jnp.where(idx[:, None] == idx[None, :], 1, 0).astype(T.dtype))
    y = _trsm(T, jnp.where(live[..., :, None], c, 0), lower=False, adjoint=True)
    return _mm(U, y)


def _ice_step(sest, x, w, gamma, largest):
    """One step of LAPACK's incremental condition estimation (laic1): x (unit norm, zero past
    the current order j) approximates an extreme singular vector of the j x j triangle with
    singular value estimate ``sest``; adding column w (rows < j) and diagonal gamma, the new
    estimate and x are the extreme eigenpair of the 2 x 2 Hermitian problem in (s, c) for
    the vector [s x; c]. Returns (new estimate, s, c)."""
    beta = jnp.sum(jnp.conj(w) * x, axis=-1)
    g = jnp.conj(gamma)
    t = jnp.maximum(jnp.maximum(sest, jnp.abs(beta)), jnp.abs(g))
    t = jnp.where(t == 0, 1, t)
    se, be, ge = sest / t, beta / t, g / t
    a = se * se + jnp.abs(be) ** 2
    d = jnp.abs(ge) ** 2
    off = jnp.conj(be) * ge                                                  # M[0, 1]
    half = (a - d) / 2
    lmax = (a + d) / 2 + jnp.sqrt(half * half + jnp.abs(off) ** 2)
    lmin = jnp.where(lmax > 0, se * se * d / jnp.where(lmax > 0, lmax, 1), 0)
    # the eigenvector of lmax, from the row that cannot vanish
    v1 = jnp.where(a >= d, (lmax - d).astype(off.dtype), off)
    v2 = jnp.where(a >= d, jnp.conj(off), (lmax - a).astype(off.dtype))
    nv = jnp.sqrt(jnp.abs(v1) ** 2 + jnp.abs(v2) ** 2)
    v1, v2 = jnp.where(nv > 0, v1 / jnp.where(nv > 0, nv, 1), 1), jnp.where(nv > 0, v2 / jnp.where(nv > 0, nv, 1), 0)
    if largest:
        return t * jnp.sqrt(lmax), v1, v2
    return t * jnp.sqrt(lmin), -jnp.conj(v2), jnp.conj(v1)


def _gelsy_rank(R, rcond):
    """gelsy's rank of R (the triangle of a QR with column pivoting): the largest r with
    smax(R[:r, :r]) * rcond <= smin(R[:r, :r]), both estimated incrementally (laic1); 0
    when R[0, 0] is 0."""
    p = R.shape[-2]
    idx = jnp.arange(p)
    r00 = jnp.abs(R[..., 0, 0])
    dt = R.dtype
    e0 = jnp.where(idx == 0, 1, 0).astype(dt) * jnp.ones(R.shape[:-2] + (1,), dt)

    def step(i, carry):
        xmin, xmax, smin, smax, rank, alive = carry
        w = jnp.where(idx < i, lax.dynamic_index_in_dim(R, i, axis=-1, keepdims=False), 0)
        gamma = jnp.sum(jnp.where(idx == i, lax.dynamic_index_in_dim(R, i, axis=-1, keepdims=False), 0), axis=-1)
        snew, s1, c1 = _ice_step(smin, xmin, w, gamma, largest=False)
        lnew, s2, c2 = _ice_step(smax, xmax, w, gamma, largest=True)
        go = alive & (lnew * rcond <= snew)
        at = idx == i
        xmin = jnp.where(go[..., None], jnp.where(at, c1[..., None], s1[..., None] * xmin), xmin)
        xmax = jnp.where(go[..., None], jnp.where(at, c2[..., None], s2[..., None] * xmax), xmax)
        return (xmin, xmax, jnp.where(go, snew, smin), jnp.where(go, lnew, smax), rank + go.astype(rank.dtype), go)

    alive = r00 != 0
    init = (e0, e0, r00, r00, alive.astype(widths.long_dtype()), alive)
    return lax.fori_loop(1, p, step, init)[4]


def _sv_threshold(s, rcond, driver, real):
    """Singular values counted as nonzero: gelsd takes s > rcond * s_max (eps for an rcond
    outside (0, 1)); gelss s > max(rcond * s_max, safe minimum) (eps * s_max for rcond < 0)."""
    fin = jnp.finfo(real)
    smax = s[..., :1]
    if driver == "gelsd":
        rc = rcond if 0 < rcond < 1 else float(fin.eps) / 2
        return s > rc * smax
    rc = rcond if rcond >= 0 else float(fin.eps)
    return s > jnp.maximum(rc * smax, float(fin.tiny))


def _gelsy_compiles(platform, args, kwargs):
    """gelsy (the default driver) factors with a pivoted QR (``geqp3``), which XLA's TPU
    compiler does not have (a v5e: "MLIR translation rule for primitive 'geqp3' not found"):
    there such a call runs on the CPU (``registry.CALL_PLATFORMS``), the other drivers on the
    chip."""
    return platform != "tpu" or kwargs.get("driver") not in (None, "gelsy")


@register("linalg_lstsq.default", compiles=_gelsy_compiles)
def lstsq(sig, A, B, rcond=None, *, driver=None):
    """(solution, residuals, rank, singular values) as LAPACK's drivers give them, the
    matrices factored once (A's batch) and the solves broadcast:
    - gels: QR (m >= n; residuals: the squared norm of the rows n: of Q^H B when m > n) or
      the minimum-norm solution through the QR of A^H (m < n); A is taken as full rank;
    - gelsy: QR with column pivoting, the rank by incremental condition estimation against
      rcond, then the minimum-norm solution with the trailing block dropped;
    - gelsd, gelss: the SVD, singular values up to rcond * the largest dropped.
    rcond defaults to eps * max(m, n) (PyTorch's)."""
    drv, vector, m, n, k, batch = _lstsq_layout(A.shape, B.shape, driver)
    dt = _dt(sig)
    real = jnp.real(jnp.zeros((), dt)).dtype
    if rcond is None:
        rcond = float(jnp.finfo(real).eps) * max(m, n)
    A = A.astype(dt)
    B = (B[..., None] if vector else B).astype(dt)
    a_batch = A.shape[:-2]
    mn = min(m, n)
    res = rank = sv = None
    if mn == 0 or k == 0:  # LAPACK's quick return: gels zeroes B, the others leave it
        X = jnp.zeros(batch + (n, k), dt)
        if m > n:
            res = jnp.sum(jnp.abs(_to_batch(B, batch)) ** 2, axis=-2) * (drv != "gels")
        rank = jnp.zeros(a_batch, widths.long_dtype())
        sv = jnp.zeros(a_batch + (mn,), real)
    elif drv == "gels":
        if m >= n:
            Q, R = jnp.linalg.qr(A, mode="complete")
            c = _mm(_mH(_to_batch(Q, batch)), _to_batch(B, batch))
            X = _trsm(_to_batch(R[..., :n, :], batch), c[..., :n, :], lower=False)
            res = jnp.sum(jnp.abs(c[..., n:, :]) ** 2, axis=-2)
        else:
            U, T = jnp.linalg.qr(_mH(A), mode="reduced")
            X = _mm(_to_batch(U, batch), _trsm(_to_batch(T, batch), _to_batch(B, batch), lower=False, adjoint=True))
    elif drv == "gelsy":
        Q, R, P = lax.linalg.qr(A, pivoting=True, full_matrices=False)
        rank = _gelsy_rank(R, rcond)
        c = _mm(_mH(_to_batch(Q, batch)), _to_batch(B, batch))
        Xp = _solve_min_norm(_to_batch(R, batch), c, jnp.broadcast_to(rank, batch))
        inv = jnp.argsort(_to_batch(P, batch, 1), axis=-1)
        X = jnp.take_along_axis(Xp, inv[..., :, None], axis=-2)           # X[P[j]] = Xp[j]
    else:
        U, S, Vh = jnp.linalg.svd(A, full_matrices=False)
        keep = _sv_threshold(S, rcond, drv, real)
        rank = jnp.sum(keep, axis=-1).astype(widths.long_dtype())
        sv = S
        inv = jnp.where(keep, 1 / jnp.where(keep, S, 1), 0).astype(dt)
        c = _mm(_mH(_to_batch(U, batch)), _to_batch(B, batch)) * _to_batch(inv, batch, 1)[..., :, None]
        X = _mm(_mH(_to_batch(Vh, batch)), c)
        if m > n:  # reached only when the rank is n for all (see the shape rule)
            r = _mm(_to_batch(A, batch), X) - _to_batch(B, batch)
            res = jnp.sum(jnp.abs(r) ** 2, axis=-2)
    outs = [X[..., 0] if vector else X, res, rank, sv]
    for i in (1, 2, 3):  # an output PyTorch leaves empty for this driver and shape
        if outs[i] is None or (tuple(sig.outs[i].shape) == (0,) and outs[i].shape != (0,)):
            outs[i] = _empty(sig, i)
    return tuple(outs)


# ---------------------------------------------------------------------------------------
@register("linalg_matrix_exp.default", native_float64=True)
def matrix_exp(sig, A):
    if A.dtype in (jnp.float16, jnp.bfloat16):  # JAX's expm refuses them: float32, rounded at the end
        return jsl.expm(A.astype(jnp.float32)).astype(A.dtype)
    return jsl.expm(A)
