"""The documentation site as a reader sees it: ``mkdocs build --strict``, then pages in headless Chromium.

Builds ``site/`` (a broken link, a missing snippet or a docstring griffe
cannot parse fails the build), serves it on 127.0.0.1, and opens the home
page, a tutorial, an API page and the benchmarks page in Debian's
``chromium`` through Selenium and ``chromedriver``. Each page must load with
no console error, every image must have loaded (``naturalWidth > 0``), and
API pages must hold rendered entries. Screenshots go to
``site/_screenshots/`` for review. Skipped, with the reason, where mkdocs
(the build) or Selenium/Chromium (the browser check) is not installed
(``make docs-setup`` installs them).
"""

from __future__ import annotations

import functools
import glob
import html
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SITE = os.path.join(ROOT, "site")
PAGES = ["", "tutorials/collectives/", "tutorials/mpi/", "reference/collectives/", "reference/context/", "benchmarks/",
         "architecture/", "contributing/"]

pytestmark = pytest.mark.timeout(300)


def _missing(modules: tuple, tools: tuple = ()) -> str:
    for module in modules:
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (pip install -e '.[docs]', or make docs-setup)"
    for tool in tools:
        if not shutil.which(tool):
            return f"{tool} is not installed (apt-get install chromium chromium-driver, or make docs-setup)"
    return ""


BUILD_NEEDS = ("mkdocs", "material", "mkdocstrings_handlers.python")


@pytest.fixture(scope="module")
def site():
    if _missing(BUILD_NEEDS):
        pytest.skip(_missing(BUILD_NEEDS))
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", SITE],
                         cwd=ROOT, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=SITE)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def browser(site):
    if _missing(("selenium",), ("chromium", "chromedriver")):
        pytest.skip(_missing(("selenium",), ("chromium", "chromedriver")))
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1600"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    yield driver
    driver.quit()


def test_site_builds_strict(site):
    """The build itself (in the fixture) is the check: --strict fails on any warning; here, what it made."""
    for page in PAGES:
        assert os.path.exists(os.path.join(SITE, page, "index.html")), page
    assert os.path.exists(os.path.join(SITE, "results", "bench_5_collectives_gloo_mpi.png"))


def _values(annotation: str) -> int:
    """How many values a rendered return annotation holds: the items of a fixed-length tuple, else one."""
    match = re.match(r"\s*[Tt]uple\[(.*)\]\s*$", annotation)
    if not match or "..." in match.group(1):
        return 1
    depth, values = 0, 1
    for char in match.group(1):
        depth += (char == "[") - (char == "]")
        values += char == "," and depth == 0
    return values


def _entries(page: str):
    """(object id, its HTML, its rendered signatures: overloads first, the implementation last) per API entry."""
    text = open(page, encoding="utf-8").read()
    for entry in re.split(r'(?=<h[2-6] id="polydist\.)', text)[1:]:
        signatures = [html.unescape(re.sub(r"<[^>]+>", "", s)).strip()
                      for s in re.findall(r'<div class="doc-signature highlight">(.*?)</div>', entry, re.S)]
        yield re.match(r'<h[2-6] id="([^"]+)"', entry).group(1), entry, signatures


def _returns_tables(page: str):
    """(object id, values its signature returns, rows of its Returns table) for each API entry of a built page."""
    for name, entry, signatures in _entries(page):
        table = re.search(r"Returns:</span></p>\s*<table>(.*?)</table>", entry, re.S)
        if table and signatures:
            yield name, _values(signatures[-1].rsplit("->", 1)[-1]), table.group(1).count('<tr class="doc-section-item">')


def test_returns_tables_have_one_row_per_returned_value(site):
    """A Returns section written as prose renders as one row, not one row per line (issue 32: all_reduce showed 7
    rows typed Any): no table has more rows than the function's return annotation has values."""
    pages = glob.glob(os.path.join(SITE, "reference", "*", "index.html"))
    tables = [table for page in pages for table in _returns_tables(page)]
    assert len(tables) >= 10, tables  # the check reads the site's markup: it must still find the tables
    assert [t for t in tables if t[2] > t[1]] == []
    assert ("polydist.all_reduce", 1, 1) in tables


def test_signatures_show_the_types_the_stubs_know(site):
    """Where a ``.pyi`` has overloads, the reference shows them, and the implementation's signature (annotated
    ``Any`` in the source) carries their types (docs/griffe_overloads.py), not a bare ``Any`` (issue 32)."""
    bare = re.compile(r"(?::|->)\s*Any\s*(?:[,=)]|$)")
    checked = []
    for name, _, signatures in _entries(os.path.join(SITE, "reference", "collectives", "index.html")):
        if len(signatures) > 1:
            checked.append(name.rsplit(".", 1)[-1])
            assert not bare.search(signatures[-1]) and "_G" not in signatures[0], signatures
    assert {"all_reduce", "broadcast", "all_gather", "scatter"} <= set(checked), checked


def test_no_sphinx_markup_shows(site):
    """Docstrings' Sphinx roles and literal-block ``::`` render as Markdown (docs/griffe_roles.py)."""
    for page in glob.glob(os.path.join(SITE, "reference", "*", "index.html")):
        text = open(page, encoding="utf-8").read()
        assert not re.search(r"::</p>|:(?:func|class|meth|mod|exc):`", text), page


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_without_errors(page, site, browser):
    browser.get(site + page)
    assert browser.title and "404" not in browser.title
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], f"console errors on /{page}: {errors}"
    broken = browser.execute_script(
        "return Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)")
    assert broken == [], f"images that did not load on /{page}: {broken}"
    if page.startswith("reference/"):
        entries = browser.execute_script("return document.querySelectorAll('.doc-object').length")
        assert entries >= 3, f"/{page} has {entries} rendered API entries"
        empty = browser.execute_script(
            "return Array.from(document.querySelectorAll('.doc-contents')).filter(d => !d.textContent.trim()).length")
        assert empty == 0, f"/{page} has {empty} empty API sections"
    if page.startswith("benchmarks"):
        assert browser.execute_script("return document.images.length") >= 1
    shots = os.path.join(SITE, "_screenshots")
    os.makedirs(shots, exist_ok=True)
    browser.save_screenshot(os.path.join(shots, (page.strip("/").replace("/", "_") or "home") + ".png"))
