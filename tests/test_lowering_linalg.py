"""Linear algebra on the device (lazyxla/lowering/linalg.py) against PyTorch eager CPU.

Each case runs a function on CPU tensors and on their device copies (one matrix and a
batch, in one graph), checks that no op fell back to the CPU (no ``aten::`` counter) and
compares the values. Singular vectors and eigenvectors, which PyTorch documents as unique
only up to sign (phase, for complex ones), are compared after aligning each vector's sign
(phase) with eager's, the same for U's column and Vh's row of one singular value.
"""
from __future__ import annotations

import textwrap

import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla.frontend.signature import LazyXlaError
from lazyhelp import in_a_child, json_runs, on_the_cpu_here

DEV = lazyxla.device()
F32 = dict(rtol=1e-4, atol=1e-4)
F64 = dict(rtol=1e-10, atol=1e-10)

pytestmark = pytest.mark.filterwarnings("ignore:torch\\.(cholesky|lu_solve|triangular_solve|qr) is deprecated")


def _map(fn, x):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return tuple(_map(fn, y) for y in x)
    return x


def _lazy(fn, *inputs):
    """``fn`` on device copies of ``inputs``, read back; asserts no op fell back to the CPU but
    those this device runs there by rule (a TPU's eig, and its eigh in float64)."""
    met.clear_counters()
    out = fn(*_map(lambda t: t.to(DEV), inputs))
    lazyxla.sync()
    got = _map(lambda t: t.cpu(), out)
    here = on_the_cpu_here(float64=True)
    fallbacks = [n for n in met.counter_names() if n.startswith("aten::") and n not in here]
    assert not fallbacks, fallbacks
    return got


def check(fn, *inputs, tol=F32):
    want = _map(lambda t: t, fn(*inputs))
    got = _lazy(fn, *inputs)
    torch.testing.assert_close(got, want, **tol)
    return got, want


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=gen(seed), dtype=dtype)


def invertible(*shape, seed=0, dtype=torch.float32):
    n = shape[-1]
    return randn(*shape, seed=seed, dtype=dtype) + n * torch.eye(n, dtype=dtype)


def spd(*shape, seed=0, dtype=torch.float32):
    x = randn(*shape, seed=seed, dtype=dtype)
    return x @ x.mT + shape[-1] * torch.eye(shape[-1], dtype=dtype)


A, AB = invertible(4, 4), invertible(3, 4, 4, seed=1)      # a matrix and a batch
S, SB = spd(4, 4), spd(2, 4, 4, seed=2)                     # symmetric positive definite
B, BB = randn(4, 3, seed=3), randn(3, 4, 3, seed=4)         # right-hand sides


# ---------------------------------------------------------------------------------------
# Cholesky.
def test_cholesky_ex_lower_upper_and_info():
    check(lambda s, sb: (torch.linalg.cholesky_ex(s), torch.linalg.cholesky_ex(sb, upper=True),
                         torch.linalg.cholesky(sb), torch.cholesky(s, upper=True)), S, SB)
    bad = spd(4, 5, 5, seed=5)
    bad[1, 2, 2] = -50.0   # the third leading minor is not positive definite
    bad[2, 0, 0] = -1.0    # the first
    bad[3, 4, :] = 0
    bad[3, :, 4] = 0       # the last (a zero pivot)
    want = torch.linalg.cholesky_ex(bad).info
    got = _lazy(lambda x: torch.linalg.cholesky_ex(x).info, bad)
    assert want.tolist() == [0, 3, 1, 5] and torch.equal(got, want)


def test_cholesky_reads_one_triangle():
    x = S + torch.triu(randn(4, 4, seed=6), 1)  # not symmetric: PyTorch reads the lower triangle
    check(lambda x: (torch.linalg.cholesky(x), torch.linalg.cholesky(x.mT, upper=True)), x)


def test_cholesky_solve_and_inverse():
    L, LB = torch.linalg.cholesky(S), torch.linalg.cholesky(SB)
    check(lambda b, l, bb, lb: (torch.cholesky_solve(b, l), torch.cholesky_solve(bb[:2], lb),
                                torch.cholesky_solve(b, l.mT, upper=True), torch.cholesky_inverse(l),
                                torch.cholesky_inverse(lb.mT, upper=True)), B, L, BB, LB)


# ---------------------------------------------------------------------------------------
# LU, solves, inverses, determinants.
def test_inv_and_solve():
    check(lambda a, ab, b, bb: (torch.linalg.inv(a), torch.linalg.inv_ex(ab), torch.inverse(a.mT),
                                torch.linalg.solve(a, b), torch.linalg.solve_ex(ab, bb),
                                torch.linalg.solve(ab, b[:, 0]),            # a batch of vectors, broadcast
                                torch.linalg.solve(a, bb.mT, left=False),   # X A = B
                                torch.linalg.solve(a.mT, b)), A, AB, B, BB)


def test_singular_info_is_getrf_s():
    m = torch.tensor([[0., 0.], [1., 1.]])
    batch = torch.stack([m, m.mT, torch.eye(2)])
    got, want = check(lambda x: (torch.linalg.inv_ex(x).info, torch.linalg.lu_factor_ex(x).info,
                                 torch.linalg.solve_ex(x, torch.ones(3, 2, device=x.device)).info,
                                 torch.linalg.det(x), torch.linalg.slogdet(x)), batch)
    assert want[0].tolist() == [2, 1, 0]


def test_det_slogdet_logdet():
    check(lambda a, ab: (torch.linalg.det(a), torch.linalg.det(ab), torch.linalg.det(ab.mT),
                         torch.linalg.slogdet(-a), torch.linalg.slogdet(ab.mT), torch.logdet(a)), A, AB)


def test_lu_factor_lu_unpack_lu_solve():
    rect, rectb = randn(5, 3, seed=7), randn(2, 3, 5, seed=8)

    def fn(a, ab, b, bb, rect, rectb):
        LU, piv = torch.linalg.lu_factor(a)
        LUB, pivb, info = torch.linalg.lu_factor_ex(ab)
        return (LU, piv, LUB, pivb, info, torch.linalg.lu_factor(rect), torch.linalg.lu(rectb), torch.linalg.lu(a),
                torch.lu_unpack(LU, piv), torch.lu_unpack(*torch.linalg.lu_factor(rect)),
                torch.lu_unpack(LUB, pivb, unpack_data=False), torch.lu_unpack(LUB, pivb, unpack_pivots=False),
                torch.linalg.lu_solve(LU, piv, b), torch.linalg.lu_solve(LUB, pivb, bb, adjoint=True),
                torch.linalg.lu_solve(LU, piv, bb.mT, left=False),
                torch.linalg.lu_solve(LUB, pivb, bb.mT, left=False, adjoint=True),
                torch.lu_solve(b, LU, piv))
    got, want = check(fn, A, AB, B, BB, rect, rectb)
    assert got[1].dtype == torch.int32 and got[1].min() >= 1  # LAPACK's 1-based pivots


def test_lu_without_pivoting_is_refused_as_on_the_cpu():
    with pytest.raises(RuntimeError, match="without pivoting"):
        torch.linalg.lu_factor(A, pivot=False)
    with pytest.raises(LazyXlaError, match="without pivoting"):
        torch.linalg.lu_factor(A.to(DEV), pivot=False)


def test_triangular_solves():
    # full matrices: the solves read one triangle
    x, xb = randn(4, 4, seed=9) + 4 * torch.eye(4), randn(3, 4, 4, seed=10) + 4 * torch.eye(4)
    check(lambda x, xb, b, bb: (torch.linalg.solve_triangular(x, b, upper=True),
                                torch.linalg.solve_triangular(xb, bb, upper=False, unitriangular=True),
                                torch.linalg.solve_triangular(x, bb.mT, upper=False, left=False),
                                torch.triangular_solve(b, x),
                                torch.triangular_solve(bb, xb, upper=False, transpose=True),
                                torch.triangular_solve(bb, x, unitriangular=True)), x, xb, B, BB)


def test_ldl_factor_and_solve():
    """Bunch-Kaufman as LAPACK's sytrf (MKL's, eager's): the same 1x1/2x2 blocks and
    pivots, info for a singular matrix; the Hermitian variant on a complex matrix; a solve
    with the factors."""
    x = randn(4, 5, 5, seed=26)
    a = x + x.mT
    a[0, 0, 0] = 0
    a[1, :2, :2] = 0  # zeros on the diagonal: 2x2 pivots
    a[3] = 0          # singular: info 1
    z = torch.complex(randn(5, 5, seed=29), randn(5, 5, seed=30))
    h = z + z.mH
    h[2, 2] = 0
    def fn(a, h, bb):
        fa = torch.linalg.ldl_factor_ex(a)
        return fa, torch.linalg.ldl_factor_ex(h, hermitian=True), torch.linalg.ldl_solve(fa.LD[:3], fa.pivots[:3], bb)
    got, want = check(fn, a, h, randn(3, 5, 2, seed=28))
    LD, pivots, info = want[0]
    assert (pivots < 0).any() and info.tolist() == [0, 0, 0, 1]


# ---------------------------------------------------------------------------------------
# QR and Householder.
def test_qr_modes():
    tall, wide = randn(5, 3, seed=11), randn(2, 3, 5, seed=12)
    check(lambda t, w: (torch.linalg.qr(t), torch.linalg.qr(t, mode="complete"), torch.linalg.qr(w, mode="r"),
                        torch.linalg.qr(w), torch.qr(t)), tall, wide)


def test_householder_product_and_ormqr():
    g, tau = torch.geqrf(randn(5, 3, seed=13))           # reflectors from eager geqrf
    gb, taub = torch.geqrf(randn(2, 4, 4, seed=14))
    c, cb, cr = randn(5, 2, seed=15), randn(2, 4, 3, seed=16), randn(2, 5, seed=17)
    check(lambda g, tau, gb, taub, c, cb, cr: (
        torch.linalg.householder_product(g, tau), torch.linalg.householder_product(gb, taub[:, :2]),
        torch.ormqr(g, tau, c), torch.ormqr(g, tau, c, transpose=True), torch.ormqr(g, tau, cr, left=False),
        torch.ormqr(gb, taub, cb), torch.ormqr(gb, taub, cb.mT, left=False, transpose=True)),
        g, tau, gb, taub, c, cb, cr)


# ---------------------------------------------------------------------------------------
# SVD, eigendecompositions (vectors up to sign or phase), pseudo-inverse.
def _align(got, want, dim):
    """Per vector along ``dim`` (columns: -2 summed, rows: -1 summed): the unit factor that
    turns ``got``'s vector into ``want``'s."""
    d = (got.conj() * want).sum(dim, keepdim=True)
    return torch.where(d.abs() > 0, d / d.abs(), torch.ones_like(d))


@pytest.mark.parametrize("full", [False, True])
def test_svd(full):
    tall, wideb = randn(5, 3, seed=18), randn(2, 3, 4, seed=19)

    def fn(t, w):
        return torch.linalg.svd(t, full_matrices=full), torch.linalg.svd(w, full_matrices=full), \
            torch.linalg.svdvals(w), torch.svd(t)
    want, got = fn(tall, wideb), _lazy(fn, tall, wideb)
    torch.testing.assert_close(got[2], want[2], **F32)
    for (U, s, Vh), (u, gs, vh) in zip(want[:2], got[:2]):
        k = s.shape[-1]
        torch.testing.assert_close(gs, s, **F32)
        f = _align(u[..., :k], U[..., :k], -2)  # one sign per singular value, for U's column and Vh's row
        torch.testing.assert_close(u[..., :k] * f, U[..., :k], **F32)
        torch.testing.assert_close(vh[..., :k, :] * f.mT, Vh[..., :k, :], **F32)
        torch.testing.assert_close(u.mH @ u, torch.eye(u.shape[-1]).expand_as(u.mH @ u), **F32)
    U, s, V = want[3]
    u, gs, v = got[3]
    torch.testing.assert_close((u * gs[None]) @ v.mT, (U * s[None]) @ V.mT, **F32)


def test_eigh_reads_one_triangle():
    x, xb = randn(4, 4, seed=20), randn(2, 4, 4, seed=21)  # not symmetric: UPLO picks the triangle

    def fn(x, xb):
        return torch.linalg.eigh(x), torch.linalg.eigh(xb, UPLO="U"), torch.linalg.eigvalsh(xb)
    want, got = fn(x, xb), _lazy(fn, x, xb)
    torch.testing.assert_close(got[2], want[2], **F32)
    for (w, V), (gw, v) in zip(want[:2], got[:2]):
        torch.testing.assert_close(gw, w, **F32)
        torch.testing.assert_close(v * _align(v, V, -2), V, **F32)


def test_eig_complex_results():
    x, xb = randn(4, 4, seed=22), randn(2, 3, 3, seed=23)

    def fn(x, xb):
        # linalg.eigvals of a tensor subclass goes through linalg_eig; _linalg_eigvals directly
        return torch.linalg.eig(x), torch.linalg.eig(xb), torch.linalg.eigvals(xb), torch.ops.aten._linalg_eigvals(xb)
    want, got = fn(x, xb), _lazy(fn, x, xb)
    assert got[0][0].dtype == torch.complex64 and got[0][1].dtype == torch.complex64
    torch.testing.assert_close(got[2:], want[2:], **F32)
    for (w, V), (gw, v) in zip(want[:2], got[:2]):
        torch.testing.assert_close(gw, w, **F32)   # LAPACK's order
        torch.testing.assert_close(v * _align(v, V, -2), V, **F32)


@in_a_child("the platform rule, simulated; on a TPU test_eig_complex_results runs it")
def test_eig_runs_on_the_cpu_where_it_does_not_compile():
    """XLA's TPU compiler has no nonsymmetric eigendecomposition (``linalg.eig`` failed to compile
    on a v5e): there the op runs on the CPU, counted as ``aten::linalg_eig``, with eager's values,
    while eigh stays lowered. In float64, which a TPU emulates, eigh gave NaN eigenvectors: a
    float64 eigh runs on the CPU there (``registry.NATIVE_FLOAT64``), and so does hash_tensor of a
    float64 input (its emulated bits are not IEEE's), float64 LU (solve: a TPU factors float32
    only), Bessel J0 and float64 powers (float_power's), each counted as itself, and lstsq's default driver, gelsy (a TPU has no
    pivoted QR); so do float32 calls of the ops that compute float32 in float64 (the special
    functions, logcumsumexp). The platform is simulated in a process of its own."""
    code = textwrap.dedent("""
        import json, torch, lazyxla
        import lazyxla.debug.metrics as met
        import types
        from lazyxla.frontend import signature
        from lazyxla.xla import widths
        signature.jax_device = lambda: types.SimpleNamespace(platform="tpu")  # the signature's view only
        widths.FLOAT64_NATIVE["cpu"] = False  # float64 emulated, as on a TPU
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
        d = lazyxla.device()
        w, v = torch.linalg.eig(x.to(d))
        h = torch.linalg.eigvalsh((x @ x.T).to(d))
        lowered = met.counter_value("aten::_linalg_eigh")
        h64, v64 = torch.linalg.eigh((x @ x.T).double().to(d))
        e64, ev64 = torch.linalg.eigh((x @ x.T).double())
        sol = [torch.linalg.lstsq(x.to(d), x[:, :2].to(d), driver=drv).solution.cpu() for drv in (None, "gels")]
        solved = [met.counter_value("aten::linalg_lstsq"),
                  all(torch.allclose(s, torch.linalg.lstsq(x, x[:, :2]).solution, atol=1e-4) for s in sol)]
        spd64 = (x @ x.T + 4 * torch.eye(4)).double()
        wide = [torch.equal(torch.linalg.solve(spd64.to(d), x.double().to(d)).cpu(), torch.linalg.solve(spd64, x.double())),
                torch.equal(torch.special.bessel_j0(x.double().to(d)).cpu(), torch.special.bessel_j0(x.double())),
                met.counter_value("aten::_linalg_solve_ex"), met.counter_value("aten::special_bessel_j0")]
        base, power = torch.tensor([-0.0, -float("inf"), 2.5]), torch.tensor([-1.0, 0.5, 2.0])
        wide += [torch.equal(torch.float_power(base.to(d), power.to(d)).cpu(), torch.float_power(base, power)),
                 met.counter_value("aten::pow"), torch.equal((x.to(d) ** 2).cpu(), x ** 2), met.counter_value("aten::pow")]
        narrow = [torch.equal(torch.special.digamma(x.to(d)).cpu(), torch.special.digamma(x)),
                  torch.equal(torch.logcumsumexp(x.to(d), 0).cpu(), torch.logcumsumexp(x, 0)),
                  met.counter_value("aten::digamma"), met.counter_value("aten::logcumsumexp")]
        half = torch.special.digamma(x.bfloat16().to(d)).cpu()
        narrow += [met.counter_value("aten::digamma"), half.dtype == torch.bfloat16]
        hashed = [torch.hash_tensor(x.double().to(d)).cpu() == torch.hash_tensor(x.double()),
                  torch.hash_tensor(x.to(d)).cpu() == torch.hash_tensor(x)]
        print(json.dumps([narrow, wide, solved, met.counter_value("aten::hash_tensor"), [bool(h) for h in hashed],
                          met.counter_value("aten::linalg_eig"), lowered, met.counter_value("aten::_linalg_eigh"),
                          torch.allclose(w.cpu(), torch.linalg.eig(x)[0]), type(w).__name__,
                          torch.allclose(h.cpu(), torch.linalg.eigvalsh(x @ x.T), atol=1e-4),
                          torch.equal(h64.cpu(), e64), torch.equal(v64.cpu(), ev64), h64.dtype == torch.float64]))
    """)
    narrow, wide, solved, hashes, hashed, eig, eigh, eigh64, same, kind, same_h, same_h64, same_v64, f64 = json_runs(code, JAX_PLATFORMS="cpu")[0]
    # float32 calls of the special functions and logcumsumexp, whose work is float64, on the CPU as
    # themselves, with eager's values; a bfloat16 call (its work float32) stays lowered
    assert narrow == [True, True, 1, 1, 1, True]
    # float64 LU (a TPU's is float32 only), Bessel J0 and float_power's float64 power on the CPU, as
    # themselves; a float32 power stays lowered
    assert wide == [True, True, 1, 1, True, 1, True, 1]
    assert solved == [1, True]  # lstsq's gelsy (its default) on the CPU, gels lowered: a TPU has no pivoted QR
    assert hashes == 1 and hashed == [True, True]  # float64's hash on the CPU, float32's lowered
    assert eig == 1 and not eigh and eigh64 == 1
    assert same and same_h and kind == "LazyTensor"
    assert same_h64 and same_v64 and f64


def test_pinv():
    tall, sq = randn(5, 3, seed=24), spd(2, 4, 4, seed=25)
    sq[0] = sq[0] @ torch.diag(torch.tensor([1.0, 1.0, 1.0, 0.0])) @ sq[0]  # rank 3: one value dropped
    check(lambda t, s: (torch.linalg.pinv(t), torch.linalg.pinv(s), torch.linalg.pinv(s, hermitian=True),
                        torch.linalg.pinv(t, atol=0.5), torch.linalg.pinv(t, rtol=0.3),
                        torch.pinverse(t), torch.linalg.pinv(s, rtol=torch.tensor([0.1, 0.2], device=s.device))),
          tall, sq)


def test_matrix_exp():
    check(lambda a, ab: (torch.linalg.matrix_exp(a / 4), torch.matrix_exp(ab / 4)), A, AB)


@pytest.mark.float64
def test_float64():
    check(lambda a, ab, s, b: (torch.linalg.inv(a), torch.linalg.det(ab), torch.linalg.solve(ab, b),
                               torch.linalg.cholesky(s), torch.linalg.qr(ab), torch.linalg.svdvals(ab),
                               torch.linalg.eigvalsh(s), torch.linalg.matrix_exp(a / 4), torch.linalg.pinv(ab)),
          A.double(), AB.double(), S.double(), B.double(), tol=F64)


# ---------------------------------------------------------------------------------------
@pytest.mark.float64
def test_autograd_matches_eager_without_fallback():
    """Backward formulas of inv, det (contiguous and transposed: PyTorch factors A^T for a
    contiguous A), solve, cholesky and a gauge-invariant SVD loss."""
    def loss(a, s, b):
        U, sv, Vh = torch.linalg.svd(a)
        return (torch.linalg.inv(a).sum() + torch.linalg.det(a) + torch.linalg.det(a.mT) * 2
                + torch.linalg.slogdet(a).logabsdet + torch.linalg.solve(a, b).sum() + torch.linalg.solve(a.mT, b).sum()
                + torch.linalg.cholesky(s).sum() + sv.sum() + (U @ Vh).sum())

    def grads(a, s, b):
        a, s, b = (t.detach().requires_grad_() for t in (a, s, b))
        return torch.autograd.grad(loss(a, s, b), [a, s, b])

    a, s, b = A.double(), S.double(), B.double()
    torch.testing.assert_close(_lazy(grads, a, s, b), grads(a, s, b), **F64)
