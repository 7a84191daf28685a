"""Shared fixtures. ``nothing_pending``: nothing pending from an earlier test leaks into the
next one (test files that count compiles use it for every test, with ``pytestmark``).
``torch_config_unchanged`` (every test): a test that leaves one of torch's settings changed
fails there, not in whichever later test meets the setting."""
import gc
import sys

import pytest

import lazyxla
from lazyxla.run.storage import pending
from lazyhelp import config_changes, torch_config


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
    1634 s to 1516-1600 s. What else slows a late file was not found."""
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
