"""Shared fixtures. ``nothing_pending``: nothing pending from an earlier test leaks into the
next one (test files that count compiles use it for every test, with ``pytestmark``).
``torch_config_unchanged`` (every test): a test that leaves one of torch's settings changed
fails there, not in whichever later test meets the setting.

On an accelerator (lazyxla's device is not the CPU: a TPU), the session changes what
``ACCELERATOR`` lists (float32 products at ``'highest'``, children on XLA:CPU, float
tolerances), and a test marked ``cpu_only(reason)`` is skipped with its reason. A test marked
``device`` checks what the device computes or holds (values against eager, dtypes, kernels,
precision, donation): ``pytest -m device`` on a TPU (docs/guide/tpu.md, "The tests on a TPU")."""
import gc
import sys

import pytest
import torch

import lazyxla
from lazyxla import runtime
from lazyxla.run.storage import pending
from lazyhelp import config_changes, torch_config

ON_CPU = runtime.device_type() == "CPU"
pytest_plugins = ["pytester"]  # tests/test_accelerator_policy.py collects small test files of its own


def pytest_configure(config):
    config.addinivalue_line("markers", "cpu_only(reason): the test runs on XLA:CPU only; on an accelerator "
                                       "it is skipped with the reason")
    config.addinivalue_line("markers", "float64: the test's work is float64 throughout (FLOAT64_FILES' rule applies, "
                            "as to a float64 parameter)")
    config.addinivalue_line("markers", "device: the test checks what the device computes or holds (values "
                                       "against eager, dtypes, kernels, precision, donation): the TPU's suite")


# The TPU's suite (``pytest -m device``): the files whose tests check what the device computes
# or holds, each with what it checks there. The rest (hashing, caches, explanations, reports,
# the CLI, dynamic shapes' planning, distribution, HF integration) is host code, the same on
# every platform, and runs in CI on XLA:CPU.
DEVICE_FILES = {
    "test_core_numerics.py": "elementwise, reductions, products: values against eager",
    "test_dtypes.py": "every dtype's round trip, promotion and factories",
    "test_beyond_float32.py": "int64, float64 and complex values",
    "test_conjugate_views.py": "complex views and FFTs against eager",
    "test_views.py": "views and in-place updates: values against eager",
    "test_lowering_nn.py": "nn lowerings (convolutions, norms, pooling, losses) against eager",
    "test_lowering_linalg.py": "linear algebra against eager",
    "test_lowering_more_ops.py": "sorts, scans, FFTs, indexing against eager",
    "test_lowering_special.py": "special functions against eager",
    "test_core_rng.py": "the device's random numbers: seeds, streams, distributions",
    "test_random_ops.py": "random ops' distributions",
    "test_attention.py": "attention as one node: values and gradients against eager",
    "test_cross_entropy.py": "cross entropy as one node: values and gradients against eager",
    "test_tpu_kernels.py": "the TPU's Pallas kernels",
    "test_precision.py": "matmul precision",
    "test_optimizer_fused.py": "fused optimizer steps against eager",
    "test_optimizer_stacks.py": "stacked optimizer moments against eager",
    "test_optimizer_state.py": "optimizer state on the device",
    "test_param_stacks.py": "parameters as rows of stacks: training against eager",
    "test_training.py": "small models' training against eager",
    "test_running_stats.py": "batch norm's running statistics",
    "test_donation.py": "donated buffers: the device's memory",
    "test_value_checks.py": "value checks computed on the device",
}


# The files whose tests cost most, heaviest first: the suite hands them out before the others.
# ``--dist loadfile`` gives each file to one worker as it frees; xdist's default order (most tests
# first) left the files of few, long tests (HF models, rolling, subprocesses) for last, where one
# worker ran them for minutes after the other had run out (CI 2026-12-07: test_rolling's five
# longest, 54-114 s each, in the suite's last minutes). The rest follow, most tests first. Order
# only: a file missing here still runs, and a new heavy one belongs here.
HEAVY_FIRST = ("test_rolling.py", "test_scan.py", "test_hf_replay.py", "test_hf_trainer.py", "test_dynamic_shapes.py",
               "test_coverage.py", "test_tpu_kernels.py", "test_zoo.py", "test_hf_generate.py",
               "test_beyond_float32.py", "test_param_stacks.py", "test_persistent_cache.py", "test_int64_width.py", "test_multiprocess.py",
               "test_doc_blocks.py", "test_docs_site.py", "test_demo.py", "test_cache_keys.py",
               "test_persistent_integration.py", "test_optimizer_state.py", "test_outside_checks.py",
               "test_conjugate_views.py", "test_spmd.py", "test_error_inputs.py", "test_wrapping.py",
               "test_profiler.py", "test_fold_page.py", "test_xla_options.py")


def _heavy_first(items):
    """``items`` reordered by file: ``HEAVY_FIRST``'s in its order, then the others by how many
    tests they hold (most first); a file's own tests keep their order."""
    rank = {name: k for k, name in enumerate(HEAVY_FIRST)}
    count = {}
    for item in items:
        count[item.path.name] = count.get(item.path.name, 0) + 1
    # a stable sort: a file's tests stay together and in their order, ties keep collection order
    items.sort(key=lambda it: (rank.get(it.path.name, len(rank)), -count[it.path.name]))


# Where the device emulates float64 (a TPU keeps it as two float32s: ``xla.widths``), a test
# parametrized with float64 runs in these files only (their float64 cases are what they check);
# elsewhere it is skipped with FLOAT64_EMULATED's reason. Its float64 program compiled for 3-9 s
# on a v5e (test_lowering_nn's float64 activations: 60 s of the suite's 447 in 618 tests,
# 2026-12-07), against 0.1-0.3 s for another dtype's.
FLOAT64_FILES = ("test_beyond_float32.py",)
FLOAT64_EMULATED = ("float64 is emulated on this device (two float32s): each float64 program compiles for "
                    "seconds; float64 is checked here by test_beyond_float32.py, and this case on XLA:CPU")


def _float64_case(item) -> bool:
    """A test parametrized with float64, or marked ``float64`` (its work is float64 throughout)."""
    if item.get_closest_marker("float64") is not None:
        return True
    spec = getattr(item, "callspec", None)
    return spec is not None and any(v is torch.float64 for v in spec.params.values())


def pytest_collection_modifyitems(config, items):
    _heavy_first(items)
    from lazyxla.xla import widths
    emulated = not widths.float64_native()
    for item in items:
        if item.path.name in DEVICE_FILES:
            item.add_marker(pytest.mark.device)
        if emulated and item.path.name not in FLOAT64_FILES and _float64_case(item):
            item.add_marker(pytest.mark.skip(reason=FLOAT64_EMULATED))
        mark = item.get_closest_marker("cpu_only")
        if mark is None:
            continue
        reason = mark.kwargs.get("reason") or (mark.args[0] if mark.args else "")
        if not reason:  # on every platform: CI finds a mark without its reason
            raise pytest.UsageError(f"{item.nodeid}: cpu_only needs a reason")
        if not ON_CPU:
            item.add_marker(pytest.mark.skip(reason=f"runs on XLA:CPU only: {reason}"))


# On an accelerator: what the session changes so that tests written against XLA:CPU's float32
# check the same behaviour there (``on_an_accelerator``). A comparison asked to be exact
# (``rtol=0, atol=0``) stays exact: a test that needs CPU's bits is marked ``cpu_only``.
ACCELERATOR = {
    # float32 products at about float32 (six passes of the TPU's bfloat16 unit); XLA:CPU computes
    # float32 at every setting
    "mat_mul_precision": "highest",
    # a test's second process runs on XLA:CPU: one process holds a TPU ("libtpu lockfile")
    "child JAX_PLATFORMS": "cpu",
    # float comparisons with eager at least this loose: the TPU's float32 transcendentals and
    # summation orders differ from CPU's by more than torch's float32 defaults (1.3e-6, 1e-5).
    # Measured on a v5e at 'highest' (2026-12-06): attention's float32 gradients up to 9.3e-5
    # apart (1.2e-3 relative), a tanh of a product's gradient 2.2e-4 (2.5e-3 relative, where
    # 1 - tanh^2 cancels), attention over padded lengths 3.9e-4
    "rtol": 2e-3,
    "atol": 5e-4,
}


def _dtype_tolerances(actual, expected):
    """torch.testing's own tolerances for these tensors' dtypes (bfloat16's 1.6e-2), (0, 0) for
    what is not a tensor: loosening must not tighten them."""
    try:
        from torch.testing._comparison import default_tolerances
        return default_tolerances(actual, expected)
    except Exception:  # noqa: BLE001 - lists, numbers, a torch without the helper
        return 0.0, 0.0


def _loosened(assert_close):
    def on_an_accelerator(actual, expected, *args, rtol=None, atol=None, **kw):
        if (rtol, atol) != (0, 0):
            if rtol is None and atol is None:
                rtol, atol = _dtype_tolerances(actual, expected)
            rtol, atol = max(rtol or 0.0, ACCELERATOR["rtol"]), max(atol or 0.0, ACCELERATOR["atol"])
        return assert_close(actual, expected, *args, rtol=rtol, atol=atol, **kw)
    return on_an_accelerator


def _approx_loosened(approx):
    def on_an_accelerator(expected, rel=None, abs=None, nan_ok=False):  # noqa: A002 (pytest's names)
        if (rel, abs) != (0, 0):
            rel = max(rel or 1e-6, ACCELERATOR["rtol"])
        return approx(expected, rel=rel, abs=abs, nan_ok=nan_ok)
    return on_an_accelerator


@pytest.fixture(autouse=True, scope="session")
def on_an_accelerator():
    """On an accelerator, for the whole session: ``ACCELERATOR``'s precision, children's
    platform and float tolerances. On XLA:CPU nothing changes."""
    if ON_CPU:
        yield
        return
    import os
    import torch
    from lazyxla import backends
    was = backends.get_mat_mul_precision(), os.environ.get("JAX_PLATFORMS"), torch.testing.assert_close, pytest.approx
    backends.set_mat_mul_precision(ACCELERATOR["mat_mul_precision"])
    os.environ["JAX_PLATFORMS"] = ACCELERATOR["child JAX_PLATFORMS"]  # this process's JAX has its platform already
    torch.testing.assert_close = _loosened(was[2])
    pytest.approx = _approx_loosened(was[3])
    yield
    backends.set_mat_mul_precision(was[0])
    if was[1] is None:
        os.environ.pop("JAX_PLATFORMS", None)
    else:
        os.environ["JAX_PLATFORMS"] = was[1]
    torch.testing.assert_close, pytest.approx = was[2], was[3]


@pytest.fixture
def nothing_pending():
    # a failed test's frames (kept by pytest in sys.last_*) must not keep its tensors alive
    sys.last_type = sys.last_value = sys.last_traceback = None
    if pending()[0]:  # dead tensors in reference cycles go first: only live ones are synced
        gc.collect()  # (a full collection costs up to 1.5 s in a worker's grown heap: only when needed)
        lazyxla.sync()
    lazyxla.wait_device_ops()
    yield


@pytest.fixture
def exact_shapes():
    """torch_xla's behaviour: one program per shape (``LAZYXLA_DYNAMIC_BUCKETS=off``), for tests
    of the seed's counts that give every test fresh sizes."""
    from lazyxla.dynamic import bounds
    was = bounds.POLICY
    bounds.POLICY = None
    yield
    bounds.POLICY = was


@pytest.fixture(autouse=True)
def torch_config_unchanged():
    # change torch's settings with torch's own patching (torch._dynamo.config.patch(...)), which
    # restores them; a monkeypatched or deleted setting outlives the test (pytest 9.2's undo
    # deletes an attribute a module serves through __getattr__)
    before = torch_config()
    yield
    changed = config_changes(before, torch_config())
    assert not changed, "this test left torch's settings changed:\n  " + "\n  ".join(changed)


@pytest.fixture(autouse=True, scope="module")
def fresh_heap_per_file():
    """After each test file: the programs, traces and Dynamo frames it made are let go, and the
    heap collected. A worker runs a third of the suite in one process (``--dist loadfile``), and
    late files' small-model tests ran far slower there than alone (test_param_stacks' four
    slowest: 359 s in the suite, 36 s alone). With this, the suite's pytest time went from
    1634 s to 1516-1600 s. What else slowed a late file was explain's search for the closest
    earlier key, which walked every earlier key's IR at each compile (fixed in 591ec42)."""
    yield
    import jax
    import torch
    from lazyxla import dynamic
    from lazyxla.compiler.cache import computation_cache
    lazyxla.wait_device_ops()
    computation_cache().clear()
    dynamic.reset()
    torch._dynamo.reset()
    jax.clear_caches()
    gc.collect()
