"""R7: the persistent compilation cache (lazyxla.compiler.persistent_cache), driven directly with small
JAX programs and fixed keys; several tests run real subprocesses (second process loads, a writer
killed mid-write, concurrent writers, the ``lazyxla cache`` command line)."""
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

import lazyxla  # noqa: F401  (64-bit JAX, like every lazyxla process)
import jax
import jax.numpy as jnp
import numpy as np

from lazyxla import files, metrics
import lazyxla.compiler.persistent_cache as pc
from lazyxla.compiler.persistent_cache import store

SPECS = [jax.ShapeDtypeStruct((8,), jnp.float32), jax.ShapeDtypeStruct((8,), jnp.float32)]
KEY = bytes.fromhex("0123456789abcdef0123456789abcdef")
KEY2 = bytes.fromhex("fedcba9876543210fedcba9876543210")
NAMES = ("PersistentCacheMiss", "PersistentCacheHit", "PersistentCacheDeserializeFailure")


def prog(a, b):
    return (a * b + 1.0, jnp.sum(a) - b)


def compile_prog(donate=(0,), f=prog, specs=SPECS):
    return jax.jit(f, donate_argnums=donate).lower(*specs).compile()


def inputs():
    return jnp.arange(8, dtype=jnp.float32), jnp.full((8,), 2.0, jnp.float32)


def counters():
    return {n: metrics.COUNTERS.get(n, 0) for n in NAMES}


def delta(before):
    now = counters()
    return {n: now[n] - before[n] for n in NAMES}


def listing(d):
    """name -> (size, mtime_ns, bytes) of every file in d."""
    out = {}
    for n in sorted(os.listdir(d)):
        p = os.path.join(d, n)
        st = os.stat(p)
        with open(p, "rb") as f:
            out[n] = (st.st_size, st.st_mtime_ns, f.read())
    return out


@pytest.fixture(autouse=True)
def key_file(tmp_path, monkeypatch):
    """Every test uses its own HMAC key file, never the user's."""
    path = tmp_path / "hmac_key"
    monkeypatch.setenv("LAZYXLA_CACHE_HMAC_KEY_FILE", str(path))
    for name in ("XLA_PERSISTENT_CACHE_PATH", "XLA_PERSISTENT_CACHE_READ_ONLY", "LAZYXLA_PERSISTENT_CACHE_MAX_BYTES"):
        # set then delete: monkeypatch then restores the variable even if code sets it
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    pc._reset_for_tests()
    yield path
    pc._reset_for_tests()


@pytest.fixture
def cdir(tmp_path):
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    return str(d)


def child_env(key_path):
    env = dict(os.environ)
    env["LAZYXLA_CACHE_HMAC_KEY_FILE"] = str(key_path)
    env.pop("XLA_PERSISTENT_CACHE_PATH", None)
    return env


CHILD = textwrap.dedent('''
    import json, os, sys, time
    import lazyxla
    import jax, jax.numpy as jnp
    import lazyxla.compiler.persistent_cache as pc
    from lazyxla.compiler.persistent_cache import store
    from lazyxla import metrics

    mode, path = sys.argv[1], sys.argv[2]
    KEY = bytes.fromhex("0123456789abcdef0123456789abcdef")
    SPECS = [jax.ShapeDtypeStruct((8,), jnp.float32), jax.ShapeDtypeStruct((8,), jnp.float32)]

    def prog(a, b):
        return (a * b + 1.0, jnp.sum(a) - b)

    def compile_prog():
        return jax.jit(prog, donate_argnums=(0,)).lower(*SPECS).compile()

    def report(fn, compiled, cache):
        a, b = jnp.arange(8, dtype=jnp.float32), jnp.full((8,), 2.0, jnp.float32)
        out = fn(a, b)
        print(json.dumps({"compiled": compiled, "donated": a.is_deleted(),
                          "out": [o.tolist() for o in out], "path": cache.last_call_path,
                          "counters": {k: v for k, v in metrics.COUNTERS.items()
                                       if k.startswith("PersistentCache")}}), flush=True)

    def wait_for(p):
        t = time.time()
        while not os.path.exists(p):
            if time.time() - t > 120:
                sys.exit("timed out waiting for " + p)
            time.sleep(0.01)

    cache = pc.PersistentCache(path)
    if mode == "run":            # what the executor will do: load, else compile and store
        fn = cache.load(KEY, SPECS, 2)
        compiled = fn is None
        if compiled:
            fn = compile_prog()
            cache.store(KEY, fn, {"name": "child"})
        report(fn, compiled, cache)
    elif mode == "slow":         # a writer that takes long enough to be killed mid-file
        c = compile_prog()
        store._CHUNK_BYTES, store._chunk_pause = 256, 0.2
        print("writing", flush=True)
        cache.store(KEY, c, {})
        print("finished", flush=True)
    elif mode == "race":         # compile, then store at the same moment as the others
        me, n, sync = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        c = compile_prog()
        open(os.path.join(sync, "ready%d" % me), "w").close()
        wait_for(os.path.join(sync, "go"))
        for _ in range(3):
            cache.store(KEY, c, {"writer": me})
        open(os.path.join(sync, "done%d" % me), "w").close()
        for i in range(n):
            wait_for(os.path.join(sync, "done%d" % i))
        fn = cache.load(KEY, SPECS, 2)
        report(fn if fn is not None else c, fn is None, cache)
''')


@pytest.fixture
def child(tmp_path, key_file):
    script = tmp_path / "child.py"
    script.write_text(CHILD)

    def start(*args):
        return subprocess.Popen([sys.executable, str(script), *map(str, args)], cwd=str(tmp_path),
                                env=child_env(key_file), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def run(*args):
        p = start(*args)
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])

    start.run = run
    return start


EXPECTED = [[1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 15.0], [26.0] * 8]


# ---------------------------------------------------------------------------------------
# (1) store then load in one process
@pytest.mark.parametrize("call_path", ["compiled", "raw"])
def test_store_then_load_same_results_and_donation(cdir, monkeypatch, call_path):
    monkeypatch.setattr(store, "CALL_PATH", call_path)
    cache = pc.PersistentCache(cdir)
    c = compile_prog()
    before = counters()
    assert cache.load(KEY, SPECS, 2) is None
    assert delta(before) == {"PersistentCacheMiss": 1, "PersistentCacheHit": 0,
                             "PersistentCacheDeserializeFailure": 0}
    cache.store(KEY, c, {"name": "unit"})
    assert os.listdir(cdir) == [KEY.hex()]

    fn = cache.load(KEY, SPECS, 2)
    assert fn is not None and cache.last_call_path == call_path
    assert delta(before)["PersistentCacheHit"] == 1
    a, b = inputs()
    want = c(a, b)
    assert a.is_deleted()  # the original donates argument 0
    a, b = inputs()
    got = fn(a, b)
    assert isinstance(got, tuple) and len(got) == 2
    for w, g in zip(want, got):
        assert isinstance(g, jax.Array)
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert a.is_deleted(), "donation compiled into the executable must still consume the input"
    assert not b.is_deleted()
    assert [o.tolist() for o in got] == EXPECTED
    # same results again (JAX's fast path after the first call), and wrong arguments are
    # refused rather than misread
    for _ in range(3):
        a, b = inputs()
        assert [o.tolist() for o in fn(a, b)] == EXPECTED
        assert a.is_deleted()
    with pytest.raises(TypeError):
        fn(jnp.arange(8, dtype=jnp.int32), b)
    with pytest.raises(TypeError):
        fn(b)
    ent = cache.entries()
    assert [e["key"] for e in ent] == [KEY.hex()] and ent[0]["hits"] == 1 and ent[0]["ok"]
    assert ent[0]["name"] == "unit" and ent[0]["size"] == os.path.getsize(os.path.join(cdir, KEY.hex()))
    st = cache.stats()
    assert (st["entries"], st["hits"], st["misses"], st["stores"]) == (1, 1, 1, 1)


def test_unused_arguments_and_as_text(cdir):
    """jit drops unused arguments; the loaded program still takes all of them."""
    specs = SPECS + [jax.ShapeDtypeStruct((3,), jnp.int64)]
    c = jax.jit(lambda a, b, unused: (a + b,)).lower(*specs).compile()
    cache = pc.PersistentCache(cdir)
    cache.store(KEY, c, {})
    fn = cache.load(KEY, specs, 1)
    a, b = inputs()
    (out,) = fn(a, b, jnp.zeros(3, jnp.int64))
    assert out.tolist() == (np.arange(8) + 2.0).tolist()
    assert "HloModule" in fn.as_text()


def test_loaded_call_overhead_is_comparable(cdir):
    c = compile_prog(donate=())
    cache = pc.PersistentCache(cdir)
    cache.store(KEY, c, {})
    fn = cache.load(KEY, SPECS, 2)
    a, b = inputs()

    def per_call(f, n=2000):
        jax.block_until_ready(f(a, b))
        t = time.perf_counter()
        for _ in range(n):
            f(a, b)
        jax.block_until_ready(f(a, b))
        return (time.perf_counter() - t) / n

    orig = min(per_call(c) for _ in range(3))
    loaded = min(per_call(fn) for _ in range(3))
    assert loaded < 2 * orig + 10e-6, f"loaded {loaded * 1e6:.1f} us vs original {orig * 1e6:.1f} us"


# ---------------------------------------------------------------------------------------
# (2) two processes: the first compiles, the second loads
def test_second_process_loads_instead_of_compiling(cdir, child):
    first = child.run("run", cdir)
    assert first["compiled"] is True
    assert first["counters"] == {"PersistentCacheMiss": 1}
    assert first["out"] == EXPECTED and first["donated"]
    assert os.listdir(cdir) == [KEY.hex()]

    second = child.run("run", cdir)
    assert second["compiled"] is False
    assert second["counters"] == {"PersistentCacheHit": 1}, second["counters"]
    assert second["out"] == EXPECTED
    assert second["donated"], "input/output aliasing must survive the round trip"
    assert second["path"] == "compiled"


# ---------------------------------------------------------------------------------------
# (3) corruption
def _flip(data, at):
    b = bytearray(data)
    b[at] ^= 0x10
    return bytes(b)


def _foreign_mac(data, meta_change=None):
    """Re-sign the entry under another key (a writer without our secret): the checksum is
    right, only the MAC is wrong."""
    meta, payload = pc.decode_entry(data, None)
    if meta_change:
        meta.update(meta_change)
    return pc.encode_entry(meta, bytes(payload), b"not the secret of this user, 32+ bytes long")


CORRUPTIONS = {
    "empty": lambda d: b"",
    "truncated": lambda d: d[: len(d) // 2],
    "truncated_by_one": lambda d: d[:-1],
    "extended": lambda d: d + b"\0",
    "garbage": lambda d: os.urandom(len(d)),
    "header_bit": lambda d: _flip(d, 3),
    "metadata_bit": lambda d: _flip(d, pc.HEADER.size + 5),
    "payload_bit": lambda d: _flip(d, len(d) - 2 * pc.DIGEST - 100),
    "checksum_bit": lambda d: _flip(d, len(d) - pc.DIGEST - 1),
    "mac_bit": lambda d: _flip(d, len(d) - 1),
    "wrong_mac": _foreign_mac,
    "wrong_mac_forged_meta": lambda d: _foreign_mac(d, {"n_outputs": 2, "name": "evil"}),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corrupt_entry_is_counted_not_loaded_and_replaced(cdir, kind):
    cache = pc.PersistentCache(cdir)
    c = compile_prog()
    cache.store(KEY, c, {})
    path = os.path.join(cdir, KEY.hex())
    good = open(path, "rb").read()
    bad = CORRUPTIONS[kind](good)
    assert bad != good
    with open(path, "wb") as f:
        f.write(bad)

    before = counters()
    assert cache.load(KEY, SPECS, 2) is None
    assert delta(before) == {"PersistentCacheMiss": 0, "PersistentCacheHit": 0,
                             "PersistentCacheDeserializeFailure": 1}
    assert not os.path.exists(path), "a bad entry is deleted when the cache is writable"
    assert cache.last_failure

    # the caller recompiles and stores again; the next load is a hit with the right numbers
    cache.store(KEY, c, {})
    fn = cache.load(KEY, SPECS, 2)
    assert fn is not None and delta(before)["PersistentCacheHit"] == 1
    assert [o.tolist() for o in fn(*inputs())] == EXPECTED


@pytest.mark.parametrize("what", ["other_key", "arg_specs", "n_outputs", "version"])
def test_entry_whose_metadata_does_not_match_is_rejected(cdir, key_file, what):
    cache = pc.PersistentCache(cdir)
    cache.store(KEY, compile_prog(), {})
    src = os.path.join(cdir, KEY.hex())
    key, specs, n = KEY, SPECS, 2
    if what == "other_key":          # a valid entry under another key's name
        os.rename(src, os.path.join(cdir, KEY2.hex()))
        key = KEY2
    elif what == "arg_specs":
        specs = [jax.ShapeDtypeStruct((8,), jnp.float64)] * 2
    elif what == "n_outputs":
        n = 3
    else:                            # correctly signed by us, but built by another jaxlib
        meta, payload = pc.decode_entry(open(src, "rb").read(), None)
        meta["jaxlib"] = "0.0.1"
        with open(src, "wb") as f:
            f.write(pc.encode_entry(meta, bytes(payload), cache.mac_key))
    before = counters()
    assert cache.load(key, specs, n) is None
    assert delta(before)["PersistentCacheDeserializeFailure"] == 1
    assert delta(before)["PersistentCacheHit"] == 0
    assert os.listdir(cdir) == []


def test_entries_from_another_users_key_never_load_but_a_shared_key_does(tmp_path, cdir, monkeypatch):
    a = pc.PersistentCache(cdir)
    a.store(KEY, compile_prog(), {})
    monkeypatch.setenv("LAZYXLA_CACHE_HMAC_KEY_FILE", str(tmp_path / "other_user_key"))
    b = pc.PersistentCache(cdir, readonly=True)
    before = counters()
    assert b.load(KEY, SPECS, 2) is None
    assert delta(before)["PersistentCacheDeserializeFailure"] == 1
    assert "HMAC" in b.last_failure
    # a team sharing one key file (copied, mode 0600) loads each other's entries
    shared = tmp_path / "team_key"
    shared.write_bytes(open(tmp_path / "hmac_key", "rb").read())
    shared.chmod(0o600)
    monkeypatch.setenv("LAZYXLA_CACHE_HMAC_KEY_FILE", str(shared))
    c = pc.PersistentCache(cdir, readonly=True)
    assert c.load(KEY, SPECS, 2) is not None


def test_key_file_is_created_private(key_file, cdir):
    assert not key_file.exists()
    pc.PersistentCache(cdir).store(KEY, compile_prog(), {})
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert len(key_file.read_bytes().strip()) >= 32


def test_default_key_file_lives_under_xdg_cache_home(tmp_path, cdir, monkeypatch):
    monkeypatch.delenv("LAZYXLA_CACHE_HMAC_KEY_FILE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path, shared = pc.key_file_path()
    assert path == str(tmp_path / "xdg" / "lazyxla" / "cache_key") and not shared
    pc.PersistentCache(cdir).mac_key
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


# ---------------------------------------------------------------------------------------
# (4) read-only
def test_read_only_never_writes_or_deletes(cdir):
    w = pc.PersistentCache(cdir)
    w.store(KEY, compile_prog(), {})
    w.store(KEY2, compile_prog(donate=()), {})
    with open(os.path.join(cdir, KEY2.hex()), "r+b") as f:   # corrupt one entry
        f.seek(40)
        f.write(b"\xff\xff")
    old = os.stat(os.path.join(cdir, KEY.hex())).st_mtime_ns - 10**9
    os.utime(os.path.join(cdir, KEY.hex()), ns=(old, old))
    snapshot = listing(cdir)
    dir_mtime = os.stat(cdir).st_mtime_ns

    ro = pc.PersistentCache(cdir, readonly=True)
    before = counters()
    fn = ro.load(KEY, SPECS, 2)                                   # hit: no "last used" touch
    assert fn is not None and [o.tolist() for o in fn(*inputs())] == EXPECTED
    assert ro.load(KEY2, SPECS, 2) is None                        # bad entry: counted, kept
    assert ro.load(b"\x77" * 16, SPECS, 2) is None                # miss
    ro.store(b"\x77" * 16, compile_prog(), {})                    # store: ignored
    with pytest.raises(pc.PersistentCacheError):
        ro.clear()
    assert delta(before) == {"PersistentCacheMiss": 1, "PersistentCacheHit": 1,
                             "PersistentCacheDeserializeFailure": 1}
    assert listing(cdir) == snapshot
    assert os.stat(cdir).st_mtime_ns == dir_mtime


def test_read_only_from_environment_and_missing_directory(tmp_path, cdir, monkeypatch):
    pc.PersistentCache(cdir).store(KEY, compile_prog(), {})
    monkeypatch.setenv("XLA_PERSISTENT_CACHE_PATH", cdir)
    monkeypatch.setenv("XLA_PERSISTENT_CACHE_READ_ONLY", "1")
    cache = pc.get_cache()
    assert cache is not None and cache.readonly and cache.path == cdir
    snapshot = listing(cdir)
    cache.store(KEY2, compile_prog(), {})
    assert listing(cdir) == snapshot
    missing = tmp_path / "nothing_here"
    with pytest.raises(pc.PersistentCacheError):
        pc.PersistentCache(missing, readonly=True)
    assert not missing.exists(), "read-only must not create the directory"


# ---------------------------------------------------------------------------------------
# (5) a writer killed mid-write
def test_writer_killed_mid_write_leaves_nothing_that_loads(cdir, child):
    p = child("slow", cdir)
    assert p.stdout.readline().strip() == "writing"
    deadline = time.time() + 60
    partial = None
    while time.time() < deadline and partial is None:
        for n in os.listdir(cdir):          # whatever the writer is writing, once it is big enough
            if os.path.getsize(os.path.join(cdir, n)) > 1000:
                partial = n
        time.sleep(0.01)
    assert partial is not None, "the writer never started writing"
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL
    assert os.listdir(cdir) == [partial] and partial.endswith(".tmp"), \
        "only the dead writer's temp file is left, never an entry"
    temp = partial

    cache = pc.PersistentCache(cdir)
    before = counters()
    assert cache.load(KEY, SPECS, 2) is None
    assert delta(before)["PersistentCacheMiss"] == 1 and delta(before)["PersistentCacheHit"] == 0
    assert cache.entries() == [] and cache.stats()["temp_files"] == 1
    # a later store works, and sweeps temp files older than STALE_TEMP_SECONDS
    old = time.time() - pc.STALE_TEMP_SECONDS - 60
    os.utime(os.path.join(cdir, temp), (old, old))
    cache.store(KEY, compile_prog(), {})
    assert os.listdir(cdir) == [KEY.hex()]
    assert [o.tolist() for o in cache.load(KEY, SPECS, 2)(*inputs())] == EXPECTED


def test_failed_write_leaves_no_temp_file(cdir, monkeypatch):
    cache = pc.PersistentCache(cdir)

    def boom(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(files.os, "fsync", boom)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        cache.store(KEY, compile_prog(), {})
        cache.store(KEY2, compile_prog(), {})
    assert len([x for x in w if "persistent cache" in str(x.message)]) == 1
    assert os.listdir(cdir) == []
    assert cache.stats()["store_errors"] == 2


# ---------------------------------------------------------------------------------------
# (6) concurrent writers of one key
def test_concurrent_writers_leave_one_good_entry(tmp_path, cdir, child):
    n = 3
    sync = tmp_path / "sync"
    sync.mkdir()
    procs = [child("race", cdir, i, n, sync) for i in range(n)]
    deadline = time.time() + 150
    while len([x for x in os.listdir(sync) if x.startswith("ready")]) < n:
        assert time.time() < deadline and all(p.poll() is None for p in procs), \
            [p.communicate()[1] for p in procs if p.poll() is not None]
        time.sleep(0.02)
    (sync / "go").touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=150)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert os.listdir(cdir) == [KEY.hex()], "one entry, no temp files"
    for r in results:
        assert r["compiled"] is False
        assert r["counters"] == {"PersistentCacheHit": 1}
        assert r["out"] == EXPECTED
    fn = pc.PersistentCache(cdir).load(KEY, SPECS, 2)
    assert [o.tolist() for o in fn(*inputs())] == EXPECTED


# ---------------------------------------------------------------------------------------
# (7) unusable paths, permissions and the process-wide cache
@pytest.mark.parametrize("how", ["file", "under_a_file"])
def test_bad_path_warns_once_and_disables(tmp_path, monkeypatch, how):
    f = tmp_path / "a_file"
    f.write_text("not a directory")
    path = f if how == "file" else f / "cache"
    monkeypatch.setenv("XLA_PERSISTENT_CACHE_PATH", str(path))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert pc.get_cache() is None
        assert pc.get_cache() is None
        assert pc.get_cache() is None
    msgs = [str(x.message) for x in w]
    assert len(msgs) == 1 and "persistent compilation cache disabled" in msgs[0], msgs
    assert f.read_text() == "not a directory"


def test_unset_or_empty_path_is_off(monkeypatch):
    monkeypatch.setenv("XLA_PERSISTENT_CACHE_PATH", "")
    assert pc.get_cache() is None


def test_get_cache_reads_the_environment_once(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_PERSISTENT_CACHE_PATH", str(tmp_path / "made"))
    monkeypatch.setenv("LAZYXLA_PERSISTENT_CACHE_MAX_BYTES", "64k")
    cache = pc.get_cache()
    assert cache is not None and not cache.readonly and cache.max_bytes == 65536
    assert (tmp_path / "made").is_dir()
    monkeypatch.setenv("XLA_PERSISTENT_CACHE_PATH", "")
    assert pc.get_cache() is cache


def test_initialize_cache_sets_the_settings_and_refuses_after_init(tmp_path, monkeypatch):
    pc.initialize_cache(str(tmp_path / "ic"), readonly=False)
    assert os.environ["XLA_PERSISTENT_CACHE_PATH"] == str(tmp_path / "ic")
    assert os.environ["XLA_PERSISTENT_CACHE_READ_ONLY"] == "0"
    cache = pc.get_cache()
    assert cache is not None and cache.path == str(tmp_path / "ic")
    with pytest.raises(RuntimeError, match="already initialized"):
        pc.initialize_cache(str(tmp_path / "other"), readonly=True)
    assert pc.get_cache() is cache


@pytest.mark.parametrize("mode,warns", [(0o700, False), (0o777, True), (0o770, True),
                                        (0o1777, False)])
def test_directory_writable_by_others_warns(tmp_path, mode, warns):
    d = tmp_path / "perm"
    d.mkdir()
    d.chmod(mode)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        pc.PersistentCache(d)
    got = [str(x.message) for x in w if "writable by other users" in str(x.message)]
    assert bool(got) == warns, got


# ---------------------------------------------------------------------------------------
# (8) size bound
def test_size_bound_evicts_least_recently_used(cdir):
    plain = pc.PersistentCache(cdir)
    keys = [bytes([i]) * 16 for i in (1, 2, 3, 4)]
    c = compile_prog(donate=())
    for k in keys[:3]:
        plain.store(k, c, {})
    sizes = {k: os.path.getsize(os.path.join(cdir, k.hex())) for k in keys[:3]}
    now = time.time()
    for age, k in zip((300, 200, 100), keys[:3]):           # keys[0] oldest
        os.utime(os.path.join(cdir, k.hex()), (now - age, now - age))
    size = max(sizes.values())
    bounded = pc.PersistentCache(cdir, max_bytes=int(3.5 * size))
    assert bounded.load(keys[0], SPECS, 2) is not None      # now keys[1] is least recently used
    bounded.store(keys[3], c, {})
    assert sorted(os.listdir(cdir)) == sorted(k.hex() for k in (keys[0], keys[2], keys[3]))
    assert bounded.stats()["evictions"] == 1
    assert sum(os.path.getsize(os.path.join(cdir, n)) for n in os.listdir(cdir)) <= 3.5 * size
    tiny = pc.PersistentCache(cdir, max_bytes=1)
    tiny.store(keys[1], c, {})
    assert os.listdir(cdir) == []


# ---------------------------------------------------------------------------------------
# (9) the command line
def test_cli_ls_stats_clear(cdir, key_file):
    cache = pc.PersistentCache(cdir)
    cache.store(KEY, compile_prog(), {"name": "first"})
    cache.store(KEY2, compile_prog(donate=()), {"name": "second"})
    (open(os.path.join(cdir, "README"), "w")).write("not an entry")
    env = child_env(key_file)
    env["XLA_PERSISTENT_CACHE_PATH"] = cdir

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "lazyxla", "cache", *args], env=env,
                              capture_output=True, text=True, timeout=180)

    r = cli("ls")                                             # PATH from the environment
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for k, name in ((KEY, "first"), (KEY2, "second")):
        row = [ln for ln in lines if ln.startswith(k.hex())]
        assert len(row) == 1 and name in row[0]
        assert f"{os.path.getsize(os.path.join(cdir, k.hex())) / 1024:.1f}KB" in row[0]
    assert "2 entries" in lines[-1]

    r = cli("stats", cdir)
    assert r.returncode == 0, r.stderr
    total = sum(os.path.getsize(os.path.join(cdir, k.hex())) for k in (KEY, KEY2))
    assert "entries:    2" in r.stdout and f"bytes:      {total} " in r.stdout

    r = cli("clear", cdir)
    assert r.returncode == 0, r.stderr
    assert "removed 2 entries" in r.stdout
    assert os.listdir(cdir) == ["README"], "clear deletes entries only"

    env.pop("XLA_PERSISTENT_CACHE_PATH")
    r = cli("ls")
    assert r.returncode == 2 and "XLA_PERSISTENT_CACHE_PATH" in r.stderr


def test_signature_checks_are_remembered_signed_and_cleared(cdir):
    """A lowering check that passed is remembered in the cache directory for the next process;
    a record that does not verify (edited, another key's) is not believed; clear forgets."""
    first = pc.PersistentCache(cdir)
    assert not first.was_checked(KEY)
    first.remember_checked(KEY)
    again = pc.PersistentCache(cdir)                                  # as a new process sees it
    assert again.was_checked(KEY) and not again.was_checked(KEY2)
    path = os.path.join(cdir, store.CHECKS_FILE)
    with open(path, "r+b") as f:                                      # flip a bit of the MAC
        f.seek(20)
        b = f.read(1)
        f.seek(20)
        f.write(bytes([b[0] ^ 1]))
    assert not pc.PersistentCache(cdir).was_checked(KEY)
    ro = pc.PersistentCache(cdir, readonly=True)
    ro.remember_checked(KEY2)                                         # read-only: remembered here only
    assert ro.was_checked(KEY2) and not pc.PersistentCache(cdir).was_checked(KEY2)
    first.remember_checked(KEY2)
    first.clear()
    assert not os.path.exists(path) and not pc.PersistentCache(cdir).was_checked(KEY2)


def test_first_sight_of_a_signature_skips_a_remembered_lowering_check(cdir, monkeypatch):
    """With the persistent cache on, a new process's first step does not trace lowerings that
    an earlier process checked; a new signature is still checked (and then remembered)."""
    from lazyxla.frontend import signature, tensor
    monkeypatch.setenv("XLA_PERSISTENT_CACHE_PATH", cdir)
    pc._reset_for_tests()
    traced = []
    real = signature._trace_lowering
    monkeypatch.setattr(signature, "_trace_lowering", lambda *a, **k: traced.append(1) or real(*a, **k))
    import torch
    dev = lazyxla.device()
    t = torch.arange(6.0).reshape(2, 3).to(dev)

    def first_sight(op):
        monkeypatch.setattr(tensor, "_SIGS", {})                     # a new process's empty table
        traced.clear()
        r = op(t)
        return len(traced), r

    n, r = first_sight(lambda v: torch.atan2(v, v + 7.0))
    assert n >= 1                                                     # checked the first time
    pc._reset_for_tests()                                             # the next process's cache object
    n, r2 = first_sight(lambda v: torch.atan2(v, v + 7.0))
    assert n == 0                                                     # remembered: not traced again
    assert torch.allclose(r2.cpu(), torch.atan2(torch.arange(6.0).reshape(2, 3), torch.arange(6.0).reshape(2, 3) + 7))
    n, _ = first_sight(lambda v: torch.atan2(v.double(), v.double()))  # other input dtypes: checked
    assert n >= 1
