"""The documentation site: what it says, and what a reader sees in a real browser.

``nox -s docs`` builds the site with ``mkdocs build --strict`` and runs this module
with ``STATEKEEPER_SITE_DIR`` (the built site) and ``STATEKEEPER_SITE_SCREENSHOTS``
(where the screenshots go). Run alone, it builds the site into a temporary directory.

The browser checks drive the system's headless Chromium (Debian's ``chromium``,
``/usr/bin/chromium``, or ``STATEKEEPER_CHROMIUM``) through Playwright; nothing is
downloaded at run time. Without Chromium they skip with the reason, except with
``STATEKEEPER_REQUIRE_SERVICES=1`` (CI), where that is a failure.
"""

from __future__ import annotations

import ast
import functools
import http.server
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REQUIRED = os.environ.get("STATEKEEPER_REQUIRE_SERVICES") == "1"
CHROMIUM = os.environ.get("STATEKEEPER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
GET_LATEST_ID = "statekeeper.BaseCheckpointStore.get_latest"


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"{reason} (STATEKEEPER_REQUIRE_SERVICES=1: the site checks must run)")
    pytest.skip(reason)


# -- what the pages say (no build needed) ---------------------------------------------------


def _first_console_block(path: Path) -> list[str]:
    # the fence may carry attributes for the site: ```console {.sk-commands}
    block = re.search(
        r"^```console(?: \{[^}\n]*\})?\n(.*?)^```", path.read_text("utf-8"), re.M | re.S
    )
    assert block is not None, f"{path.name} has no console block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_landing_page_shows_the_readme_commands_exactly() -> None:
    readme = _first_console_block(ROOT / "README.md")
    assert len(readme) == 2
    assert _first_console_block(DOCS / "index.md") == readme


def test_landing_page_example_is_about_thirty_lines() -> None:
    text = (DOCS / "index.md").read_text("utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)
    assert len(blocks) == 1
    assert 20 <= len(blocks[0].splitlines()) <= 40


def _defined(path: Path, names: list[str]) -> bool:
    """Whether ``Class::method`` (or ``function``, or ``Class``) is defined in ``path``."""
    body: list[ast.stmt] = ast.parse(path.read_text("utf-8")).body
    for name in names:
        found = [
            node
            for node in body
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name == name
        ]
        if not found:
            return False
        node = found[0]
        body = node.body if isinstance(node, ast.ClassDef) else []
    return True


def test_why_page_links_every_failure_mode_to_tests_that_exist() -> None:
    text = (DOCS / "why.md").read_text("utf-8")
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    node_ids = re.findall(r"`((?:src|tests)/[\w/.]+\.py(?:::\w+)*)`", text)
    assert len(node_ids) >= 20
    for node_id in node_ids:
        path, *names = node_id.split("::")
        assert (ROOT / path).is_file(), f"why.md names a missing file: {node_id}"
        assert _defined(ROOT / path, names), f"why.md names a missing test: {node_id}"
    for section in sections[:-1]:  # the last one points to the reliability page
        assert "`tests/" in section or "`src/statekeeper/testing/" in section, section[:60]
    # the kit's tests are run through a backend's subclass; the command must select them
    for command in re.findall(r"-k (\w+)", text):
        assert command in {n.split("::")[-1] for n in node_ids}


def _hooks_module(name: str) -> Any:
    """A module of docs/_hooks/ (the site's build hooks), imported from its file."""
    if importlib.util.find_spec("griffe") is None or importlib.util.find_spec("mkdocs") is None:
        _unavailable("the docs tooling is not installed: `uv sync --group docs`, or `nox -s docs`")
    sys.path.insert(0, str(DOCS / "_hooks"))  # mkdocs_hooks imports its neighbour
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(DOCS / "_hooks"))


def test_links_out_of_docs_become_repository_paths_and_broken_ones_stay(tmp_path: Path) -> None:
    on_page_markdown = _hooks_module("mkdocs_hooks").on_page_markdown
    page = types.SimpleNamespace(file=types.SimpleNamespace(abs_src_path=str(DOCS / "x.md")))
    config = {"docs_dir": str(DOCS), "config_file_path": str(ROOT / "mkdocs.yml")}
    markdown = (
        "[README.md](../README.md), [the pyproject](../pyproject.toml#L1), "
        "[gone](../NOPE.md), [a page](why.md), ![plot](benchmarks/get_latest.png)\n"
        "```console\n[README.md](../README.md)\n```\n"
    )
    assert on_page_markdown(markdown, page=page, config=config) == (
        "`README.md`, the pyproject (`pyproject.toml` in the repository), "
        "[gone](../NOPE.md), [a page](why.md), ![plot](benchmarks/get_latest.png)\n"
        "```console\n[README.md](../README.md)\n```\n"
    )


def test_the_doctest_marker_is_dropped_from_code_blocks_only() -> None:
    on_page_markdown = _hooks_module("mkdocs_hooks").on_page_markdown
    page = types.SimpleNamespace(file=types.SimpleNamespace(abs_src_path=str(DOCS / "x.md")))
    config = {"docs_dir": str(DOCS), "config_file_path": str(ROOT / "mkdocs.yml")}
    markdown = (
        "Prose may say # doctest: skip.\n"
        "```python\n# doctest: skip\nrun(graph)\n```\n"
        "```python\nx = 1  # doctest: skip is only a marker on a block's first line\n```\n"
    )
    assert on_page_markdown(markdown, page=page, config=config) == (
        "Prose may say # doctest: skip.\n"
        "```python\nrun(graph)\n```\n"
        "```python\nx = 1  # doctest: skip is only a marker on a block's first line\n```\n"
    )


# -- the built site --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("STATEKEEPER_SITE_DIR")
    if given:
        site = Path(given)
        assert (site / "index.html").is_file(), f"STATEKEEPER_SITE_DIR={given} is not a built site"
        return site
    if importlib.util.find_spec("mkdocs") is None:
        _unavailable("mkdocs is not installed: `uv sync --group docs`, or run `nox -s docs`")
    site = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    return site


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("STATEKEEPER_SITE_SCREENSHOTS")
    out = Path(given) if given else tmp_path_factory.mktemp("screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _pages(site: Path) -> list[str]:
    pages = sorted(p.parent.relative_to(site).as_posix() for p in site.rglob("index.html"))
    return ["" if p == "." else f"{p}/" for p in pages]


def test_the_site_has_every_page(site: Path) -> None:
    pages = set(_pages(site))
    for page in DOCS.glob("*.md"):
        assert ("" if page.stem == "index" else f"{page.stem}/") in pages, page.name
    for page in (DOCS / "reference").glob("*.md"):
        want = "reference/" if page.stem == "index" else f"reference/{page.stem}/"
        assert want in pages, page.name
    for plot in (DOCS / "benchmarks").glob("*.png"):
        assert (site / "benchmarks" / plot.name).is_file(), plot.name


def test_every_public_name_has_a_reference_entry(site: Path) -> None:
    reference_modules = _hooks_module("griffe_statekeeper").REFERENCE_MODULES
    html = "\n".join(p.read_text("utf-8") for p in (site / "reference").rglob("index.html"))
    anchors = set(re.findall(r'id="([\w.]+)"', html))
    missing = []
    for module_name in reference_modules:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            if f"{module_name}.{name}" not in anchors:
                missing.append(f"{module_name}.{name}")
    assert not missing, f"exported but not in the API reference: {missing}"
    assert GET_LATEST_ID in anchors


def test_reference_shows_the_docstrings_translated_from_rest(site: Path) -> None:
    pages = {p.parent.name: p.read_text("utf-8") for p in (site / "reference").rglob("index.html")}
    for name, html in pages.items():
        assert not re.search(r":(class|meth|func|attr|mod|exc|data):`", html), name
    # ":class:`PreconditionFailed`" in BaseCheckpointStore.save links to its entry
    assert re.search(
        r'href="\.\./errors/#statekeeper\.errors\.PreconditionFailed"', pages["statekeeper"]
    )
    # "#:" comments above an option are its documentation
    assert "Seconds to wait for a lock held by another writer" in pages["backends"]
    # the blocking facade points at the method that states the contract
    assert "Blocking form of" in pages["sync"]


def test_no_page_shows_the_doctest_marker(site: Path) -> None:
    # the marker tells tests/test_docs.py not to run a block; readers never see it
    shown = [
        page.relative_to(site).as_posix()
        for page in site.rglob("*.html")
        if "doctest" in page.read_text("utf-8")
    ]
    assert not shown, f"pages that show the doctest marker: {shown}"
    assert "doctest" not in (site / "search" / "search_index.json").read_text("utf-8")


def _search_entries(site: Path) -> dict[str, str]:
    index = json.loads((site / "search" / "search_index.json").read_text("utf-8"))
    return {entry["location"]: entry["text"] for entry in index["docs"]}


def _doc_text(html: str) -> str:
    """An entry's rendered documentation without its signature block."""
    return re.sub(r"^<pre><code>.*?</code></pre>\s*", "", html, count=1, flags=re.S).strip()


def test_protocol_reference_states_each_methods_contract(site: Path) -> None:
    from statekeeper import CheckpointStore

    entries = _search_entries(site)
    names = [n for n, v in vars(CheckpointStore).items() if not n.startswith("_") and callable(v)]
    assert {"get_latest", "load", "list", "save", "update"} <= set(names)
    page = "reference/statekeeper/#statekeeper."
    for name in names:
        protocol = _doc_text(entries[f"{page}CheckpointStore.{name}"])
        base = _doc_text(entries[f"{page}BaseCheckpointStore.{name}"])
        assert "Same contract as" not in protocol, name
        assert protocol == base, f"CheckpointStore.{name} does not carry the contract"
    get_latest = _doc_text(entries[f"{page}CheckpointStore.get_latest"])
    assert "Strict" in get_latest and "CheckpointDecodeError" in get_latest
    assert "ConcurrentModificationError" in get_latest
    listing = _doc_text(entries[f"{page}CheckpointStore.list"])
    assert "Tolerant" in listing and "page.skipped" in listing


# -- in a browser ----------------------------------------------------------------------------


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def base_url(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="site-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


NO_CHROMIUM = (
    "no Chromium at {path}, so the site was not checked in a browser and no screenshots "
    "were taken. Install it (Debian, Ubuntu: `sudo apt-get install chromium`; elsewhere "
    "set STATEKEEPER_CHROMIUM to a Chromium or Chrome binary) and run `nox -s docs` again."
)


@pytest.fixture(scope="module")
def browser(request: pytest.FixtureRequest, screenshots: Path) -> Iterator[Any]:
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        reason = NO_CHROMIUM.format(path=CHROMIUM)
        # `nox -s docs` names the screenshots folder at its end: say there why it is empty
        (screenshots / "NO-SCREENSHOTS.txt").write_text(reason + "\n", "utf-8")
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"\n{reason}", yellow=True)
        _unavailable(reason)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed: `uv sync --group docs`, or `nox -s docs`")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class _Watch:
    """Console errors, page errors, failed requests and 4xx/5xx responses of one page."""

    def __init__(self, page: Any, base_url: str) -> None:
        self.problems: list[str] = []
        self.base_url = base_url
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))
        page.on("requestfailed", self._failed)
        page.on("response", self._response)
        # the site must work with no network: anything off this server is a finding
        page.route(re.compile(r"^(?!" + re.escape(base_url) + ")"), self._external)

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.problems.append(f"console error: {message.text} at {message.location}")

    def _failed(self, request: Any) -> None:
        # the browser cancels what the next navigation makes moot (the favicon of a
        # page left at once): not the site's failure; a missing file is a 404 above
        if request.failure == "net::ERR_ABORTED":
            return
        self.problems.append(f"request failed: {request.url} ({request.failure})")

    def _response(self, response: Any) -> None:
        if response.status >= 400:
            self.problems.append(f"HTTP {response.status}: {response.url}")

    def _external(self, route: Any) -> None:
        if route.request.url.startswith("data:"):
            route.continue_()
            return
        self.problems.append(f"external request: {route.request.url}")
        route.abort()


@pytest.fixture
def page(browser: Any, base_url: str) -> Iterator[tuple[Any, _Watch]]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    # every wait is for an event (a load, an element); 120 s only fails on a hang, and a
    # browser on a loaded machine can take longer than Playwright's 30 s default
    context.set_default_timeout(120_000)
    page = context.new_page()
    try:
        yield page, _Watch(page, base_url)
    finally:
        context.close()


def _report(capsys: pytest.CaptureFixture[str], message: str) -> None:
    with capsys.disabled():
        print(f"\n{message}")


def test_landing_page_renders_its_code_blocks(
    page: tuple[Any, _Watch], base_url: str, screenshots: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tab, watch = page
    tab.goto(base_url, wait_until="networkidle")
    blocks = tab.locator("article pre code")
    assert blocks.count() == 2
    commands = blocks.nth(0)
    assert commands.is_visible()
    assert commands.inner_text().split("\n")[:2] == _first_console_block(ROOT / "README.md")
    example = blocks.nth(1)
    assert example.is_visible()
    text = example.inner_text()
    assert "await store.get_latest(job)" in text and "asyncio.run(main())" in text
    box = example.bounding_box()
    assert box is not None and box["height"] > 300, "the example is not laid out as a block"
    # highlighted: Pygments wrapped keywords in their own spans
    assert example.locator("span.k, span.kn").count() > 5
    shot = screenshots / "landing.png"
    tab.screenshot(path=str(shot), full_page=True)
    _report(capsys, f"screenshot of the landing page: {shot}")
    assert not watch.problems, watch.problems


def test_search_finds_get_latest_and_opens_its_reference_entry(
    page: tuple[Any, _Watch], base_url: str, screenshots: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tab, watch = page
    tab.goto(base_url, wait_until="networkidle")
    search = tab.locator("input.md-search__input")
    search.click()  # in the header at desktop width
    # typed key by key: the search reacts to keyboard input, as for a reader
    search.press_sequentially("get_latest", delay=30)
    result = tab.locator(f"a.md-search-result__link[href*='#{GET_LATEST_ID}']").first
    result.wait_for(state="attached")
    if not result.is_visible():  # among the "more on this page" results of its page
        result.locator("xpath=ancestor::details[1]/summary").click()
    result.click()
    entry_url = r"/reference/statekeeper/(\?h=[^#]*)?#" + re.escape(GET_LATEST_ID) + "$"
    tab.wait_for_url(re.compile(entry_url))
    entry = tab.locator(f"[id='{GET_LATEST_ID}']")
    entry.wait_for(state="visible")
    assert "get_latest" in entry.inner_text()
    assert entry.evaluate("e => e.getBoundingClientRect().top") < 300, "not scrolled to it"
    body = entry.locator("xpath=ancestor::div[contains(@class, 'doc-object')][1]").inner_text()
    assert "get_latest(stream: str) -> Checkpoint | None" in body
    assert "never returns an older one" in body, "the docstring is not rendered"
    shot = screenshots / "get_latest-reference.png"
    tab.screenshot(path=str(shot))
    _report(capsys, f"screenshot of the get_latest reference: {shot}")
    assert not watch.problems, watch.problems


def test_every_page_loads_without_errors(
    page: tuple[Any, _Watch], base_url: str, site: Path
) -> None:
    tab, watch = page
    pages = _pages(site)
    assert len(pages) >= 14
    images = 0
    for path in pages:
        tab.goto(base_url + path, wait_until="networkidle")
        assert tab.locator("article h1").count() >= 1, f"{path} has no title"
        for image in tab.locator("article img").all():
            image.scroll_into_view_if_needed()
            loaded = image.evaluate("i => i.complete && i.naturalWidth > 0")
            assert loaded, f"{path}: image {image.get_attribute('src')} did not load"
            images += 1
    assert images >= 3, "the benchmark plots are not on the site"
    assert not watch.problems, "\n".join(watch.problems)


def test_without_chromium_the_run_says_how_to_install_it(site: Path, tmp_path: Path) -> None:
    # `nox -s docs` names the screenshots folder at its end: without Chromium that
    # folder must exist and say why it is empty, and the run must say how to fix it
    shots = tmp_path / "screenshots"
    landing = "test_landing_page_renders_its_code_blocks"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-p", "no:cacheprovider", "-q", "-k", landing],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "STATEKEEPER_SITE_DIR": str(site),
            "STATEKEEPER_SITE_SCREENSHOTS": str(shots),
            "STATEKEEPER_CHROMIUM": str(tmp_path / "no-chromium"),
            "STATEKEEPER_REQUIRE_SERVICES": "0",
        },
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 skipped" in run.stdout
    assert "apt-get install chromium" in run.stdout, run.stdout
    notes = [f.read_text("utf-8") for f in shots.glob("*")] if shots.is_dir() else []
    assert any("apt-get install chromium" in note for note in notes), notes


@pytest.mark.parametrize("width", [1280, 390], ids=["desktop", "phone"])
def test_landing_page_commands_fit_the_column_and_clear_the_copy_button(
    browser: Any, base_url: str, screenshots: Path, width: int
) -> None:
    context = browser.new_context(viewport={"width": width, "height": 900})
    try:
        tab = context.new_page()
        tab.goto(base_url, wait_until="networkidle")
        block = tab.locator("article pre").first
        block.scroll_into_view_if_needed()
        block.hover()  # where a reader reaches for the copy button
        code = block.locator("code")
        readme = _first_console_block(ROOT / "README.md")
        assert code.inner_text().split("\n")[:2] == readme
        # what the copy button copies: two whole lines, however they wrap on screen
        assert code.evaluate("c => c.textContent").splitlines() == readme
        scroll, client = code.evaluate("c => [c.scrollWidth, c.clientWidth]")
        assert scroll <= client, f"the commands are {scroll}px wide in a {client}px column"
        button = block.locator("button[data-clipboard-target]")  # the copy button
        assert button.count() == 1
        covered = button.evaluate(
            """b => {
                const r = b.getBoundingClientRect(), code = b.closest('pre').querySelector('code');
                const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
                const hidden = [];
                for (let n = walker.nextNode(); n; n = walker.nextNode()) {
                    for (let i = 0; i < n.length; i++) {
                        const range = document.createRange();
                        range.setStart(n, i); range.setEnd(n, i + 1);
                        for (const c of range.getClientRects()) {
                            if (c.width && n.data[i].trim() && c.right > r.left && c.left < r.right
                                && c.bottom > r.top && c.top < r.bottom) hidden.push(n.data[i]);
                        }
                    }
                }
                return hidden.join('');
            }"""
        )
        assert not covered, f"the copy button covers {covered!r}"
        broken = code.evaluate(
            r"""c => {
                // words split across lines (`--` / `frozen`): a reader could not retype them
                const tops = [];
                const walker = document.createTreeWalker(c, NodeFilter.SHOW_TEXT);
                for (let n = walker.nextNode(); n; n = walker.nextNode()) {
                    for (let i = 0; i < n.length; i++) {
                        const range = document.createRange();
                        range.setStart(n, i); range.setEnd(n, i + 1);
                        const rect = range.getClientRects()[0];
                        tops.push([n.data[i], rect ? Math.round(rect.top) : null]);
                    }
                }
                const broken = [];
                let word = '', top = null, split = false;
                for (const [ch, t] of tops.concat([[' ', null]])) {
                    if (/\s/.test(ch)) {
                        if (split) broken.push(word);
                        word = ''; top = null; split = false;
                    } else {
                        if (top !== null && t !== top) split = true;
                        word += ch; top = t;
                    }
                }
                return broken;
            }"""
        )
        assert not broken, f"words broken across lines: {broken}"
        tab.screenshot(path=str(screenshots / f"landing-commands-{width}.png"))
    finally:
        context.close()
