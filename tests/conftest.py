"""Shared fixtures. ``nothing_pending``: nothing pending from an earlier test leaks into the
next one (test files that count compiles use it for every test, with ``pytestmark``)."""
import gc
import sys

import pytest

import lazyxla


@pytest.fixture
def nothing_pending():
    # a failed test's frames (kept by pytest in sys.last_*) must not keep its tensors alive
    sys.last_type = sys.last_value = sys.last_traceback = None
    gc.collect()
    lazyxla.sync()
    lazyxla.wait_device_ops()
    yield
