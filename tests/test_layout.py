"""The package's layout rules (docs/design.md, "Data flow and module ownership"): imports run
one way (no module imports itself back through others), JAX's private API is reached from
one module, the environment is read through one module, and ``import lazyxla`` alone makes
every diagnostic usable."""
import ast
import os
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


def _imports(name, path, modules):
    """lazyxla modules that ``name`` imports (any import statement, at any depth)."""
    tree = ast.parse(open(path).read())
    pkg = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                cand = f"{base}.{alias.name}"
                found.add(cand if cand in modules else base)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in modules and m != name}


def test_imports_run_one_way():
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    # a package's __init__ may import its own submodules (that is how a package exposes them)
    for m in graph:
        graph[m] = {d for d in graph[m] if not (d.startswith(m + ".") and modules[m].endswith("__init__.py"))
                    and not (m.startswith(d + ".") and modules[d].endswith("__init__.py") and
                             os.path.dirname(modules[m]) == os.path.dirname(modules[d]))}
    state, cycles = {}, []

    def visit(m, stack):
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def _grep(text):
    hits = []
    for name, path in _modules().items():
        if text in open(path).read():
            hits.append(name)
    return sorted(hits)


def test_jax_private_api_only_in_jax_internals():
    assert _grep("jax._src") == ["lazyxla.backend.jax_internals"]


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
    from lazyxla.backend.jax_internals import CHECKED_JAX
    assert jax.__version__ == CHECKED_JAX, "re-check lazyxla/backend/jax_internals.py against this JAX, then update CHECKED_JAX"


def test_a_changed_jax_internal_is_an_error_naming_the_module(monkeypatch):
    import pytest
    from jax._src import dispatch as jax_dispatch
    from lazyxla.backend.jax_internals import JaxInternalsChanged, kept_arguments, tupled_parameters
    monkeypatch.delattr(jax_dispatch, "should_tuple_args")
    with pytest.raises(JaxInternalsChanged, match=r"lazyxla\.backend\.jax_internals: jax\._src\.dispatch\.should_tuple_args"):
        with tupled_parameters(True):
            pass
    with pytest.raises(JaxInternalsChanged, match=r"lazyxla/backend/jax_internals\.py"):
        kept_arguments(object(), 3)
