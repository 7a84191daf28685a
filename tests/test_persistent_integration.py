"""R7 wired into the executor: a second process running the same training loads its
program instead of compiling; explanations see keys other processes compiled."""
import os
import subprocess
import sys
import textwrap

TRAIN = """
    import torch, lazyxla, lazyxla.debug.metrics as met
    torch.manual_seed(0)
    d = lazyxla.device()
    m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(d)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(4, 6).to(d), torch.randint(0, 2, (4,)).to(d)
    for _ in range(4):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
        lazyxla.sync()
    c = lambda k: met.counter_value(k) or 0
    print(round(m[0].weight.cpu().sum().item(), 6), c('PersistentCacheMiss'), c('PersistentCacheHit'),
          c('UncachedCompile'), c('PersistentCacheDeserializeFailure'))
"""


def run(code, **env):
    e = dict(os.environ, **env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def test_second_process_loads_instead_of_compiling(tmp_path):
    first = run(TRAIN, XLA_PERSISTENT_CACHE_PATH=str(tmp_path)).stdout.split()
    second = run(TRAIN, XLA_PERSISTENT_CACHE_PATH=str(tmp_path)).stdout.split()
    assert first[0] == second[0]                 # same weights after 4 steps
    assert int(first[1]) >= 1 and first[2] == "0" and int(first[3]) >= 1
    assert second[1] == "0" and int(second[2]) == int(first[1]) and second[3] == "0" and second[4] == "0"


def test_read_only_cache_is_used_but_not_written(tmp_path):
    run(TRAIN, XLA_PERSISTENT_CACHE_PATH=str(tmp_path))
    before = sorted(os.listdir(tmp_path))
    out = run(TRAIN, XLA_PERSISTENT_CACHE_PATH=str(tmp_path), XLA_PERSISTENT_CACHE_READ_ONLY="1").stdout.split()
    assert out[3] == "0" and int(out[2]) >= 1
    other = run(TRAIN.replace("torch.randn(4, 6)", "torch.randn(5, 6)").replace("(4,)", "(5,)"),
                XLA_PERSISTENT_CACHE_PATH=str(tmp_path), XLA_PERSISTENT_CACHE_READ_ONLY="1").stdout.split()
    assert int(other[3]) >= 1  # new shapes compile ...
    assert sorted(os.listdir(tmp_path)) == before  # ... and nothing is written


def test_auto_spmd_mesh_change_across_processes_is_explained_as_sharding(tmp_path):
    code = """
        import torch, lazyxla, lazyxla.debug as dbg
        y = torch.ones(4).to(lazyxla.device()) * 3
        lazyxla.sync()
        r = dbg.recompile_log()[-1]
        print(r.site)
        print(r.text)
    """
    run(code, XLA_PERSISTENT_CACHE_PATH=str(tmp_path), XLA_AUTO_SPMD_MESH="")
    out = run(code, XLA_PERSISTENT_CACHE_PATH=str(tmp_path), XLA_AUTO_SPMD_MESH="2,1").stdout.splitlines()
    assert out[0] == "sharding" and "XLA_AUTO_SPMD_MESH='2,1'" in out[1]
