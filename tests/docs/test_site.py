"""The documentation site as a reader sees it: ``mkdocs build --strict``, every page read as text, and in Chromium.

Builds ``site/`` (a broken link, a missing snippet or a docstring griffe
cannot parse fails the build) and reads every page it made (one per Markdown
file of ``docs/``) the way a user would: no markup that failed to render
(``--8<--``, ``:::``, Sphinx roles, a list item's ``- **`` run or a code line
left in a paragraph), no tracker reference, no table with an empty header
row, and API signatures that fit a screen line, one per function, with no
private names. Then it serves the site on 127.0.0.1 and opens every page in
Debian's ``chromium`` through Selenium and ``chromedriver`` at 1280 x 1600:
no console error, every image loaded, no code block cut off where the reader
cannot tell (outside Python listings, none may be wider than the page; in
them, no comment may run past the edge), and a screenshot of each page in
``build/docs-screenshots/`` (outside ``site/``, which is what gets
published). Skipped, with the reason, where mkdocs (the build) or
Selenium/Chromium (the browser check) is not installed (``make docs-setup``
installs them).
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
from html.parser import HTMLParser

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# POLYDIST_DOCS_SITE=DIR: check a site built before (e.g. an older commit's) instead of building one.
SITE = os.environ.get("POLYDIST_DOCS_SITE") or os.path.join(ROOT, "site")
SHOTS = os.path.join(ROOT, "build", "docs-screenshots")


def _pages() -> list:
    """The URL of every page the site has: one per Markdown file of docs/ (``howto/xla.md``: ``howto/xla/``)."""
    docs = os.path.join(ROOT, "docs")
    paths = sorted(os.path.relpath(p, docs) for p in glob.glob(os.path.join(docs, "**", "*.md"), recursive=True))
    return ["" if p == "index.md" else p[:-len(".md")] + "/" for p in paths]


PAGES = _pages()

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
    if not os.environ.get("POLYDIST_DOCS_SITE"):
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
    """Where a ``.pyi`` has overloads, the reference shows one signature, typed with the overloads' types (not a
    bare ``Any``), and the overloads as a table of accepted and returned types (docs/griffe_overloads.py)."""
    bare = re.compile(r"(?::|->)\s*Any\s*(?:[,=)]|$)")
    tabled = []
    for name, entry, signatures in _entries(os.path.join(SITE, "reference", "collectives", "index.html")):
        if "Accepted and returned types" in entry:
            tabled.append(name.rsplit(".", 1)[-1])
            assert len(signatures) == 1 and not bare.search(signatures[0]), signatures
    assert {"all_reduce", "broadcast", "all_gather", "scatter"} <= set(tabled), tabled


def test_the_types_tables_say_what_each_row_returns(site):
    """all_reduce's table of accepted and returned types: no row returns a bare ``Any``, and no two rows accept
    the same types yet return different ones (an int with SUM is an int; with any other op, int or float)."""
    entries = {name: entry for name, entry, _ in _entries(os.path.join(SITE, "reference", "collectives", "index.html"))}
    for name in ("polydist.all_reduce", "polydist.reduce"):
        table = re.search(r"Accepted and returned types:</p>\s*<table>(.*?)</table>", entries[name], re.S)
        assert table, name
        rows = [[html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td>(.*?)</td>", r, re.S)]
                for r in re.findall(r"<tr>(.*?)</tr>", table.group(1), re.S)]
        rows = [r for r in rows if r]
        assert len(rows) >= 8, (name, rows)
        assert [r for r in rows if r[-1] == "Any"] == [], (name, rows)
        accepted = [tuple(r[:-1]) for r in rows]
        assert len(set(accepted)) == len(accepted), (name, rows)
        assert any(c.startswith("any other") for r in rows for c in r), (name, rows)


def _page_file(page: str) -> str:
    return os.path.join(SITE, page, "index.html")


class _Prose(HTMLParser):
    """The text of a page as read, split into the paragraphs and table headers it renders, code left out."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs, self.headers, self.text = [], [], []
        self._code = self._skip = 0
        self._p = self._th = None

    def handle_starttag(self, tag, attrs):
        self._code += tag in ("pre", "code")
        self._skip += tag in ("script", "style")
        if tag == "p":
            self._p = []
        elif tag == "thead":
            self.headers.append([])
        elif tag == "th":
            self._th = []

    def handle_endtag(self, tag):
        self._code -= tag in ("pre", "code") and self._code > 0
        self._skip -= tag in ("script", "style") and self._skip > 0
        if tag == "p" and self._p is not None:
            self.paragraphs.append("".join(self._p))
            self._p = None
        elif tag == "th" and self._th is not None and self.headers:
            self.headers[-1].append("".join(self._th).strip())
            self._th = None

    def handle_data(self, data):
        if self._skip:
            return
        self.text.append(data)
        if self._p is not None and not self._code:
            self._p.append(data)
        if self._th is not None:
            self._th.append(data)


def _read(page: str) -> _Prose:
    prose = _Prose()
    prose.feed(open(_page_file(page), encoding="utf-8").read())
    return prose


# Markup that did not render, as it shows in a paragraph: a snippet include, a mkdocstrings directive, a Sphinx
# role or literal-block marker, a Markdown list or bold run left as text, a code line outside a code block.
LEAKS = {
    "snippet include": re.compile(r"--8<--"),
    "mkdocstrings directive": re.compile(r"^:::", re.M),
    "Sphinx role": re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj|py:\w+):`"),
    "Sphinx literal block": re.compile(r"\S::\s*$"),
    "raw list item": re.compile(r"\n\s*[-*] (?:\*\*|\S)"),
    "raw bold": re.compile(r"\*\*\w"),
    "code line": re.compile(r"(?:^|\n)\s*(?:def \w+\(|class \w+[(:]|import \w|from [\w.]+ import \w|@\w+\()"),
}
# What only the project's tracker knows: users cannot look these up.
TRACKER = re.compile(r"\bissues? ?#?\d+|\bissue-\d+|\bthe issue\b|\bissue's\b|\bseeds? \d{3}\b", re.I)


def test_no_markup_leaks_into_the_prose(site):
    leaks = [(page or "home", what, m.group(0)) for page in PAGES for para in _read(page).paragraphs
             for what, pattern in LEAKS.items() for m in [pattern.search(para)] if m]
    assert leaks == []


def test_no_tracker_references_on_the_site(site):
    found = [(page or "home", m.group(0)) for page in PAGES for m in TRACKER.finditer("".join(_read(page).text))]
    assert found == []


@pytest.mark.parametrize("path", ["README.md", "docs"])
def test_no_tracker_references_in_the_sources(path):
    """The Markdown itself too, README.md included (GitHub shows it), and the examples the pages include."""
    files = [os.path.join(ROOT, path)] if path.endswith(".md") else sorted(
        glob.glob(os.path.join(ROOT, path, "**", "*.md"), recursive=True))
    found = [(os.path.relpath(f, ROOT), m.group(0)) for f in files
             for m in TRACKER.finditer(open(f, encoding="utf-8").read())]
    assert files and found == []


def test_readme_links_every_guide_page():
    """README.md's documentation list (what GitHub shows) links every page of docs/ but the API reference's."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    guides = [page for page in PAGES if page and not page.startswith("reference/")]
    assert len(guides) >= 20 and [p for p in guides if f"](docs/{p.rstrip('/')}.md)" not in readme] == []


def test_tables_have_a_header(site):
    empty = [page or "home" for page in PAGES for header in _read(page).headers if not any(header)]
    assert empty == []


SCREEN_LINE = 80  # characters: what the reference's column shows at 1280 px without scrolling


def test_api_signatures_are_one_per_entry_and_fit_a_line(site):
    problems, count = [], 0
    for page in glob.glob(os.path.join(SITE, "reference", "*", "index.html")):
        for name, _, signatures in _entries(page):
            count += len(signatures)
            if len(signatures) > 1:
                problems.append((name, f"{len(signatures)} signatures"))
            for line in "\n".join(signatures).splitlines():
                if len(line) > SCREEN_LINE:
                    problems.append((name, f"{len(line)} characters: {line[:60]}..."))
                if re.search(r"\b_[A-Za-z]\w*\b", line) or re.search(r"\b(?:Union|Optional)\[", line):
                    problems.append((name, line.strip()))
    assert count >= 50 and problems == []


def test_no_sphinx_markup_shows(site):
    """Docstrings' Sphinx roles and literal-block ``::`` render as Markdown (docs/griffe_roles.py)."""
    for page in glob.glob(os.path.join(SITE, "reference", "*", "index.html")):
        text = open(page, encoding="utf-8").read()
        assert not re.search(r"::</p>|:(?:func|class|meth|mod|exc):`", text), page


# Code blocks wider than the page at the default width: in a Python listing (an example's code) the scrollbar
# is the affordance, but a comment must not run past the edge; any other block (commands, output, diagrams)
# must fit, as a reader does not expect to scroll it.
CUT_OFF = """
return Array.from(document.querySelectorAll('.md-content pre > code')).flatMap(code => {
  if (code.scrollWidth <= code.clientWidth + 1) return [];
  const edge = code.getBoundingClientRect().right;
  const python = code.closest('.language-python, .language-py') !== null;
  const cut = python ? Array.from(code.querySelectorAll('.c1, .c')).filter(c => c.getBoundingClientRect().right > edge + 1)
                     : [code];
  return cut.map(c => c.textContent.split('\\n').reduce((a, b) => b.length > a.length ? b : a, '').slice(0, 80));
});
"""


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_without_errors(page, site, browser):
    browser.get(site + page)
    assert browser.title and "404" not in browser.title
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], f"console errors on /{page}: {errors}"
    broken = browser.execute_script(
        "return Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)")
    assert broken == [], f"images that did not load on /{page}: {broken}"
    assert os.path.relpath(SHOTS, SITE).startswith(os.pardir), "screenshots are not published with the site"
    os.makedirs(SHOTS, exist_ok=True)
    browser.save_screenshot(os.path.join(SHOTS, (page.strip("/").replace("/", "_") or "home") + ".png"))
    if page.startswith("reference/"):
        entries = browser.execute_script("return document.querySelectorAll('.doc-object').length")
        assert entries >= 3, f"/{page} has {entries} rendered API entries"
        empty = browser.execute_script(
            "return Array.from(document.querySelectorAll('.doc-contents')).filter(d => !d.textContent.trim()).length")
        assert empty == 0, f"/{page} has {empty} empty API sections"
    if page.startswith("benchmarks"):
        assert browser.execute_script("return document.images.length") >= 1
    assert browser.execute_script(CUT_OFF) == [], f"code cut off at the page's edge on /{page}"
