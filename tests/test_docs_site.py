"""The manual (docs/, mkdocs.yml) as a site, and its reference pages against the code.

- ``mkdocs build --strict`` builds it once for the module: a broken link, anchor, nav entry or
  API reference (mkdocstrings) is an error, and so is a page left out of the nav;
- a real headless Chromium (tests/test_fold_page.py's client) opens the built home page once
  and checks that it renders with its navigation and its data-flow picture;
- the environment variables page lists exactly the variables the code reads, the counters
  page exactly the counters and metrics the code records, and the command-line page every
  command and option of ``lazyxla``'s parser, so none of them can drift from the code;
- the pictures are what ``docs/figures.py`` writes, and the README keeps CI's two set-up
  commands first and links only to files that exist.

Without mkdocs (the ``docs`` extra) or chromium the site tests skip, except under CI, where
they fail.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parent.parent
DOCS = CHECKOUT / "docs"
PACKAGE = CHECKOUT / "lazyxla"


def _need(what, why):
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing under CI: {why}")
    pytest.skip(f"{what} is not installed: {why}")


# ---------------------------------------------------------------------------------------
# the site
@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built by ``mkdocs build --strict`` into a temporary folder."""
    if importlib.util.find_spec("mkdocs") is None:
        _need("mkdocs", "pip install -e '.[docs]' (the test extra includes it)")
    out = tmp_path_factory.mktemp("site")
    t0 = time.monotonic()
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # Material's banner about its successor
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                       cwd=CHECKOUT, capture_output=True, text=True, timeout=600, env=env)
    warnings = "\n".join(ln for ln in r.stderr.splitlines() if not ln.startswith("INFO"))
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{warnings[-6000:]}"
    print(f"mkdocs build --strict: {time.monotonic() - t0:.1f} s")
    return out


def _nav_pages():
    import yaml

    class Loader(yaml.SafeLoader):
        pass
    Loader.add_multi_constructor("", lambda loader, suffix, node: None)  # mkdocs.yml's !!python tags, if any
    nav = yaml.load((CHECKOUT / "mkdocs.yml").read_text(), Loader=Loader)["nav"]
    pages = []

    def walk(items):
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            if isinstance(value, list):
                walk(value)
            else:
                pages.append(value)
    walk(nav)
    return pages


def test_every_page_is_in_the_nav_and_built(site):
    pages = _nav_pages()
    on_disk = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(pages) == on_disk, "docs/ pages and mkdocs.yml's nav differ"
    for page in pages:
        assert (site / page.replace(".md", ".html")).is_file(), page
    api = (site / "reference" / "api.html").read_text(encoding="utf-8")
    for name in ("lazyxla.sync", "lazyxla.compile", "lazyxla.scan_layers", "lazyxla.mark_dynamic"):
        assert f'id="{name}"' in api, f"{name} is not rendered from its docstring"


def test_the_site_renders_in_a_browser(site):
    from test_fold_page import CHROMIUM, Chromium
    if CHROMIUM is None:
        _need("chromium", "the site's browser test drives Debian's headless chromium (apt-get install chromium)")
    browser = Chromium(width=1280, height=900)
    try:
        browser.call("Page.navigate", session=True, url=(site / "index.html").as_uri())
        deadline = time.monotonic() + 30
        while not browser.js("document.readyState === 'complete' && "
                             "[...document.images].every(i => i.complete)"):
            assert time.monotonic() < deadline, "the home page did not load"
            time.sleep(0.05)
        page = browser.js("""(() => {
            const nav = document.querySelector('nav.md-nav--primary');
            const entries = nav ? [...nav.querySelectorAll('.md-nav__link')] : [];  // sections are labels
            const links = entries.filter(e => e.tagName === 'A');
            const img = document.querySelector('img[src$="dataflow.svg"]');
            const box = nav ? nav.getBoundingClientRect() : null;
            return {title: document.title, h1: (document.querySelector('h1') || {}).textContent,
                    entries: entries.map(e => e.textContent.trim()),
                    hrefs: links.map(a => a.getAttribute('href')),
                    navShown: !!box && box.width > 100 && box.height > 100,
                    img: img ? img.naturalWidth : -1,
                    code: document.querySelectorAll('.highlight pre').length};
        })()""")
    finally:
        browser.close()
    assert page["h1"].strip().startswith("lazyxla") and "lazyxla" in page["title"], page
    assert page["navShown"], "the navigation is not laid out on the page"
    for section in ("User's guide", "Reference", "Design", "Install", "On a TPU", "Environment variables"):
        assert section in page["entries"], (section, page["entries"])
    assert len([h for h in page["hrefs"] if h and h.endswith(".html")]) >= 25, page["hrefs"]
    assert page["img"] > 0, "the data-flow picture did not load"
    assert page["code"] >= 1, "no highlighted code block"


# ---------------------------------------------------------------------------------------
# reference pages against the code
def _table_names(page: Path, heading=None, pattern=r"[A-Za-z][\w]*"):
    """The backticked names in the first cell of each table row of ``page`` (under ``heading``,
    up to the next heading of its level, when given)."""
    text = page.read_text(encoding="utf-8")
    if heading is not None:
        start = text.index(heading)
        nxt = re.search(r"^#{1,%d} " % heading.count("#"), text[start + len(heading):], re.M)
        text = text[start:start + len(heading) + (nxt.start() if nxt else len(text))]
    names = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            names |= {n for n in re.findall(r"`([^`]+)`", first) if re.fullmatch(pattern, n)}
    return names


def _env_names_in_code():
    """Every variable an ``env_flag``, ``env_int`` or ``env_str`` call (``config``'s readers, or a
    module's ``_env_*`` around one) reads by a literal name, and every module constant
    ``ENV_* = "NAME"`` (variables read through one)."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if fn.lstrip("_") in ("env_flag", "env_int", "env_str"):
                    names.add(node.args[0].value)
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id.startswith("ENV_"):
                        names.add(node.value.value)
    return names


def test_the_environment_page_lists_what_the_code_reads():
    code = _env_names_in_code()
    assert {"XLA_COMPILATION_CACHE_SIZE", "LAZYXLA_ROLL_MIN", "XLA_PERSISTENT_CACHE_PATH"} <= code
    page = _table_names(DOCS / "reference" / "env.md", pattern=r"[A-Z][A-Z0-9_]+")
    assert sorted(code - page) == [], "read by the code, missing from docs/reference/env.md"
    assert sorted(page - code) == [], "on docs/reference/env.md, no longer read by the code"


COUNTER = [re.compile(r'counter_inc\(\s*"([A-Za-z]\w*)"'),
           re.compile(r'_?[cC][oO][uU][nN][tT][eE][rR][sS]\[\s*"([A-Za-z]\w*)"\s*\]'),  # COUNTERS["X"] = ...
           re.compile(r'stacks?\.stack(?:_pending)?\([^()]*,\s*"([A-Za-z]\w*)"\)')]     # stacks.stack(m, "X")
METRIC = [re.compile(r'(?:metric_add|metric_add_many|timed|pending_samples)\(\s*"([A-Za-z]\w*)"')]


def test_the_counters_page_lists_what_the_code_records():
    counters, metrics = set(), set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for r in COUNTER:
            counters |= set(r.findall(text))
        for r in METRIC:
            metrics |= set(r.findall(text))
    assert {"UncachedCompile", "CachedCompile", "MarkStep", "GraphReplay"} <= counters
    assert {"CompileTime", "ExecuteTime", "LazyTracing"} <= metrics
    page = DOCS / "reference" / "counters.md"
    on_page = _table_names(page, "## Counters"), _table_names(page, "## Metrics")
    for kind, code, listed in (("counter", counters, on_page[0]), ("metric", metrics, on_page[1])):
        assert sorted(code - listed) == [], f"{kind}s the code records, missing from {page.name}"
        assert sorted(listed - code) == [], f"{kind}s on {page.name} the code no longer records"


def test_the_command_line_page_has_every_command_and_option():
    import argparse

    from lazyxla.cli import SUBCOMMANDS
    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    for name, (add_arguments, _, _) in SUBCOMMANDS.items():
        assert f"## `lazyxla {name}`" in page, f"no section for lazyxla {name}"
        section = page.split(f"## `lazyxla {name}`", 1)[1].split("\n## ", 1)[0]
        p = argparse.ArgumentParser()
        add_arguments(p)
        for action in p._actions:
            for opt in action.option_strings:
                if opt not in ("-h", "--help"):
                    assert f"`{opt}" in section, f"lazyxla {name} {opt} is not on docs/reference/cli.md"
            for choice in action.choices or ():
                assert f"{choice}" in section, f"lazyxla {name}'s {choice} is not on docs/reference/cli.md"


# ---------------------------------------------------------------------------------------
def test_the_pictures_are_what_the_script_writes():
    spec = importlib.util.spec_from_file_location("docs_figures", DOCS / "figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    for rel, make in figures.FIGURES.items():
        assert (DOCS / rel).read_text(encoding="utf-8") == make(), f"docs/{rel}: run python docs/figures.py"


def test_the_readme_starts_with_the_two_set_up_commands_and_links_to_real_files():
    text = (CHECKOUT / "README.md").read_text(encoding="utf-8")
    first = text.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert first == ["python -m pip install -e . && lazyxla demo",
                     "python -m pip install -e '.[test]' && python -m pytest -q"], \
        ".ci/run runs the second line of the README's first bash block"
    assert "pip install -e '.[docs]' && mkdocs serve" in text
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links
    missing = [link for link in links if "://" not in link and not (CHECKOUT / link).exists()]
    assert missing == []
    assert len(text.splitlines()) <= 200
