"""The package's layout rules (docs/design.md, "Layers"): each stage imports only the stages
below it and no package's modules import each other in a circle (import-linter's contracts in
pyproject.toml, shown to fail on a wrong-way import), JAX's private API is reached from one
module, the environment is read through one module, and ``import lazyxla`` alone makes every
diagnostic usable."""
import os
import shutil
import subprocess
import sys

import lazyxla

PKG = os.path.dirname(lazyxla.__file__)


def _modules():
    out = {}
    for root, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, os.path.dirname(PKG))[:-3].replace(os.sep, ".")
                out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # holds pyproject.toml and tests/


def _lint_imports(root):
    """lint-imports (import-linter, pinned in the test extra) over the ``lazyxla`` package under
    ``root`` with the contracts of ``root``'s pyproject.toml: (exit code, what it printed)."""
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    r = subprocess.run([sys.executable, "-c", code, os.path.join(root, "pyproject.toml"), "--no-cache", "--no-logo"],
                       cwd=root, env=dict(os.environ, PYTHONPATH=root), capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


def test_stages_import_only_downward_and_no_package_has_a_circle():
    rc, out = _lint_imports(CHECKOUT)
    assert rc == 0, out
    assert "stages import only the stages below them KEPT" in out, out
    assert "no modules of one package import each other in a circle KEPT" in out, out


def test_a_wrong_way_import_a_circle_and_a_stage_not_in_the_layers_each_break_the_contracts(tmp_path):
    """The contracts can fail: on a copy of the package, an upward import (the IR importing the
    front end), a circle inside one package (dynamic's messages importing its planner, which
    imports them) and a new top-level module no layer names are each reported."""
    shutil.copytree(PKG, tmp_path / "lazyxla", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(CHECKOUT, "pyproject.toml"), tmp_path)
    with open(tmp_path / "lazyxla" / "ir" / "node.py", "a") as f:
        f.write("\nfrom ..frontend import tensor as _upward  # noqa: E402,F401\n")
    with open(tmp_path / "lazyxla" / "dynamic" / "messages.py", "a") as f:
        f.write("\nfrom . import planner as _back  # noqa: E402,F401\n")
    (tmp_path / "lazyxla" / "new_stage.py").write_text('"""A module put where no layer names it."""\n')
    rc, out = _lint_imports(str(tmp_path))
    assert rc == 1, out
    assert "stages import only the stages below them BROKEN" in out, out
    assert "lazyxla.ir is not allowed to import lazyxla.frontend" in out, out
    assert "lazyxla.ir.node -> lazyxla.frontend.tensor" in out, out
    assert "new_stage" in out, out  # exhaustive: every child of lazyxla sits in a layer
    assert "no modules of one package import each other in a circle BROKEN" in out, out
    assert "No cycles are allowed in lazyxla.dynamic." in out and "- .messages -> .planner" in out, out


def _grep(text):
    hits = []
    for name, path in _modules().items():
        if text in open(path).read():
            hits.append(name)
    return sorted(hits)


def test_jax_private_api_only_in_jax_internals():
    assert _grep("jax._src") == ["lazyxla.xla.jax_internals"]


def test_environment_read_only_through_config():
    readers = [m for m in _grep("os.environ.get") + _grep("os.getenv") if m != "lazyxla.config"]
    assert readers == []


def test_import_lazyxla_alone_makes_debug_usable():
    code = ("import torch, lazyxla\n"
            "d = lazyxla.device()\n"
            "x = torch.ones(3).to(d) * 2\n"
            "lazyxla.sync()\n"
            "print(len(lazyxla.debug.recompile_log()), lazyxla.debug.last_fold().steps[0].site,\n"
            "      lazyxla.debug.metrics.counter_value('UncachedCompile'))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["1", "force_ltc_data", "1"]


def test_jax_is_the_version_its_internals_were_checked_against():
    import jax
    from lazyxla.xla.jax_internals import CHECKED_JAX
    assert jax.__version__ == CHECKED_JAX, "re-check lazyxla/xla/jax_internals.py against this JAX, then update CHECKED_JAX"


def test_a_changed_jax_internal_is_an_error_naming_the_module(monkeypatch):
    import pytest
    from jax._src import dispatch as jax_dispatch
    from lazyxla.xla.jax_internals import JaxInternalsChanged, kept_arguments, tupled_parameters
    monkeypatch.delattr(jax_dispatch, "should_tuple_args")
    with pytest.raises(JaxInternalsChanged, match=r"lazyxla\.xla\.jax_internals: jax\._src\.dispatch\.should_tuple_args"):
        with tupled_parameters(True):
            pass
    with pytest.raises(JaxInternalsChanged, match=r"lazyxla/xla/jax_internals\.py"):
        kept_arguments(object(), 3)


def test_every_lazyxla_name_the_readme_and_the_manual_name_still_resolves():
    """The public face did not move with the modules: each dotted ``lazyxla.*`` name the README
    and the manual's pages (docs/**/*.md, docs/design.md among them) write (``lazyxla.debug.metrics``,
    ``lazyxla.hf.generate``, ``lazyxla.data.DeviceLoader``, ``lazyxla.distributed.spmd.mark_sharding``,
    ...) imports, and so does every name of ``lazyxla.__all__``."""
    import glob
    import importlib
    import re
    pages = [os.path.join(CHECKOUT, "README.md"),
             *sorted(glob.glob(os.path.join(CHECKOUT, "docs", "**", "*.md"), recursive=True))]
    assert os.path.join(CHECKOUT, "docs", "design.md") in pages
    text = "".join(open(p, encoding="utf-8").read() for p in pages)
    names = set(re.findall(r"(?<![\w.])lazyxla(?:\.[A-Za-z_]\w*)+", text))
    names |= {f"lazyxla.{n}" for n in lazyxla.__all__}
    assert len(names) > 40
    unresolved = []
    for name in sorted(names):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ImportError:
                continue
        try:
            for p in parts[i:]:
                obj = getattr(obj, p)
        except AttributeError:
            unresolved.append(name)
    assert unresolved == []
