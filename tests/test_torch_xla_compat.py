"""Issue 15: torch_xla scripts run unchanged (``lazyxla run SCRIPT``), and the torch_xla APIs they
use, each in lazyxla's own API: step closures, ``lazyxla.compile``/``step`` (``full_graph``),
eager mode, the device loader, the rate tracker, the sample generator, the training-update
lines, ``device_type``, ``mesh_reduce``/``launch`` in a world of one.

The lazyxla-native APIs are tested in this process; the ``torch_xla`` names only through
``lazyxla run`` in a subprocess (two runs: one script that uses every listed name as torch_xla's
examples do, and one that fails), so nothing here installs the torch_xla finder in the test
process.
"""
import collections
import importlib.util
import itertools
import os
import re
import subprocess
import sys
import textwrap
import threading
import time

import jax
import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met
import lazyxla.distributed as xd
import lazyxla.runtime as xr
from lazyxla.engine import closures
from lazyxla import progress
from lazyxla.data import DeviceLoader, SampleGenerator

D = lazyxla.device()


def _count(name):
    return met.counter_value(name) or 0


def _is_device_data(t):
    """A read of ``t`` compiles and runs nothing (its value is a device buffer)."""
    lazyxla.wait_device_ops()
    before = (_count("UncachedCompile"), _count("CachedCompile"))
    t.cpu()
    return (_count("UncachedCompile"), _count("CachedCompile")) == before


@pytest.fixture(autouse=True)
def _clean_step():
    lazyxla.sync()
    closures.wait_async_closures()
    yield
    lazyxla.experimental.eager_mode(False)
    lazyxla.sync()
    closures.wait_async_closures()


# ---------------------------------------------------------------------------------------
# step closures
def test_closures_run_after_the_step_in_order_with_its_values():
    x = torch.arange(4.0).to(D)
    seen = []
    y = x * 2
    lazyxla.add_step_closure(lambda t: seen.append(("first", t.tolist())), (y,))
    z = y + 1
    lazyxla.add_step_closure(lambda t, tag: seen.append((tag, t.tolist())), (z, "second"))
    assert seen == []                       # nothing runs before the step's sync
    compiles = _count("UncachedCompile") + _count("CachedCompile")
    lazyxla.sync()
    assert seen == [("first", [0.0, 2.0, 4.0, 6.0]), ("second", [1.0, 3.0, 5.0, 7.0])]
    assert _count("UncachedCompile") + _count("CachedCompile") == compiles + 1   # the step's one program
    lazyxla.sync()
    assert len(seen) == 2                   # each closure runs once


def test_a_closure_added_by_a_closure_runs_at_the_next_step_and_errors_propagate():
    seen = []
    lazyxla.add_step_closure(lambda: lazyxla.add_step_closure(lambda: seen.append("inner")))
    lazyxla.sync()
    assert seen == []
    lazyxla.sync()
    assert seen == ["inner"]

    def boom():
        raise ValueError("closure failed")
    lazyxla.add_step_closure(boom)
    with pytest.raises(ValueError, match="closure failed"):
        lazyxla.sync()
    lazyxla.sync()                          # the failed closure is gone


def test_async_closures_run_on_another_thread_with_the_step_values():
    x = torch.ones(3).to(D)
    y = x * 5
    got = []
    main = threading.get_ident()
    lazyxla.add_step_closure(lambda t: got.append((threading.get_ident() != main, t.sum().item())), (y,),
                             run_async=True)
    lazyxla.sync()
    closures.wait_async_closures()
    assert got == [(True, 15.0)]

    lazyxla.add_step_closure(lambda: 1 / 0, run_async=True)
    lazyxla.sync()
    closures.wait_async_closures()
    lazyxla.add_step_closure(lambda: None, run_async=True)
    with pytest.raises(RuntimeError, match="earlier one raised ZeroDivisionError"):
        lazyxla.sync()


# ---------------------------------------------------------------------------------------
# lazyxla.compile / lazyxla.step
def test_compile_full_graph_rejects_a_read_at_the_users_line_before_running_anything():
    x = torch.ones(3).to(D)

    @lazyxla.compile(full_graph=True, name="my_step")
    def step(a):
        b = a * 3
        return b.sum().item()  # the read

    line = step.__wrapped__.__code__.co_firstlineno + 3
    records = len(lazyxla.debug.recompile_log())
    with pytest.raises(lazyxla.LazyXlaError) as e:
        step(x)
    msg = str(e.value)
    assert f"test_torch_xla_compat.py:{line}" in msg
    assert "'my_step'" in msg and ".item()" in msg
    assert [r.cause for r in lazyxla.debug.recompile_log()[records:]] in ([], ["sync"])  # the read ran nothing

    # a CPU fallback op is a read too, named by its op
    @lazyxla.compile(full_graph=True)
    def fallback(a):
        return torch.nonzero(a - 1)
    with pytest.raises(lazyxla.LazyXlaError, match=r"aten::nonzero.*runs on the CPU"):
        fallback(x)


def test_compile_is_one_program_per_step_and_allows_reads_without_full_graph():
    w = torch.ones(4).to(D)

    def update(w, x):
        w.mul_(x).add_(1)
        return w.sum()

    stepped = lazyxla.compile(update)
    assert stepped.__name__ == "update"
    x = torch.full((4,), 2.0).to(D)
    stepped(w, x)
    u0 = _count("UncachedCompile")
    s = stepped(w, x)
    assert _count("UncachedCompile") == u0  # the same step again: cached
    assert _is_device_data(s) and _is_device_data(w)
    assert w.tolist() == [7.0] * 4

    with lazyxla.compile():                 # a read inside a step without full_graph is allowed
        v = (w * 2).sum().item()
    assert v == 56.0
    with lazyxla.step():
        t = w + 1
    assert _is_device_data(t) and t.tolist() == [8.0] * 4


# ---------------------------------------------------------------------------------------
# eager mode
def test_eager_mode_gives_values_per_op_through_the_compile_cache():
    x = torch.arange(3.0).to(D)
    lazyxla.experimental.eager_mode(True)
    assert lazyxla.experimental.is_eager_mode()
    steps = _count("MarkStep")
    y = x + 1
    assert _is_device_data(y)               # computed when the op ran
    u = _count("UncachedCompile")
    z = x + 1                               # the same op: cached program
    assert _count("UncachedCompile") == u and z.tolist() == [1.0, 2.0, 3.0]
    a, b = torch.randn(5, device=D), torch.randn(5, device=D)
    assert not torch.equal(a.cpu(), b.cpu())        # the seed moves on per op
    lazyxla.manual_seed(7)
    c = torch.randn(5, device=D)
    lazyxla.manual_seed(7)
    d = torch.randn(5, device=D)
    assert torch.equal(c.cpu(), d.cpu())
    assert _count("MarkStep") == steps      # no op is a step
    assert met.metric_data("EagerOpExecuteTime")[0] >= 5

    seen = []                               # closures wait for the sync, even in eager mode
    lazyxla.add_step_closure(lambda: seen.append(1))
    w = x * 2
    assert seen == []
    lazyxla.sync()
    assert seen == [1] and w.tolist() == [0.0, 2.0, 4.0]

    with lazyxla.compile(full_graph=True):  # a compiled step is one program, eager off inside
        assert not lazyxla.experimental.is_eager_mode()
        q = x * 3 + 1
    assert lazyxla.experimental.is_eager_mode() and q.tolist() == [1.0, 4.0, 7.0]


# ---------------------------------------------------------------------------------------
# the device loader, the sample generator
Pair = collections.namedtuple("Pair", "x y")


def test_device_loader_batches_are_device_data_with_their_structure_and_a_sync_per_batch():
    batches = [{"img": torch.full((2, 3), float(i)), "meta": [Pair(torch.tensor([i]), "tag"), 7]}
               for i in range(3)]
    loader = DeviceLoader(batches, D)
    assert len(loader) == 3
    steps = _count("MarkStep")
    got = []
    for b in loader:
        img, (pair, seven) = b["img"], b["meta"]
        assert type(img) is lazyxla.LazyTensor and img.device == D and _is_device_data(img)
        assert type(pair) is Pair and pair.y == "tag" and pair.x.device == D and seven == 7
        got.append((img * 2).sum().item())
    assert got == [0.0, 12.0, 24.0]
    assert _count("MarkStep") - steps == 5   # one before each batch, one at the end (torch_xla's count)
    assert [float(b["img"][0, 0]) for b in loader] == [0.0, 1.0, 2.0]   # iterable again


def test_device_loader_raises_the_loaders_error_and_frees_its_thread_when_left_early():
    def broken():
        yield torch.ones(2)
        raise OSError("disk gone")
    it = iter(DeviceLoader(broken(), D))
    assert next(it).tolist() == [1.0, 1.0]
    with pytest.raises(OSError, match="disk gone"):
        next(it)

    before = {t.ident for t in threading.enumerate()}
    for _ in itertools.islice(DeviceLoader(SampleGenerator((torch.zeros(2),), 1000), D), 2):
        pass
    deadline = time.time() + 5
    while time.time() < deadline and any(t.name == "lazyxla-device-loader" and t.ident not in before
                                         for t in threading.enumerate()):
        time.sleep(0.05)
    assert not any(t.name == "lazyxla-device-loader" and t.ident not in before for t in threading.enumerate())


def test_sample_generator():
    g = SampleGenerator(data=("a", 1), sample_count=3)
    assert len(g) == 3 and list(g) == [("a", 1)] * 3 and list(g) == [("a", 1)] * 3


# ---------------------------------------------------------------------------------------
# reporting, runtime, world of one
def test_rate_tracker_follows_torch_xlas_smoothing(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress.time, "time", lambda: clock[0])
    r = progress.RateTracker(smooth_factor=0.4)
    r.add(50)
    clock[0] = 101.0
    assert r.rate() == 50.0
    r.add(100)
    clock[0] = 102.0
    assert r.rate() == pytest.approx(0.6 * 100 + 0.4 * 50)
    assert r.global_rate() == pytest.approx(150 / 2)


def test_update_lines_master_print_and_summary_writer(capsys):
    progress.print_training_update(D, 20, 0.123456, 10.0, 9.5, epoch=2)
    progress.print_test_update(D, 98.1234, epoch=2)
    progress.master_print("only on rank", 0)
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"\| Training Device=lazyxla:0/0 Epoch=2 Step=20 Loss=0\.12346 Rate=10\.00 "
                        r"GlobalRate=9\.50 Time=\d\d:\d\d:\d\d", out[0])
    assert re.fullmatch(r"\| Test Device=lazyxla:0/0 Epoch=2 Accuracy=98\.12 Time=\d\d:\d\d:\d\d", out[1])
    assert out[2] == "only on rank 0"
    assert progress.summary_writer(None) is None
    progress.write_summary(None, 1, {"a": 1.0})   # no writer: nothing, as torch_xla
    if importlib.util.find_spec("tensorboard") is None and importlib.util.find_spec("tensorboardX") is None:
        with pytest.raises(ImportError, match="pip install tensorboard"):
            progress.summary_writer("/tmp/logs")


def test_device_type_world_of_one_and_no_torch_xla_outside_lazyxla_run():
    platform = jax.devices()[0].platform
    assert xr.device_type() == {"cpu": "CPU", "gpu": "CUDA", "tpu": "TPU"}.get(platform, platform.upper())
    assert xd.launch(lambda i, a, b: (i, a + b), (2, 3)) == (0, 5)
    x = torch.tensor([1.0, 3.0]).to(D)
    assert xd.mesh_reduce("acc", x, lambda parts: [p.sum().item() for p in parts]) == [4.0]
    spec = importlib.util.find_spec("torch_xla")           # only `lazyxla run` adds the name
    assert spec is None or "lazyxla" not in (spec.origin or "")


# ---------------------------------------------------------------------------------------
# lazyxla run: torch_xla scripts, in a subprocess
_HELPER = "VALUE = 'sibling module found'\n"

_SCRIPT = r'''
import importlib
import sys
import threading
import time
import numpy as np
import torch, torch.nn as nn
import torch.distributed as dist
import helper_mod                                   # the script's directory is on sys.path
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.distributed.xla_backend  # noqa: F401
import torch_xla.test.test_utils as test_utils
import torch_xla.utils.utils as xu
from torch_xla import runtime as xr
from torch_xla.amp import autocast
import lazyxla.compat.torch_xla

print("CHECK argv", sys.argv[1:], __name__, helper_mod.VALUE)
print("CHECK same", torch_xla is lazyxla.compat.torch_xla, xm is lazyxla.compat.torch_xla.core.xla_model)
print("CHECK runtime", xr.device_type(), xr.world_size(), xr.global_ordinal(), str(torch_xla.device()),
      str(xm.xla_device()), xm.is_master_ordinal())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


def _mp_fn(index, flags):
    dist.init_process_group("xla", init_method="xla://")
    torch.manual_seed(0)
    dev = torch_xla.device()
    model = Net().to(dev)
    xm.broadcast_master_param(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loss_fn = nn.CrossEntropyLoss()
    data = (torch.ones(flags["batch"], 4), torch.zeros(flags["batch"], dtype=torch.int64))
    loader = pl.MpDeviceLoader(xu.SampleGenerator(data=data, sample_count=3), dev)
    tracker = xm.RateTracker()
    seen, async_seen, main = [], [], threading.get_ident()

    def report(step, loss):
        seen.append((step, round(loss.item(), 4)))
        test_utils.print_training_update(dev, step, loss.item(), tracker.rate(), tracker.global_rate(), 1)

    step_fn = torch_xla.compile(lambda x, y: train_step(x, y), full_graph=True, name="train")

    def train_step(x, y):
        opt.zero_grad()
        with autocast(dev):
            loss = loss_fn(model(x), y)
        loss.backward()
        xm.optimizer_step(opt)
        return loss

    for step, (x, y) in enumerate(loader):
        print("CHECK batch", type(x).__name__, str(x.device), tuple(x.shape), str(y.dtype))
        loss = step_fn(x, y)
        tracker.add(flags["batch"])
        xm.add_step_closure(report, args=(step, loss))
        xm.add_step_closure(lambda s: async_seen.append((s, threading.get_ident() != main)), args=(step,),
                            run_async=True)
    torch_xla.sync()
    xm.wait_device_ops()
    print("CHECK closures", seen)
    deadline = time.time() + 20
    while len(async_seen) < 3 and time.time() < deadline:
        time.sleep(0.01)
    print("CHECK async", sorted(async_seen))
    print("CHECK mesh_reduce", xm.mesh_reduce("acc", 97.5, np.mean))
    print("CHECK compiles", met.counter_value("UncachedCompile"),
          "CompileTime" in torch_xla._XLAC._xla_metrics_report())
    writer = test_utils.get_summary_writer(None)          # no logdir: no writer, as torch_xla
    test_utils.write_to_summary(writer, 1, dict_to_write={"Accuracy/test": 97.5}, write_xla_metrics=True)
    test_utils.close_summary_writer(writer)
    xm.master_print("CHECK master", writer, xm.is_master_ordinal(local=False), test_utils.now("%Y") > "2000")

    def bad(x):
        y = x * 2
        if y.sum() > 0:                                # LINE_OF_READ
            y = y + 1
        return y
    try:
        torch_xla.compile(bad, full_graph=True)(torch.ones(2, device=dev))
    except RuntimeError as e:
        print("CHECK full_graph", type(e).__name__, str(e).split(":", 1)[1].split(";")[0].strip())

    torch_xla.experimental.eager_mode(True)
    t = torch.arange(3.0, device=dev) * 2
    before = met.counter_value("UncachedCompile"), met.counter_value("CachedCompile")
    print("CHECK eager", torch_xla.experimental.is_eager_mode(), t.tolist(),
          (met.counter_value("UncachedCompile"), met.counter_value("CachedCompile")) == before)
    torch_xla.experimental.eager_mode(False)

    try:
        xm.get_memory_info(dev)
    except NotImplementedError as e:
        print("CHECK not_offered", e)
    print("CHECK hasattr", hasattr(xm, "get_memory_info"))
    try:
        importlib.import_module("torch_xla.distributed.fsdp")
    except ModuleNotFoundError as e:
        print("CHECK no_module", e)
    xm.mark_step()
    return index


if __name__ == "__main__":
    torch_xla.launch(_mp_fn, args=({"batch": int(sys.argv[2])},))
    xmp.spawn(lambda i: print("CHECK spawn", i), nprocs=1)
    sys.exit(7)
'''


def _lazyxla_run(tmp_path, script_text, *args):
    (tmp_path / "helper_mod.py").write_text(_HELPER)
    script = tmp_path / "train_xla.py"
    script.write_text(textwrap.dedent(script_text))
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, "-m", "lazyxla", "run", str(script), *args], capture_output=True,
                       text=True, timeout=300, cwd=str(tmp_path), env=env)
    return r, script


def test_lazyxla_run_a_torch_xla_training_script(tmp_path):
    r, script = _lazyxla_run(tmp_path, _SCRIPT, "--batch_size", "8", "--flag")
    assert r.returncode == 7, r.stderr[-3000:]
    checks = {}
    for line in r.stdout.splitlines():
        if line.startswith("CHECK "):
            key, _, rest = line[6:].partition(" ")
            checks.setdefault(key, []).append(rest)
    assert checks["argv"] == ["['--batch_size', '8', '--flag'] __main__ sibling module found"]
    assert checks["same"] == ["True True"]
    assert checks["runtime"] == [f"{xr.device_type()} 1 0 lazyxla:0 lazyxla:0 True"]
    assert checks["batch"] == ["LazyTensor lazyxla:0 (8, 4) torch.int64"] * 3
    # each closure saw its own step's loss: training moves it down
    seen = eval(checks["closures"][0])
    assert [s for s, _ in seen] == [0, 1, 2] and seen[0][1] > seen[1][1] > seen[2][1]
    assert checks["async"] == ["[(0, True), (1, True), (2, True)]"]   # each on the background thread
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("| Training")]
    assert len(lines) == 3 and lines[0].startswith("| Training Device=lazyxla:0/0 Epoch=1 Step=0 Loss=")
    assert checks["mesh_reduce"] == ["97.5"]
    assert checks["master"] == ["None True True"]
    uncached, has_compile_time = checks["compiles"][0].split()
    assert has_compile_time == "True" and int(uncached) <= 4   # the step compiles at most twice (optimizer state)
    line = script.read_text().splitlines().index(
        next(ln for ln in script.read_text().splitlines() if "LINE_OF_READ" in ln)) + 1
    assert checks["full_graph"] == [f"LazyXlaError step 'bad' reads a value at train_xla.py:{line}: "
                                    ".item() (a Python number from a tensor: item(), float(), int(), bool(), "
                                    "an if on it)"]
    assert checks["eager"] == ["True [0.0, 2.0, 4.0] True"]
    assert checks["not_offered"] == ["torch_xla.core.xla_model.get_memory_info is not offered by lazyxla (nearest "
                                     "lazyxla alternative: none (JAX's device memory stats: "
                                     "jax.devices()[0].memory_stats()))"]
    assert checks["hasattr"] == ["False"]
    assert checks["no_module"][0].startswith("torch_xla.distributed.fsdp is not offered by lazyxla")
    assert checks["spawn"] == ["0"]


def test_lazyxla_run_reports_a_failing_script_as_python_does(tmp_path):
    r, script = _lazyxla_run(tmp_path, """
        import torch_xla
        import torch_xla.core.xla_model as xm
        print("started", flush=True)
        xm.this_does_not_exist()
        """)
    assert r.returncode == 1
    assert r.stdout == "started\n"
    assert f'File "{script}", line 5, in <module>' in r.stderr
    assert r.stderr.rstrip().splitlines()[-1].startswith(
        "lazyxla.compat.NotOffered: torch_xla.core.xla_model.this_does_not_exist is not offered by lazyxla")
