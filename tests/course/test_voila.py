"""`make explorer`: the live explorer as a Voila app, used in Chromium as a reader would.

Starts Voila on the loopback interface with apps/explorer.ipynb (settings and runtime files in a
temporary folder), opens it in Chromium (``helpers.find_browser``) through Playwright with every request that is not
to the local server aborted, waits for the heatmap, types a sentence and presses Enter, and checks
that the heatmap image changes, that the new tokens appear, and that nothing went to the network.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import pytest
from helpers import ROOT, browser_or_skip, free_port, stop

APP = ROOT / "apps" / "explorer.ipynb"
START_S = 120        # Voila up, the notebook executed (the model loads) and the page shown
REDRAW_S = 60

pytestmark = pytest.mark.slow
# Voila's own "lab" template links two Font Awesome stylesheets on a CDN; the same Font Awesome is
# already bundled in its JavaScript, so the aborted requests change nothing on the page. Known, allowed.
VOILA_TEMPLATE_CDN = "https://cdn.jsdelivr.net/npm/@fortawesome/fontawesome-free@"

IMAGE_DIGEST_JS = """async (img) => {
    const bytes = await (await fetch(img.src)).arrayBuffer();
    const digest = await crypto.subtle.digest("SHA-256", bytes);
    return [bytes.byteLength, Array.from(new Uint8Array(digest)).map(b => b.toString(16).padStart(2, "0")).join("")];
}"""


@pytest.fixture
def voila(tmp_path):
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_PLATFORM_DIRS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    log = tmp_path / "voila.log"
    command = [sys.executable, "-m", "voila", str(APP), "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1",
               "--Voila.port_retries=0"]
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"voila exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/voila/static/", timeout=2):
                    break
            except urllib.error.HTTPError:
                break                                   # the server answers (404 for a folder is fine)
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"voila did not start in {START_S} s:\n{log.read_text()[-3000:]}") from None
                time.sleep(0.5)
        yield base, log
    finally:
        stop(process)


def test_typing_a_sentence_redraws_the_heatmap(voila):
    from playwright.sync_api import sync_playwright

    base, log = voila
    blocked, errors = [], []

    def route(r):
        if r.request.url.startswith(base) or r.request.url.startswith(("data:", "blob:", "ws://127.0.0.1")):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    executable = browser_or_skip()                     # before Playwright starts: it may ask Playwright itself
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"], headless=True)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            page.route("**/*", route)
            page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
            page.goto(base, timeout=START_S * 1000)
            image = page.locator(".selfattn-explorer .selfattn-heatmap").first
            image.wait_for(timeout=START_S * 1000)
            page.wait_for_function("(img) => img.src && img.src.length > 0", arg=image.element_handle(),
                                   timeout=REDRAW_S * 1000)
            before = tuple(image.evaluate(IMAGE_DIGEST_JS))
            assert before[0] > 1000, f"the heatmap image is nearly empty ({before[0]} bytes)"
            box = page.locator(".selfattn-explorer .widget-text input").first
            box.fill("The trophy did not fit in the suitcase because it was too big")
            box.press("Enter")
            deadline = time.monotonic() + REDRAW_S
            while tuple(image.evaluate(IMAGE_DIGEST_JS)) == before and time.monotonic() < deadline:
                page.wait_for_timeout(250)
            assert tuple(image.evaluate(IMAGE_DIGEST_JS)) != before, "typing a sentence did not change the heatmap"
            options = page.locator(".selfattn-explorer .widget-dropdown select option").all_inner_texts()
            assert any(o.endswith("trophy") for o in options) and any(o.endswith("suitcase") for o in options), options
        finally:
            browser.close()
    unexpected = [url for url in blocked if not url.startswith(VOILA_TEMPLATE_CDN)]
    assert not unexpected, f"the Voila page asked the network for: {unexpected}"
    assert not errors, "JavaScript errors:\n" + "\n".join(errors) + "\n" + log.read_text()[-2000:]
