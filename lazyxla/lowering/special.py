"""Special functions (``torch.special``, ``i0``, ``polygamma``, ``igamma``, the orthogonal
polynomials) as JAX functions.

Values follow PyTorch's CPU kernels, their edge cases included (``bessel_j0(inf)`` is nan,
``i0(inf)`` is nan, ``digamma(-0.)`` is +inf, the Hurwitz zeta of a negative non-integer
``q``, ...). ``jax.scipy.special`` is used where it agrees with PyTorch; the rest is written
here from the functions' mathematical definitions: power series near 0, Miller's backward
recurrence with the Neumann series for the Bessel functions of moderate argument, the
trapezoidal rule on ``K_nu(x) = int_0^inf exp(-x cosh t) cosh(nu t) dt``, Hankel's
asymptotic expansions for large arguments, Taylor series of Airy's equation about tabulated
points, Euler-Maclaurin summation for the Hurwitz zeta, and the three-term recurrences of
the polynomials.

Dtypes: float32 and float64 inputs are computed in float64 and rounded once (PyTorch's
kernels for these functions accumulate in double or are accurate to a few float32 steps);
float16/bfloat16 in float32. These algorithms' series and recurrences overflow or cancel in
float32 (``bessel_j0``, ``bessel_y1``, ``zeta`` and ``erfcx`` gave nan or 0 on a grid of float32
inputs computed so), and where the device emulates float64 (a TPU) that float64 is not enough
either: a v5e compiled the float32 test's program in emulated float64 for 81 s, and bessel_j0,
bessel_y1, airy_ai, erfcx, digamma, trigamma, log_ndtr, zeta and spherical_bessel_j0 came out
wrong (2026-12-07; its float64 Bessel J0 gave nan on 17 of 20 inputs). So there every float32
and float64 call of a function here but ``entr`` runs on the CPU, with eager's values, counted
as ``aten::<op>`` (``_in_float64``: ``registry.NATIVE_FLOAT64``); half-type calls,
computed in float32, stay on the device. Where PyTorch's value
depends on a rounding in the input dtype (the phase ``x - pi/4`` of the Bessel asymptotics,
``x * x`` in ``erfcx``, the polynomials, which PyTorch evaluates in the input dtype), that
rounding is kept. Touches only the registry.
"""
from __future__ import annotations

import functools
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import jax.scipy.special as jss

from ..xla import precision, widths
from ..xla.client import jnp_dtype
from .registry import register

# every lowering here but entr's computes float32 in float64 (``_work``): where float64 is
# emulated, its float32 and float64 calls run on the CPU (the module's docstring)
_in_float64 = functools.partial(register, native_float64="float32")

_EULER = 0.57721566490153286061
_HALF = (jnp.float16, jnp.bfloat16)


def _out(sig):
    return jnp_dtype(sig.outs[0].dtype)


def _work(dt):
    """The compute dtype for a result dtype: float64 for float32/float64, float32 for halves."""
    return jnp.float32 if dt in _HALF else jnp.float64


def _unary(fn, phase=False):
    """A unary lowering: the input cast to the result dtype (integers become floats, as in
    PyTorch), computed by ``fn`` in the work dtype. ``phase``: ``fn`` also receives the
    input in its own dtype, for roundings PyTorch does there."""
    def lower(sig, x):
        dt = _out(sig)
        x = x.astype(dt)
        w = x.astype(_work(dt))
        return fn(w, x) if phase else fn(w)
    return lower


def _poly(coefs, z):
    """sum(coefs[k] * z**k), by Horner's rule."""
    acc = jnp.full_like(z, coefs[-1])
    for c in reversed(coefs[:-1]):
        acc = acc * z + c
    return acc


# ---------------------------------------------------------------------------------------
# Modified Bessel functions of the first kind: jax.scipy.special, with PyTorch's inf -> nan.
def _nan_at_inf(f):
    return lambda x: jnp.where(jnp.isinf(x), jnp.nan, f(x))


_in_float64("i0.default", "special_modified_bessel_i0.default")(_unary(_nan_at_inf(jss.i0)))
_in_float64("special_i1.default", "special_modified_bessel_i1.default")(_unary(_nan_at_inf(jss.i1)))
_in_float64("special_i0e.default")(_unary(jss.i0e))
_in_float64("special_i1e.default")(_unary(jss.i1e))
_in_float64("special_ndtri.default")(_unary(jss.ndtri))
_in_float64("special_log_ndtr.default")(_unary(jss.log_ndtr))


@register("special_entr.default")
def _entr(sig, x):
    """-x log(x), 0 at 0, -inf below, nan kept; PyTorch's half kernel rounds log(x) to the
    half type before the product."""
    dt = _out(sig)
    w = jnp.float32 if dt in _HALF else dt
    x = x.astype(dt).astype(w)
    lg = jnp.log(jnp.where(x > 0, x, 1))
    lg = lg.astype(dt).astype(w) if dt in _HALF else lg
    r = jnp.where(x > 0, -x * lg, jnp.where(x == 0, jnp.zeros_like(x), -jnp.inf))
    return jnp.where(jnp.isnan(x), x, r)


# ---------------------------------------------------------------------------------------
# erfcx(x) = exp(x^2) erfc(x)
def _erfcx_pos(y):
    """erfcx for y >= 0: JAX's below 25, the asymptotic series above (JAX's underflows)."""
    big = jnp.maximum(y, 25.0)
    z = 1 / (2 * big * big)
    tail = _poly([1.0, -1.0, 3.0, -15.0, 105.0, -945.0, 10395.0], z) / (big * math.sqrt(math.pi))
    return jnp.where(y < 25.0, jss.erfcx(jnp.minimum(y, 25.0)), tail)


@_in_float64("special_erfcx.default")
def _erfcx(sig, x):
    dt = _out(sig)
    x = x.astype(dt)
    w = x.astype(_work(dt))
    xx = (x * x).astype(w.dtype)  # PyTorch squares in the input dtype for x < 0
    neg = 2 * jnp.exp(xx) - _erfcx_pos(jnp.abs(w))
    return jnp.where(w < 0, neg, _erfcx_pos(jnp.abs(w)))


# ---------------------------------------------------------------------------------------
# Bessel functions of the first and second kind, J0, J1, Y0, Y1.
def _hankel(nu, terms=32):
    """The coefficients a_k(nu) of Hankel's expansions: prod_{j<=k} (4nu^2 - (2j-1)^2) / (k! 8^k)."""
    a, mu = [1.0], 4 * nu * nu
    for k in range(1, terms):
        a.append(a[-1] * (mu - (2 * k - 1) ** 2) / (8 * k))
    return a


_HANKEL = {0: _hankel(0), 1: _hankel(1)}
_BIG = 25.0  # Hankel's expansions from here on: 32 terms are exact to double precision
_SMALL = 2.0  # power series below


def _pq(nu, x):
    """Hankel's P and Q for order nu at x >= 25."""
    a = _HANKEL[nu]
    z = 1 / (x * x)
    p = _poly([(-1) ** m * a[2 * m] for m in range(len(a) // 2)], z)
    q = _poly([(-1) ** m * a[2 * m + 1] for m in range(len(a) // 2)], z) / x
    return p, q


def _harmonic(k):
    return sum(1.0 / j for j in range(1, k + 1))


_SERIES = 22  # terms of the power series at |x| <= 2


def _jy_series(x):
    """J0, J1, Y0, Y1 at 0 < x <= 2 from their power series (Y: with the logarithm)."""
    q = x * x / 4
    lg = jnp.log(x / 2) + _EULER
    j0 = _poly([(-1) ** k / math.factorial(k) ** 2 for k in range(_SERIES)], q)
    j1 = x / 2 * _poly([(-1) ** k / (math.factorial(k) * math.factorial(k + 1)) for k in range(_SERIES)], q)
    s0 = _poly([0.0] + [(-1) ** (k + 1) * _harmonic(k) / math.factorial(k) ** 2 for k in range(1, _SERIES)], q)
    y0 = 2 / math.pi * (lg * j0 + s0)
    # psi(k+1) + psi(k+2) = 2 H_k + 1/(k+1) - 2 gamma
    s1 = _poly([(-1) ** k * (2 * _harmonic(k) + 1 / (k + 1) - 2 * _EULER) / (math.factorial(k) * math.factorial(k + 1))
                for k in range(_SERIES)], q)
    y1 = -2 / (math.pi * x) + 2 / math.pi * (jnp.log(x / 2) * j1) - x / (2 * math.pi) * s1
    return j0, j1, y0, y1


_MILLER = 70  # start of the backward recurrence: J_70(25) is below 1e-23


def _miller_coefficients():
    """Per m = M..1: the weight of J_m in the normalisation J0 + 2 sum J_2k, in
    sum (-1)^k J_2k / k (Y0) and in sum (-1)^k (J_2k-1 - J_2k+1) / k (Y1)."""
    norm, s0, s1 = [], [], []
    for m in range(_MILLER, 0, -1):
        j = (m - 1) // 2
        norm.append(2.0 if m % 2 == 0 else 0.0)
        s0.append((-1) ** (m // 2) / (m // 2) if m % 2 == 0 else 0.0)
        s1.append(0.0 if m % 2 == 0 else (-1) ** (j + 1) * (1 / (j + 1) + (1 / j if j >= 1 else 0.0)))
    return norm, s0, s1


_MILLER_COEF = _miller_coefficients()


def _jy_miller(x):
    """J0, J1, Y0, Y1 at 2 <= x <= 25: Miller's backward recurrence J_{m-1} = (2m/x) J_m - J_{m+1}
    from J_M = 1, normalised by J0 + 2 sum J_2k = 1; Y0 and Y1 from the Neumann series
    Y0 = (2/pi)(log(x/2) + gamma) J0 - (4/pi) sum (-1)^k J_2k / k and its derivative."""
    cn, c0, c1 = (jnp.asarray(c, x.dtype) for c in _MILLER_COEF)
    two_x = 2 / x

    def step(i, st):
        nxt, cur, norm, s0, s1 = st  # cur is J_m, m = M - i
        m = (_MILLER - i).astype(x.dtype)
        return cur, m * two_x * cur - nxt, norm + cn[i] * cur, s0 + c0[i] * cur, s1 + c1[i] * cur

    z = jnp.zeros_like(x)
    nxt, cur, norm, s0, s1 = jax.lax.fori_loop(0, _MILLER, step, (z, jnp.ones_like(x), z, z, z))
    total = norm + cur
    j0, j1 = cur / total, nxt / total
    lg = jnp.log(x / 2) + _EULER
    y0 = 2 / math.pi * lg * j0 - 4 / math.pi * s0 / total
    y1 = -2 / (math.pi * x) * j0 + 2 / math.pi * lg * j1 + 2 / math.pi * s1 / total
    return j0, j1, y0, y1


def _jy_asymptotic(nu, x, xin):
    """J_nu and Y_nu at x >= 25 (Hankel), the phase x - (nu/2 + 1/4) pi rounded in the
    input dtype as PyTorch does."""
    p, q = _pq(nu, x)
    w = (xin - jnp.asarray((nu / 2 + 0.25) * math.pi, xin.dtype)).astype(x.dtype)
    c, s = jnp.cos(w), jnp.sin(w)
    amp = jnp.sqrt(2 / (math.pi * x))
    return amp * (p * c - q * s), amp * (p * s + q * c)


def _jy(x, xin, which):
    """J0/J1/Y0/Y1 (which = 0..3) at |x| (the caller handles signs and x < 0)."""
    a = jnp.abs(x)
    ain = jnp.abs(xin)
    small = _jy_series(jnp.clip(a, 1e-300, _SMALL))[which]
    mid = _jy_miller(jnp.clip(a, _SMALL, _BIG))[which]
    nu, kind = which % 2, which // 2
    big = _jy_asymptotic(nu, jnp.maximum(a, _BIG), jnp.maximum(ain, jnp.asarray(_BIG, ain.dtype)))[kind]
    return jnp.where(a <= _SMALL, small, jnp.where(a <= _BIG, mid, big))


def _j0(x, xin):
    return jnp.where(x == 0, 1.0, _jy(x, xin, 0))


def _j1(x, xin):
    r = _jy(x, xin, 1)
    return jnp.where(x == 0, x, jnp.where(x < 0, -r, r))


def _y(which):
    def f(x, xin):
        r = _jy(x, xin, which)
        return jnp.where(x < 0, jnp.nan, jnp.where(x == 0, -jnp.inf, r))
    return f


# (a v5e's emulated float64 gave bessel_j0 nan on 17 of the float64 OpInfo row's 20 inputs: its
# Miller recurrence in the pair's float32 exponent range)
_in_float64("special_bessel_j0.default")(_unary(_j0, phase=True))
_in_float64("special_bessel_j1.default")(_unary(_j1, phase=True))
_in_float64("special_bessel_y0.default")(_unary(_y(2), phase=True))
_in_float64("special_bessel_y1.default")(_unary(_y(3), phase=True))


@_in_float64("special_spherical_bessel_j0.default")
def _spherical_j0(sig, x):
    dt = _out(sig)
    w = x.astype(dt).astype(_work(dt))
    small = _poly([1.0, -1 / 6, 1 / 120, -1 / 5040, 1 / 362880, -1 / 39916800], w * w)
    r = jnp.where(jnp.abs(w) < 0.5, small, jnp.sin(w) / jnp.where(w == 0, 1.0, w))
    return jnp.where(jnp.isinf(w), 0.0, r)


# ---------------------------------------------------------------------------------------
# Modified Bessel functions of the second kind, K0 and K1, and their scaled forms exp(x) K.
_TRAP_H = 0.125
_TRAP_N = 37  # nodes t = 0, h, ..., 4.5: exp(-x (cosh t - 1)) cosh t is below 1e-19 past it for x >= 2


def _k_series(x):
    """K0 and K1 at 0 < x <= 2 from their power series."""
    q = x * x / 4
    lg = jnp.log(x / 2)
    i0 = _poly([1 / math.factorial(k) ** 2 for k in range(_SERIES)], q)
    i1 = x / 2 * _poly([1 / (math.factorial(k) * math.factorial(k + 1)) for k in range(_SERIES)], q)
    k0 = -(lg + _EULER) * i0 + _poly([_harmonic(k) / math.factorial(k) ** 2 for k in range(_SERIES)], q)
    s1 = _poly([(2 * _harmonic(k) + 1 / (k + 1) - 2 * _EULER) / (math.factorial(k) * math.factorial(k + 1))
                for k in range(_SERIES)], q)
    k1 = 1 / x + lg * i1 - x / 4 * s1
    return k0, k1


def _k_scaled_trapezoid(nu, x):
    """exp(x) K_nu(x) at 2 <= x <= 25: the trapezoidal rule on
    int_0^inf exp(-x (cosh t - 1)) cosh(nu t) dt (exponentially convergent)."""
    t = [j * _TRAP_H for j in range(_TRAP_N)]
    c = jnp.asarray([2 * math.sinh(v / 2) ** 2 for v in t], x.dtype)  # cosh t - 1, without cancellation
    w = jnp.asarray([(0.5 if j == 0 else 1.0) * math.cosh(nu * v) * _TRAP_H for j, v in enumerate(t)], x.dtype)
    return jnp.matmul(jnp.exp(-x[..., None] * c), w, precision=precision.of("algorithm"))


def _k_scaled_asymptotic(nu, x):
    a = _HANKEL[nu]
    return jnp.sqrt(math.pi / (2 * x)) * _poly(a, 1 / x)


def _k(nu, scaled):
    def f(x):
        small = _k_series(jnp.clip(x, 1e-300, _SMALL))[nu]
        small = small * jnp.exp(x) if scaled else small
        mid = _k_scaled_trapezoid(nu, jnp.clip(x, _SMALL, _BIG))
        big = _k_scaled_asymptotic(nu, jnp.maximum(x, _BIG))
        r = jnp.where(x <= _BIG, mid, big)
        r = r if scaled else r * jnp.exp(-x)
        r = jnp.where(x <= _SMALL, small, r)
        r = jnp.where(x == 0, jnp.inf, r)
        r = jnp.where(jnp.isposinf(x), 0.0, r)
        return jnp.where(x < 0, jnp.nan, r)
    return f


_in_float64("special_modified_bessel_k0.default")(_unary(_k(0, False)))
_in_float64("special_modified_bessel_k1.default")(_unary(_k(1, False)))
_in_float64("special_scaled_modified_bessel_k0.default")(_unary(_k(0, True)))
_in_float64("special_scaled_modified_bessel_k1.default")(_unary(_k(1, True)))


# ---------------------------------------------------------------------------------------
# Airy's Ai: Taylor series of Ai'' = x Ai about the integers -12..8 (Ai and Ai' there to
# double precision), the asymptotic expansions outside.
_AIRY_TABLE = [  # (c, Ai(c), Ai'(c))
    (-12, -0.06655517505437313, 1.0231104533679707),
    (-11, -0.008759589255702381, -1.0273278736645794),
    (-10, 0.04024123848644319, 0.99626504413279),
    (-9, -0.022133721547341403, -0.9756639809263316),
    (-8, -0.0527050503563862, 0.9355609381983065),
    (-7, 0.18428083525050565, -0.7710081684101265),
    (-6, -0.3291451736298231, 0.3459354872813429),
    (-5, 0.35076100902411433, 0.32719281855444315),
    (-4, -0.07026553294928951, -0.7906285753685813),
    (-3, -0.37881429367765806, 0.3145837692165988),
    (-2, 0.22740742820168558, 0.618259020741691),
    (-1, 0.5355608832923521, -0.01016056711664521),
    (0, 0.3550280538878172, -0.2588194037928068),
    (1, 0.13529241631288141, -0.1591474412967932),
    (2, 0.03492413042327438, -0.05309038443365363),
    (3, 0.006591139357460719, -0.011912976705951319),
    (4, 0.0009515638512048018, -0.001958640950204179),
    (5, 0.00010834442813607442, -0.0002474138908684625),
    (6, 9.947694360252889e-06, -2.4765200397034955e-05),
    (7, 7.492128863997167e-07, -2.008150894738792e-06),
    (8, 4.6922076160992316e-08, -1.3414392979067865e-07),
]
_AIRY_LO, _AIRY_HI = -12.5, 8.5


def _airy_u(terms=24):
    """u_k = (2k+1)(2k+3)...(6k-1) / (216^k k!)."""
    u = [1.0]
    for k in range(1, terms):
        num = 1.0
        for j in range(2 * k + 1, 6 * k, 2):
            num *= j
        u.append(num / (216.0 ** k * math.factorial(k)))
    return u


_AIRY_U = _airy_u()


def _airy_taylor(x):
    c = jnp.clip(jnp.round(x), -12, 8)
    idx = (c + 12).astype(jnp.int32)
    a0 = jnp.asarray([r[1] for r in _AIRY_TABLE], x.dtype)[idx]
    a1 = jnp.asarray([r[2] for r in _AIRY_TABLE], x.dtype)[idx]
    h = x - c

    # y = sum a_n h^n with a_{n+2} = (c a_n + a_{n-1}) / ((n+2)(n+1))
    def step(n, st):
        prev, cur, nxt, acc, hp = st  # cur = a_{n-1}, nxt = a_n, hp = h^(n-1)
        hp = hp * h
        nf = n.astype(x.dtype)
        return cur, nxt, (c * cur + prev) / ((nf + 1) * nf), acc + nxt * hp, hp

    st = (jnp.zeros_like(x), a0, a1, a0, jnp.ones_like(x))
    return jax.lax.fori_loop(1, 32, step, st)[3]


@_in_float64("special_airy_ai.default")
def _airy_ai(sig, x):
    dt = _out(sig)
    xin = x.astype(dt)
    w = xin.astype(_work(dt))
    mid = _airy_taylor(jnp.clip(w, _AIRY_LO, _AIRY_HI))
    # x > 8.5: exp(-zeta) / (2 sqrt(pi) x^(1/4)) sum (-1)^k u_k zeta^-k
    xp = jnp.maximum(w, _AIRY_HI)
    zp = 2 / 3 * xp * jnp.sqrt(xp)
    pos = jnp.exp(-zp) / (2 * math.sqrt(math.pi) * jnp.sqrt(jnp.sqrt(xp))) * \
        _poly([(-1) ** k * u for k, u in enumerate(_AIRY_U)], 1 / zp)
    # x < -12.5: (sin(theta) P - cos(theta) Q) / (sqrt(pi) |x|^(1/4)), theta = zeta + pi/4 rounded
    # in the input dtype as PyTorch computes it
    xn = jnp.minimum(xin, jnp.asarray(_AIRY_LO, xin.dtype))
    tn = jnp.sqrt(-xn)
    zn_in = ((-2 * xn * tn).astype(jnp.float64) / 3).astype(xin.dtype)  # XLA would multiply by 1/3
    theta = (zn_in + jnp.asarray(math.pi / 4, xin.dtype)).astype(w.dtype)
    zn = zn_in.astype(w.dtype)
    zz = 1 / (zn * zn)
    p = _poly([(-1) ** m * _AIRY_U[2 * m] for m in range(len(_AIRY_U) // 2)], zz)
    q = _poly([(-1) ** m * _AIRY_U[2 * m + 1] for m in range(len(_AIRY_U) // 2)], zz) / zn
    neg = (jnp.sin(theta) * p - jnp.cos(theta) * q) / (math.sqrt(math.pi) * jnp.sqrt(tn.astype(w.dtype)))
    r = jnp.where(w > _AIRY_HI, pos, jnp.where(w < _AIRY_LO, neg, mid))
    return jnp.where(jnp.isposinf(w), jnp.nan, r)


# ---------------------------------------------------------------------------------------
# digamma, trigamma, polygamma, the Hurwitz zeta
def digamma(x):
    """PyTorch's digamma, computed in float64 and rounded to x's dtype: -inf at +0, +inf at
    -0, nan at the negative integers, and below 0 the reflection
    digamma(1 - x) - pi / tan(pi r), r the fractional part of x (the product pi r rounded as
    PyTorch's double arithmetic rounds it: near the poles this decides the value)."""
    w = x.astype(jnp.float64)
    neg = w < 0
    pos = jss.digamma(jnp.where(neg, 1 - w, w))
    r = w - jnp.trunc(w)
    t = jnp.tan(math.pi * r)
    out = jnp.where(neg, pos - math.pi / jnp.where(t == 0, jnp.ones_like(t), t), pos)
    out = jnp.where(neg & (r == 0), jnp.nan, out)
    # -1 / w is the zero's infinity (-inf at +0, +inf at -0); copysign reads the float64's sign
    # bit, which XLA's TPU compiler failed to compile in emulated float64 (a v5e: "shift-right-
    # arithmetic with different element types: s32 and u32")
    return jnp.where(w == 0, -1 / w, out).astype(x.dtype)


def _trigamma(x):
    """PyTorch's trigamma, in the dtype of x: the reflection pi^2 / sin^2(pi x) below 1/2,
    six steps of the recurrence, then the asymptotic series."""
    dt = x.dtype
    pi = jnp.asarray(math.pi, dt)
    refl = x < 0.5
    s = jnp.sin((pi * x).astype(jnp.float64)).astype(dt)
    r = jnp.where(refl, -(pi * pi) / (s * s), jnp.zeros_like(x))
    x = jnp.where(refl, 1 - x, x)
    for _ in range(6):
        r = r + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    r = r + (1 + 1 / (2 * x) + ixx * (1 / 6 - ixx * (1 / 30 - ixx * (1 / 42)))) / x
    return jnp.where(refl, -r, r)


def _bernoulli(n):
    """B_0..B_n as Fractions (B_1 = -1/2)."""
    b = []
    for m in range(n + 1):
        s = Fraction(0)
        for k in range(m):
            s += math.comb(m + 1, k) * b[k]
        b.append(-s / (m + 1) if m else Fraction(1))
    return b


_B = _bernoulli(24)
_ZETA_A = [float(math.factorial(2 * j) / _B[2 * j]) for j in range(1, 13)]  # (2j)! / B_2j
_MACHEP = 1.11022302462515654042e-16
_ZETA_MAX_STEPS = 1 << 20


def zeta(x, q):
    """The Hurwitz zeta sum_k (q + k)^-x in float64, by Euler-Maclaurin summation as PyTorch
    does it: terms summed until q + k > 9 (at least nine of them; done early once a term no
    longer changes the sum), then the integral, half the last term and up to twelve
    Bernoulli corrections. PyTorch's edge cases: inf at x == 1 and at non-positive integer
    q; nan for x < 1 and for negative q with non-integer x. A negative q takes -q terms;
    past 2^20 of them the result is nan (PyTorch keeps summing)."""
    x, q = jnp.broadcast_arrays(x, q)
    edge = (x == 1) | (x < 1) | ((q <= 0) & ((q == jnp.floor(q)) | (x != jnp.floor(x))))
    s = q ** -x
    zero = jnp.zeros_like(s)

    def cond(st):
        return jnp.any(~st[4]) & (st[0] < _ZETA_MAX_STEPS)

    def body(st):
        i, a, b, s, done, conv = st
        a2 = a + 1
        b2 = a2 ** -x
        s2 = s + b2
        c = (-_MACHEP * s2 < b2) & (b2 < _MACHEP * s2)
        stop = c | ((i + 1 >= 9) & ~(a2 <= 9))
        return (i + 1, jnp.where(done, a, a2), jnp.where(done, b, b2), jnp.where(done, s, s2),
                done | stop, conv | (c & ~done))

    _, a, b, s, done, conv = jax.lax.while_loop(cond, body, (jnp.asarray(0, widths.long_dtype()), q, zero, s, edge, edge))
    w = a
    t_s = s + b * w / (x - 1) - 0.5 * b
    fin = conv
    aa = jnp.ones_like(s)
    k = 0.0
    for j in range(12):
        aa = aa * (x + k)
        b = b / w
        t = aa * b / _ZETA_A[j]
        t_s = jnp.where(fin, t_s, t_s + t)
        fin = fin | (jnp.abs(t / t_s) < _MACHEP)
        aa = aa * (x + k + 1)
        b = b / w
        k += 2
    r = jnp.where(conv, s, t_s)
    r = jnp.where(done, r, jnp.nan)
    r = jnp.where((q <= 0) & (x != jnp.floor(x)), jnp.nan, r)
    r = jnp.where((q <= 0) & (q == jnp.floor(q)), jnp.inf, r)
    r = jnp.where(x < 1, jnp.nan, r)
    return jnp.where(x == 1, jnp.inf, r)


@_in_float64("special_zeta.default", "special_zeta.self_scalar", "special_zeta.other_scalar")
def _zeta(sig, x, q):
    dt = _out(sig)
    w = _work(dt)
    return zeta(jnp.asarray(x).astype(dt).astype(w), jnp.asarray(q).astype(dt).astype(w))


def _digamma_of(x, dt):
    """digamma for result dtype dt: half types in float32, as PyTorch's kernel does."""
    return digamma(x.astype(jnp.float32 if dt in _HALF else dt))


@_in_float64("digamma.default")
def _digamma(sig, x):
    dt = _out(sig)
    return _digamma_of(x.astype(dt), dt)


@_in_float64("polygamma.default", "special_polygamma.default")
def _polygamma(sig, n, x):
    dt = _out(sig)
    x = x.astype(dt)
    if n == 0:
        return _digamma_of(x, dt)
    if n == 1:
        return _trigamma(x.astype(jnp.float32 if dt in _HALF else dt))
    try:
        coef = (1.0 if n % 2 else -1.0) * math.exp(math.lgamma(n + 1.0))
    except OverflowError:
        coef = math.inf if n % 2 else -math.inf
    w = _work(dt)
    return coef * zeta(jnp.full_like(x, n + 1, dtype=w), x.astype(w))


# ---------------------------------------------------------------------------------------
# Regularised incomplete gamma functions P(a, x) (igamma) and Q(a, x) (igammac), with
# PyTorch's (SciPy's) boundary values. JAX's series and continued fraction serve, except near
# the diagonal for a > 20, where the series needs O(sqrt(a)) terms (and never ends once
# a + 1 == a): there Temme's uniform expansion
#   Q = erfc(eta sqrt(a/2)) / 2 + exp(-a eta^2/2) / sqrt(2 pi a) sum_k c_k(eta) a^-k,
#   eta^2 / 2 = mu - log(1 + mu), mu = x/a - 1,
# with c_0 = 1/mu - 1/eta, c_k = c_{k-1}'(eta) / eta + (-1)^k g_k / mu (g_k: Stirling's
# coefficients of Gamma), each c_k as its Taylor series in eta.
_TEMME_K, _TEMME_N = 12, 36


def _stirling(n):
    """g_0..g_n of Gamma(a) ~ sqrt(2 pi / a) (a/e)^a sum g_k a^-k, as Fractions: the exponential
    of Stirling's series sum_j B_2j / (2j (2j-1) a^(2j-1))."""
    b = _bernoulli(2 * n + 2)
    log = [Fraction(0)] * (n + 1)
    for j in range(1, n + 1):
        if 2 * j - 1 <= n:
            log[2 * j - 1] = b[2 * j] / (2 * j * (2 * j - 1))
    g = [Fraction(1)] + [Fraction(0)] * n
    for m in range(1, n + 1):  # g' = log' g
        g[m] = sum(k * log[k] * g[m - k] for k in range(1, m + 1)) / m
    return g


@functools.lru_cache(maxsize=None)
def _temme_coefficients():
    """Taylor coefficients (in eta) of c_0..c_{K-1}, as floats; exact arithmetic."""
    n = _TEMME_N
    # mu(eta) = sum m_i eta^i solves mu mu' = eta (1 + mu)
    m = [Fraction(0), Fraction(1)] + [Fraction(0)] * n
    for i in range(2, n + 2):
        m[i] = (m[i - 1] - sum(m[j] * (i + 1 - j) * m[i + 1 - j] for j in range(2, i))) / (i + 1)
    # inv = eta / mu
    inv = [Fraction(1)] + [Fraction(0)] * n
    for i in range(1, n + 1):
        inv[i] = -sum(m[k + 1] * inv[i - k] for k in range(1, i + 1))
    g = _stirling(_TEMME_K)
    cs = [inv[1:]]
    for k in range(1, _TEMME_K):
        c = cs[-1]
        t = [(i + 1) * c[i + 1] + (-1) ** k * g[k] * inv[i] for i in range(len(c) - 1)]
        cs.append(t[1:])  # t[0], the 1/eta term, is exactly 0
    return [[float(v) for v in c] for c in cs]


def _temme(a, x, upper):
    mu = (x - a) / a
    # mu - log(1 + mu) without cancellation (|mu| < 0.3 here)
    half_eta2 = mu * mu * _poly([(-1) ** j / (j + 2) for j in range(40)], mu)
    eta = jnp.sign(mu) * jnp.sqrt(2 * half_eta2)
    cs = _temme_coefficients()
    table = jnp.asarray([c + [0.0] * (_TEMME_N - len(c)) for c in cs], a.dtype)  # (K, N)
    powers = jnp.cumprod(jnp.concatenate([jnp.ones(eta.shape + (1,), a.dtype),
                                          jnp.broadcast_to(eta[..., None], eta.shape + (_TEMME_N - 1,))], -1), -1)
    ck = jnp.matmul(powers, table.T, precision=precision.of("algorithm"))  # c_k(eta), (..., K)
    inv_a = 1 / a
    s = jnp.zeros_like(a)
    for k in reversed(range(_TEMME_K)):
        s = s * inv_a + ck[..., k]
    r = jnp.exp(-a * half_eta2) / jnp.sqrt(2 * math.pi * a) * s
    z = eta * jnp.sqrt(a / 2)
    return jss.erfc(z) / 2 + r if upper else jss.erfc(-z) / 2 - r


def _igamma_edges(a, x, r, upper):
    one, zero = (0.0, 1.0) if upper else (1.0, 0.0)
    r = jnp.where(jnp.isinf(x), one, r)
    r = jnp.where(jnp.isinf(a), jnp.where(jnp.isinf(x), jnp.nan, zero), r)
    r = jnp.where(x == 0, zero, r)
    r = jnp.where(a == 0, jnp.where(x > 0, one, jnp.nan), r)
    return jnp.where((x < 0) | (a < 0), jnp.nan, r)


def _igamma_any(sig, a, x, upper):
    dt = _out(sig)
    a, x = (jnp.asarray(v).astype(dt).astype(_work(dt)) for v in (a, x))
    a, x = jnp.broadcast_arrays(a, x)
    near = (a > 20) & (jnp.abs(x - a) < 0.3 * a) & jnp.isfinite(a)
    # JAX's loops only see the arguments they finish on
    ja, jx = jnp.where(near, 1.0, a), jnp.where(near, 1.0, x)
    plain = jss.gammaincc(ja, jx) if upper else jss.gammainc(ja, jx)
    ta, tx = jnp.where(near, a, 100.0), jnp.where(near, x, 100.0)
    r = jnp.where(near, _temme(ta, tx, upper), plain)
    return _igamma_edges(a, x, r, upper)


@_in_float64("igamma.default", "special_gammainc.default")
def _igamma(sig, a, x):
    return _igamma_any(sig, a, x, False)


@_in_float64("igammac.default", "special_gammaincc.default")
def _igammac(sig, a, x):
    return _igamma_any(sig, a, x, True)


# ---------------------------------------------------------------------------------------
# Orthogonal polynomials P_n(x), computed in the result dtype as PyTorch does: n truncated
# to an integer (nan, inf and |n| >= 2^63 count as negative, as on PyTorch's CPUs), 0 for
# n < 0, closed forms at the ends of the interval, the trigonometric form for large n
# inside it (Chebyshev; evaluated in float64), and otherwise the three-term recurrence, run
# to the largest n (elements stop at their own n; the loop stops early once every running
# value is nan).
def _int_n(n, dt):
    n = jnp.asarray(n).astype(dt)
    ok = jnp.isfinite(n) & (jnp.abs(n) < 2.0 ** 63)
    return jnp.where(ok, jnp.trunc(jnp.where(ok, n, 0)).astype(jnp.int64), jnp.int64(jnp.iinfo(jnp.int64).min))


def _recurrence(x, n, p0, p1, step, run):
    """P_n from P_0 = p0, P_1 = p1 and P_k = step(k, P_{k-1}, P_{k-2}) for k = 2..n, on the
    elements where ``run``; P_0/P_1 where n is 0/1."""
    live = run & (n >= 2)
    stop = jnp.max(jnp.where(live, n, 1))

    def cond(st):
        k, p, q = st
        return (k <= stop) & jnp.any(live & (k <= n) & ~jnp.isnan(q))

    def body(st):
        k, p, q = st
        r = step(k.astype(x.dtype), q, p)
        on = live & (k <= n)
        return k + 1, jnp.where(on, q, p), jnp.where(on, r, q)

    _, _, q = jax.lax.while_loop(cond, body, (jnp.asarray(2, widths.long_dtype()), p0, p1))
    return jnp.where(n == 0, p0, jnp.where(n == 1, p1, q))


def _even(n):
    return n % 2 == 0


def _trig(f, x, n):
    """The trigonometric form f(theta = acos x, n) in float64 (in float32 the error of
    acos grows n-fold: PyTorch's float32 values there are only as good as its acosf),
    rounded to x's dtype."""
    w = jnp.float64 if x.dtype == jnp.float32 else x.dtype
    return f(jnp.arccos(x.astype(w)), n.astype(w)).astype(x.dtype)


def _chebyshev(x, n, p1, ends, trig, above):
    one = jnp.ones_like(x)
    use_trig = (n > above) & (jnp.abs(x) < 1)
    rec = _recurrence(x, n, one, p1, lambda k, q, p: (x + x) * q - p, ~use_trig)
    return jnp.where(jnp.abs(x) == 1, ends, jnp.where(use_trig, _trig(trig, x, n), rec))


def _cheb_t(x, n):
    ends = jnp.where((x > 0) | _even(n), 1.0, -1.0).astype(x.dtype)
    return _chebyshev(x, n, x, ends, lambda t, m: jnp.cos(m * t), 6)


def _cheb_u(x, n):
    nf = n.astype(x.dtype)
    ends = jnp.where((x > 0) | _even(n), nf + 1, -(nf + 1))

    def trig(t, m):
        st = jnp.sin(t)
        return jnp.where(st != 0, jnp.sin((m + 1) * t) / jnp.where(st != 0, st, 1), (m + 1) * jnp.cos((m + 1) * t))
    return _chebyshev(x, n, x + x, ends, trig, 8)


def _cheb_v(x, n):
    nf = n.astype(x.dtype)
    odd_end = jnp.where(_even(n), nf + nf + 1, -(nf + nf + 1))
    ends = jnp.where(x > 0, jnp.ones_like(x), odd_end)

    def trig(t, m):
        return jnp.where(jnp.sin(t / 2) != 1, jnp.cos((m + 0.5) * t) / jnp.cos(t / 2),
                         jnp.where(_even(n), m + m + 1, -(m + m + 1)))
    return _chebyshev(x, n, x + x - 1, ends, trig, 8)


def _cheb_w(x, n):
    nf = n.astype(x.dtype)
    ends = jnp.where(x > 0, nf + nf + 1, jnp.where(_even(n), 1.0, -1.0).astype(x.dtype))

    def trig(t, m):
        return jnp.where(jnp.cos(t / 2) != 1, jnp.sin((m + 0.5) * t) / jnp.sin(t / 2),
                         jnp.where(_even(n), 1.0, -1.0).astype(t.dtype))
    return _chebyshev(x, n, x + x + 1, ends, trig, 8)


def _hermite_h(x, n):
    one = jnp.ones_like(x)
    # H_m = 2x H_{m-1} - 2(m-1) H_{m-2}
    return _recurrence(x, n, one, x + x, lambda k, q, p: (x + x) * q - (k + k - 2) * p, jnp.ones(x.shape, bool))


def _hermite_he(x, n):
    one = jnp.ones_like(x)
    return _recurrence(x, n, one, x, lambda k, q, p: x * q - (k - 1) * p, jnp.ones(x.shape, bool))


def _laguerre_l(x, n):
    one = jnp.ones_like(x)
    rec = _recurrence(x, n, one, one - x, lambda k, q, p: (((k + k - 1) - x) * q - (k - 1) * p) / k,
                      jnp.ones(x.shape, bool))
    return jnp.where(x == 0, one, rec)


def _legendre_p(x, n):
    one = jnp.ones_like(x)
    ends = jnp.where((x > 0) | _even(n), one, -one)
    rec = _recurrence(x, n, one, x, lambda k, q, p: ((k + k - 1) * x * q - (k - 1) * p) / k,
                      jnp.ones(x.shape, bool))
    return jnp.where(jnp.abs(x) == 1, ends, rec)


def _shifted(f):
    def g(x, n):
        return f(x + x - 1, n)
    return g


def _polynomial(f):
    def lower(sig, x, n):
        dt = _out(sig)
        w = jnp.float32 if dt in _HALF else dt
        x = jnp.asarray(x).astype(dt).astype(w)
        n = _int_n(n, dt)
        x, n = jnp.broadcast_arrays(x, n)
        return jnp.where(n < 0, jnp.zeros_like(x), f(x, n))
    return lower


for _name, _f in {"chebyshev_polynomial_t": _cheb_t, "chebyshev_polynomial_u": _cheb_u,
                  "chebyshev_polynomial_v": _cheb_v, "chebyshev_polynomial_w": _cheb_w,
                  "shifted_chebyshev_polynomial_t": _shifted(_cheb_t),
                  "shifted_chebyshev_polynomial_u": _shifted(_cheb_u),
                  "shifted_chebyshev_polynomial_v": _shifted(_cheb_v),
                  "shifted_chebyshev_polynomial_w": _shifted(_cheb_w),
                  "hermite_polynomial_h": _hermite_h, "hermite_polynomial_he": _hermite_he,
                  "laguerre_polynomial_l": _laguerre_l, "legendre_polynomial_p": _legendre_p}.items():
    _in_float64(f"special_{_name}.default", f"special_{_name}.x_scalar", f"special_{_name}.n_scalar")(_polynomial(_f))
