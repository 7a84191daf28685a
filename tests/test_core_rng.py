"""Random numbers on the lazy device (R8 in docs/design.md).

The seed is a device-data parameter: a new seed never recompiles; the same seed and the same
program give the same numbers; each sync advances the seed.
"""
from __future__ import annotations

import gc
import itertools
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import lazyxla
from lazyhelp import cnt, in_a_child
import lazyxla.debug.metrics as met

DEV = lazyxla.device()

pytestmark = pytest.mark.usefixtures("nothing_pending")
_sizes = itertools.count(4101)


def fresh() -> int:
    return next(_sizes)


def draw(n, seed):
    """Set the seed, record one randn of length n, sync, return the values."""
    lazyxla.manual_seed(seed)
    r = torch.randn(n, device=DEV)
    lazyxla.sync()
    return r.cpu()


# ---------------------------------------------------------------------------------------
def test_same_seed_same_numbers_within_a_process():
    n = fresh()
    a = draw(n, 1234)
    b = draw(n, 1234)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_different_seed_different_numbers_without_recompiling():
    n = fresh()
    a = draw(n, 1234)
    u, c = cnt("UncachedCompile"), cnt("CachedCompile")
    b = draw(n, 4321)
    assert cnt("UncachedCompile") - u == 0
    assert cnt("CachedCompile") - c >= 1
    assert not torch.equal(a, b)
    # and back to the first seed: first numbers again, still no compile
    c2 = draw(n, 1234)
    assert cnt("UncachedCompile") - u == 0
    torch.testing.assert_close(a, c2, rtol=0, atol=0)


def test_successive_syncs_give_different_numbers():
    n = fresh()
    lazyxla.manual_seed(77)
    r1 = torch.randn(n, device=DEV)
    lazyxla.sync()
    r2 = torch.randn(n, device=DEV)
    lazyxla.sync()
    r3 = torch.randn(n, device=DEV)
    lazyxla.sync()
    v1, v2, v3 = r1.cpu(), r2.cpu(), r3.cpu()
    assert not torch.equal(v1, v2)
    assert not torch.equal(v2, v3)
    assert not torch.equal(v1, v3)
    # The sequence is a function of the seed: replaying it gives the same three draws.
    lazyxla.manual_seed(77)
    s = []
    for _ in range(3):
        r = torch.randn(n, device=DEV)
        lazyxla.sync()
        s.append(r.cpu())
    for got, want in zip(s, (v1, v2, v3)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_two_random_ops_in_one_step_differ():
    n = fresh()
    lazyxla.manual_seed(5)
    a = torch.randn(n, device=DEV)
    b = torch.randn(n, device=DEV)
    lazyxla.sync()
    assert not torch.equal(a.cpu(), b.cpu())


def test_read_of_pending_random_tensor_matches_its_synced_value():
    # A value read does not advance the seed; the later sync computes the same numbers.
    n = fresh()
    lazyxla.manual_seed(9)
    r = torch.rand(n, device=DEV)
    first = r.cpu()
    second = r.cpu()
    lazyxla.sync()
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    torch.testing.assert_close(r.cpu(), first, rtol=0, atol=0)


def test_distributions():
    lazyxla.manual_seed(2024)
    n = 20000
    rn = torch.randn(n, device=DEV)
    ru = torch.rand(n, device=DEV)
    ri = torch.randint(3, 11, (n,), device=DEV)
    lazyxla.sync()
    rn, ru, ri = rn.cpu(), ru.cpu(), ri.cpu()
    assert rn.dtype == torch.float32 and ru.dtype == torch.float32
    assert ri.dtype == torch.int64
    assert abs(rn.mean().item()) < 0.05
    assert abs(rn.std().item() - 1.0) < 0.05
    assert ru.min().item() >= 0.0 and ru.max().item() < 1.0
    assert abs(ru.mean().item() - 0.5) < 0.02
    assert ri.min().item() == 3 and ri.max().item() == 10
    counts = torch.bincount(ri - 3, minlength=8).float()
    assert (counts / n - 1 / 8).abs().max().item() < 0.02


def test_dropout_train_mode_reproducible_and_eval_identity():
    n = fresh()
    drop = torch.nn.Dropout(p=0.5)
    x = torch.ones(n, 8).to(DEV)

    def run(seed):
        lazyxla.manual_seed(seed)
        y = drop(x)
        lazyxla.sync()
        return y.cpu()

    drop.train()
    a, b, c = run(11), run(11), run(12)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)
    # Inverted dropout: kept values are scaled by 1 / (1 - p), dropped ones are 0.
    assert set(torch.unique(a).tolist()) <= {0.0, 2.0}
    kept = (a == 2.0).float().mean().item()
    assert 0.4 < kept < 0.6
    drop.eval()
    torch.testing.assert_close(drop(x).cpu(), torch.ones(n, 8), rtol=0, atol=0)


_RNG_SCRIPT = textwrap.dedent("""
    import json, torch, lazyxla
    dev = lazyxla.device()
    lazyxla.manual_seed(31337)
    a = torch.randn(6, device=dev)
    lazyxla.sync()
    b = torch.rand(4, device=dev)
    lazyxla.sync()
    print(json.dumps([a.cpu().tolist(), b.cpu().tolist()]))
""")


@pytest.mark.cpu_only("compares this process's numbers with a second process's, which runs on XLA:CPU "
                      "while this one holds the TPU")
def test_same_seed_same_numbers_across_processes():
    procs = [subprocess.Popen([sys.executable, "-c", _RNG_SCRIPT], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONHASHSEED=str(i))) for i in (1, 2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert outs[0] == outs[1]
    # The same program in this process gives the same numbers too.
    lazyxla.manual_seed(31337)
    a = torch.randn(6, device=DEV)
    lazyxla.sync()
    b = torch.rand(4, device=DEV)
    lazyxla.sync()
    assert [a.cpu().tolist(), b.cpu().tolist()] == outs[0]


@in_a_child("a fresh process's seed")
def test_default_seed_is_101():
    # A fresh process uses seed 101: its first draw equals a draw after manual_seed(101).
    script = textwrap.dedent("""
        import json, torch, lazyxla
        dev = lazyxla.device()
        r = torch.randn(5, device=dev)
        lazyxla.sync()
        first = r.cpu().tolist()
        lazyxla.manual_seed(101)
        r = torch.randn(5, device=dev)
        lazyxla.sync()
        print(json.dumps([first, r.cpu().tolist()]))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    first, again = json.loads(out.stdout.strip().splitlines()[-1])
    assert first == again


def test_each_random_op_draws_from_the_next_seed_of_the_chain():
    """R8: the k-th random op of a step takes seed_k = 2531011 + 214013 * seed_(k-1) (wrapping at
    the width the device holds int64 in: 64 bits, or 32 on a TPU, ``xla.widths``) from the step's
    seed: its numbers are JAX's for that seed (the key takes its bits as an unsigned value of that
    width)."""
    import jax
    import jax.numpy as jnp
    from lazyxla.xla.client import PRNG_IMPL
    from lazyxla.xla.widths import long_bits

    n = fresh()
    lazyxla.manual_seed(77)
    got = [torch.rand(n, device=DEV) for _ in range(3)]
    lazyxla.sync()
    s, bits = 77, long_bits()
    for g in got:
        s = (2531011 + 214013 * s) % (1 << bits)
        seed = jnp.uint64(s) if bits == 64 else jnp.uint32(s)  # the device's int64's bits, held in ``bits``
        want = jax.random.uniform(jax.random.key(seed, impl=PRNG_IMPL), (n,), jnp.float32)
        assert torch.equal(g.cpu(), torch.from_numpy(jax.device_get(want).copy()))


def test_random_ops_alike_compile_to_the_same_kernels_whatever_their_number():
    """The k-th seed is a buffer of its own, not the chain's first k steps copied into the k-th
    random op's kernel: 8 dropouts compile as many distinct kernels as 2."""
    from lazyhelp import distinct_kernels, last_program_text

    got = {}
    for k in (2, 8):
        x = torch.ones(64, 96, device=DEV)
        for _ in range(k):
            x = torch.nn.functional.dropout(x, 0.25) + 1
        lazyxla.sync()
        got[k] = distinct_kernels(last_program_text())
    assert got[8] == got[2], got


RNG_IMPL = """
import json, torch, lazyxla
lazyxla.manual_seed(5)
y = torch.rand(64, device=lazyxla.device())
key = lazyxla.graph_hash([y])
print(json.dumps({"values": y.cpu().tolist(), "key": key}))
"""


@in_a_child("the generator in the key")
def test_the_bit_generator_is_part_of_every_key():
    """``LAZYXLA_PRNG_IMPL`` changes the numbers a seed gives, so it is in the compile
    environment: a program stored under one generator is never loaded under the other."""
    import os
    from lazyhelp import json_here_and_in_a_process, json_runs
    if os.environ.get("LAZYXLA_PRNG_IMPL", "rbg") == "rbg":  # the default: this process is one side
        rbg, again = json_here_and_in_a_process(RNG_IMPL)
    else:
        rbg, again = json_runs(RNG_IMPL, times=2, LAZYXLA_PRNG_IMPL="rbg")
    threefry, = json_runs(RNG_IMPL, LAZYXLA_PRNG_IMPL="threefry2x32")
    assert rbg == again
    assert rbg["key"] != threefry["key"] and rbg["values"] != threefry["values"]
    assert all(0 <= v < 1 for v in rbg["values"] + threefry["values"])
