"""The course website (`make site`) and its kernel-free explorer, read in Chromium with the network blocked.

The fast tests check the pieces (notebook preparation, the syllabus page, the explorer's data
encoding). The slow ones build the site once (Sphinx, committed outputs, nothing executed), serve it
on the loopback interface, and open every page in Chromium (``helpers.find_browser``) through Playwright with every
request that is not to the local server aborted and recorded: no request may fail, no console
error, every image loaded, math typeset by the site's own MathJax, search answering; then the
explorer page, over HTTP and as a local file, redraws when each control changes.
"""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import nbformat
import pytest
import torch
from helpers import NOTEBOOKS, browser_or_skip

from selfattn_lite.course import badges, explorer_data, site

PAGE_S = 60
TABS = 6                 # pages loading at once


# --------------------------------------------------------------------------- fast: the pieces


def test_prepared_notebook_loads_nothing_remote_and_keeps_outputs():
    nb = nbformat.v4.new_notebook(metadata={"widgets": {"state": {}}})
    nb.cells = [nbformat.v4.new_markdown_cell("# 01 · T\n" + badges.badge_line("01_t.ipynb")),
                nbformat.v4.new_code_cell("w", outputs=[nbformat.v4.new_output(
                    "display_data", data={site.WIDGET: {"model_id": "x"}, "text/plain": "VBox()"})]),
                nbformat.v4.new_code_cell("x", outputs=[nbformat.v4.new_output(
                    "display_data", data={"image/png": "iVBORw0KGgo="})])]
    out = site.prepare_notebook(nb)
    assert "widgets" not in out.metadata
    assert "badge" not in out.cells[0].source and badges.binder_url("01_t.ipynb") in out.cells[0].source
    assert out.cells[1].outputs[0].data == {"text/html": site.WIDGET_NOTE}
    assert out.cells[2].outputs == nb.cells[2].outputs


def test_home_page_lists_every_notebook_with_its_time():
    infos = [site.notebook_info(p) for p in NOTEBOOKS]
    page = site.index_page(infos)
    for info in infos:
        assert f"notebooks/{info['stem']}" in page and info["time"], info
        assert info["title"].startswith(f"{info['number']:02d} · ")
    assert "explorer" in page


@pytest.mark.parametrize("is_causal", [False, True])
def test_explorer_weights_survive_the_byte_encoding(is_causal):
    w = torch.softmax(torch.randn(2, 3, 7, 7), dim=-1)
    if is_causal:
        w = torch.softmax(torch.randn(2, 3, 7, 7).masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(),
                                                              float("-inf")), dim=-1)
    data = explorer_data.quantize(w, is_causal)
    torch.testing.assert_close(explorer_data.dequantize(data, tuple(w.shape), is_causal), w, atol=1 / 510, rtol=0)
    assert len(data) < (2 * 3 * 7 * 7) * 4 / 3 + 4
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        explorer_data.quantize(w - 1)


# --------------------------------------------------------------------------- slow: built and read


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    index = site.build(out)
    return index.parent


@pytest.fixture(scope="module")
def server(built):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(built))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    executable = browser_or_skip()                     # before Playwright starts: it may ask Playwright itself
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable, args=["--no-sandbox"], headless=True)
        yield chromium
        chromium.close()


class Offline:
    """A page whose every non-local request is aborted and recorded, with its errors collected."""

    def __init__(self, browser, local: str):
        self.page = browser.new_page(viewport={"width": 1300, "height": 900})
        self.blocked, self.failed, self.errors = [], [], []
        self.page.route("**/*", self._route)
        self.page.on("requestfailed", lambda r: self.failed.append(f"{r.url} ({r.failure})"))
        self.page.on("response", lambda r: self.failed.append(f"{r.url} (HTTP {r.status})") if r.status >= 400 else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        self.local = local

    def _route(self, route):
        url = route.request.url
        if url.startswith(self.local) or url.startswith("data:") or url.startswith("blob:"):
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort()

    def check(self, where: str):
        assert not self.blocked, f"{where}: requests to the network: {self.blocked}"
        assert not self.failed, f"{where}: failed requests: {self.failed}"
        assert not self.errors, f"{where}: console errors: {self.errors}"


def _pages(html: Path) -> list[str]:
    return sorted(str(p.relative_to(html)) for p in html.rglob("*.html") if "_static" not in p.parts
                  and "_sources" not in p.parts)


@pytest.mark.slow
def test_every_page_reads_offline(built, server, browser):
    pages = _pages(built)
    assert {f"notebooks/{p.stem}.html" for p in NOTEBOOKS} <= set(pages) and "explorer.html" in pages
    with_math = 0
    for batch in range(0, len(pages), TABS):            # a few tabs load at once; each is then checked alone
        tabs = {name: Offline(browser, server) for name in pages[batch:batch + TABS]}
        for name, tab in tabs.items():
            tab.page.goto(f"{server}/{name}", wait_until="commit", timeout=PAGE_S * 1000)
        for name, tab in tabs.items():
            with_math += _check_page(tab, name)
    assert with_math >= 3, "MathJax was checked on fewer than 3 pages: is the math rendered as math?"


def _check_page(tab: Offline, name: str) -> bool:
    """Everything one page must do offline; True when it has math (typeset by MathJax)."""
    page = tab.page
    page.wait_for_load_state("load", timeout=PAGE_S * 1000)
    has_math = page.locator("div.math, span.math").count() > 0
    if has_math:   # MathJax (served by the site) typesets every formula, with no error node
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                               timeout=PAGE_S * 1000)
        page.evaluate("() => MathJax.startup.promise")
        assert page.locator("mjx-container").count() >= page.locator("div.math, span.math").count(), name
        assert page.locator("mjx-merror, merror").count() == 0, f"{name}: MathJax could not typeset a formula"
    images = page.evaluate("""async () => {
        const imgs = Array.from(document.images);
        imgs.forEach(i => { i.loading = "eager"; });
        await Promise.all(imgs.map(i => i.decode().catch(() => null)));
        return imgs.map(i => [i.currentSrc || i.src, i.complete && i.naturalWidth > 0]);
    }""")
    broken = [src for src, ok in images if not ok]
    assert not broken, f"{name}: images not loaded: {broken}"
    if name.startswith("notebooks/"):
        assert images, f"{name}: a notebook page without a figure"
    tab.check(name)
    page.close()
    return has_math


@pytest.mark.slow
def test_search_answers_offline(built, server, browser):
    tab = Offline(browser, server)
    tab.page.goto(f"{server}/search.html?q=softmax", timeout=PAGE_S * 1000)
    results = tab.page.locator("#search-results ul.search li")
    results.first.wait_for(timeout=PAGE_S * 1000)
    assert results.count() >= 3
    tab.check("search.html")


HEATMAP_JS = "() => document.querySelector('#selfattn-explorer canvas.sae-heatmap').toDataURL()"


def _state(page):
    return (page.evaluate(HEATMAP_JS), page.locator("#selfattn-explorer .sae-top").inner_text(),
            page.evaluate("() => Array.from(document.querySelectorAll('.sae-grid canvas')).map(c => c.toDataURL())"
                          ".join('')"))


def _exercise_explorer(page):
    page.locator("#selfattn-explorer canvas.sae-heatmap").wait_for(timeout=PAGE_S * 1000)
    seen = [_state(page)]
    for control in ("layer", "head", "query", "sentence", "model"):
        select = page.locator(f"#sae-{control}")
        values = select.locator("option").evaluate_all("os => os.map(o => o.value)")
        current = select.input_value()
        select.select_option(next(v for v in values if v != current))
        state = _state(page)
        assert state[0] != seen[-1][0], f"changing the {control} did not redraw the heatmap"
        if control in ("layer", "sentence", "model"):
            assert state[2] != seen[-1][2], f"changing the {control} did not redraw the head grid"
        if control in ("query", "sentence", "model"):
            assert state[1] != seen[-1][1], f"changing the {control} did not change the top keys"
        seen.append(state)
    # clicking a head in the grid selects it
    before = page.locator("#sae-head").input_value()
    other = page.locator(".sae-thumb:not(.sae-selected)").first
    other.click()
    assert page.locator("#sae-head").input_value() != before
    assert _state(page)[0] != seen[-1][0]
    # the decoder is causal: the top keys of a query never lie after it
    assert page.locator("#sae-model").input_value() == "decoder"
    q = int(page.locator("#sae-query").input_value())
    keys = [int(line.split(":")[0]) for line in page.locator(".sae-top li").all_inner_texts()]
    assert keys and all(k <= q for k in keys), (q, keys)


@pytest.mark.slow
def test_explorer_redraws_on_every_control(built, server, browser):
    tab = Offline(browser, server)
    tab.page.goto(f"{server}/explorer.html", timeout=PAGE_S * 1000)
    _exercise_explorer(tab.page)
    tab.check("explorer.html")


@pytest.mark.slow
def test_explorer_works_as_a_local_file(built, browser):
    tab = Offline(browser, "file://")
    tab.page.goto((built / "explorer.html").as_uri(), timeout=PAGE_S * 1000)
    _exercise_explorer(tab.page)
    tab.check("explorer.html as a file")


@pytest.mark.slow
def test_explorer_data_matches_the_models(built):
    import json

    from selfattn_lite.explore import explore, explore_decoder

    data = json.loads((built / "_static" / "explorer_data.json").read_text())
    assert data["sentences"] == list(explorer_data.SENTENCES)
    minilm, decoder = data["models"]["minilm"], data["models"]["decoder"]
    for i in (0, len(data["sentences"]) - 1):
        for entry, maps, causal in ((minilm["items"][i], explore(data["sentences"][i]), False),
                                    (decoder["items"][i], explore_decoder(data["sentences"][i]), True)):
            assert entry["tokens"] == maps.tokens
            got = explorer_data.dequantize(entry["weights"], tuple(maps.weights.shape), causal)
            torch.testing.assert_close(got, maps.weights, atol=1 / 510 + 1e-6, rtol=0)
    assert (built / "_static" / "explorer_data.json").stat().st_size < 256 * 1024
