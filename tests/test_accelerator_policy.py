"""What the suite changes on an accelerator (``conftest.ACCELERATOR``), checked here on XLA:CPU:
float comparisons floored at the accelerator's tolerances, exact ones kept exact, and the
``cpu_only`` marker's reason required and carried into the skip."""
import pytest
import torch

import conftest


def test_float_comparisons_are_floored_and_exact_ones_stay_exact():
    close = conftest._loosened(torch.testing.assert_close)
    want = torch.tensor([1.0, 2.0])
    close(want * (1 + 1e-3), want)  # within the floor (rtol 2e-3), though torch's default says no
    close(want * (1 + 1e-3), want, rtol=1e-5, atol=1e-6)  # a tighter ask is floored too
    with pytest.raises(AssertionError):
        torch.testing.assert_close(want * (1 + 1e-3), want)
    with pytest.raises(AssertionError):
        close(want * (1 + 1e-2), want)  # beyond the floor
    with pytest.raises(AssertionError):
        close(want * (1 + 1e-7), want, rtol=0, atol=0)  # asked to be exact: exact
    half = torch.tensor([8.9375, -122.5], dtype=torch.bfloat16)  # a v5e's x ** 3 against eager's 9, -123
    close(half, torch.tensor([9.0, -123.0], dtype=torch.bfloat16))  # bfloat16's own default (1.6e-2) kept
    approx = conftest._approx_loosened(pytest.approx)
    assert 1.001 == approx(1.0, rel=1e-6)
    assert 1.01 != approx(1.0)
    assert 1.0 + 1e-9 != approx(1.0, rel=0, abs=0)


def _items(pytester, name, source):
    pytester.makeini("[pytest]\nmarkers =\n    cpu_only(reason): as the suite's\n    float64: as the suite's\n")
    pytester.makepyfile(**{name: source})
    return pytester.getitems(pytester.path / f"{name}.py")


def test_cpu_only_skips_with_its_reason_on_an_accelerator_and_needs_one(pytester, monkeypatch):
    items = _items(pytester, "test_reasons", """
        import pytest
        @pytest.mark.cpu_only("needs CPU's bits")
        def test_a(): pass
        def test_b(): pass
    """)
    monkeypatch.setattr(conftest, "ON_CPU", False)
    conftest.pytest_collection_modifyitems(None, items)
    skips = {i.name: [m.kwargs.get("reason") for m in i.iter_markers("skip")] for i in items}
    assert skips == {"test_a": ["runs on XLA:CPU only: needs CPU's bits"], "test_b": []}
    items = _items(pytester, "test_no_reason", """
        import pytest
        @pytest.mark.cpu_only
        def test_c(): pass
    """)
    with pytest.raises(pytest.UsageError, match="cpu_only needs a reason"):
        conftest.pytest_collection_modifyitems(None, items)
    monkeypatch.setattr(conftest, "ON_CPU", True)
    with pytest.raises(pytest.UsageError, match="cpu_only needs a reason"):  # on the CPU too
        conftest.pytest_collection_modifyitems(None, items)


def test_on_the_cpu_nothing_is_skipped_and_the_device_files_are_marked(pytester):
    items = _items(pytester, "test_on_cpu", """
        import pytest
        @pytest.mark.cpu_only("needs CPU's bits")
        def test_a(): pass
    """)
    conftest.pytest_collection_modifyitems(None, items)
    assert not list(items[0].iter_markers("skip"))
    assert not list(items[0].iter_markers("device"))  # not one of DEVICE_FILES
    assert all(name.startswith("test_") and name.endswith(".py") for name in conftest.DEVICE_FILES)


def test_float64_cases_run_in_the_float64_files_only_where_float64_is_emulated(pytester, monkeypatch):
    source = """
        import pytest, torch
        @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
        def test_d(dtype): pass
        @pytest.mark.float64
        def test_e(): pass
    """
    from lazyxla.xla import widths
    monkeypatch.setattr(conftest, "FLOAT64_FILES", ("test_float64_home.py",))  # (a real file's module is imported)
    for native, name in ((True, "test_elsewhere"), (False, "test_elsewhere"), (False, "test_float64_home")):
        items = _items(pytester, name, source)
        monkeypatch.setitem(widths.FLOAT64_NATIVE, "cpu", native)
        conftest.pytest_collection_modifyitems(None, items)
        skips = {i.name: [m.kwargs.get("reason") for m in i.iter_markers("skip")] for i in items}
        emulated_elsewhere = not native and name == "test_elsewhere"
        f64 = [conftest.FLOAT64_EMULATED] if emulated_elsewhere else []
        assert skips == {"test_d[dtype0]": [], "test_d[dtype1]": f64, "test_e": f64}
