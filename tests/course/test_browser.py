"""The explorer in a real browser: JupyterLab + Chromium, as a learner would use it.

Starts JupyterLab headless on the loopback interface (token, temporary copy of the
notebook, settings and runtime files in a temporary folder), opens notebook 10 in
a Chromium-family browser through Playwright, runs every cell from the Run menu, then clicks
the explorer's layer and head buttons and checks that the heatmap image the page shows
changes, and that the page logged no JavaScript error.

Needs the ``playwright`` Python package and a Chromium-family browser. ``find_browser`` looks,
in order, at ``$SELFATTN_BROWSER`` (a path to the executable), ``chromium`` / ``chromium-browser`` /
``google-chrome`` / ``google-chrome-stable`` on PATH, the macOS Chrome and Chromium apps, and
Playwright's own browser cache. Where none is found the test runs ``python -m playwright install
chromium`` once; where that fails too (offline) it skips with a message saying how to get one.
``SELFATTN_REQUIRE_BROWSER=1`` (set by ``.ci/run``) turns that skip into a failure, so CI never skips it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import helpers
import pytest
from helpers import ROOT, browser_or_skip, find_browser, free_port, stop

NOTEBOOK = ROOT / "notebooks" / "10_attention_in_the_wild.ipynb"
SERVER_START_S = 90      # JupyterLab up and answering
RUN_ALL_S = 300          # the whole notebook executed in the browser's kernel
REDRAW_S = 30            # one control change shows a new image
SCREENSHOT = os.environ.get("SELFATTN_EXPLORER_SCREENSHOT")   # optional: save the explorer as seen


# Hashes the <img> the browser currently shows (its blob/data URL fetched back as bytes).
IMAGE_DIGEST_JS = """async (img) => {
    const bytes = await (await fetch(img.src)).arrayBuffer();
    const digest = await crypto.subtle.digest("SHA-256", bytes);
    return [bytes.byteLength, Array.from(new Uint8Array(digest)).map(b => b.toString(16).padStart(2, "0")).join("")];
}"""


def _wait_for_server(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"JupyterLab did not answer {url} within {SERVER_START_S} s:\n{log.read_text()[-3000:]}")


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server serving a copy of notebook 10; yields (base url, token, notebook path)."""
    root = tmp_path / "course"                       # the repository's layout: notebooks/ next to figures/
    (root / "notebooks").mkdir(parents=True)
    shutil.copy(NOTEBOOK, root / "notebooks" / NOTEBOOK.name)
    shutil.copytree(ROOT / "figures", root / "figures")    # the markdown's ../figures/*.png images
    settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    port, token = free_port(), os.urandom(16).hex()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTER_PLATFORM_DIRS="1")
    log = tmp_path / "lab.log"
    command = [sys.executable, "-m", "jupyter", "lab", "--allow-root", "--no-browser",
               "--ServerApp.open_browser=False", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={root}", f"--LabApp.user_settings_dir={tmp_path / 'settings'}",
               f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for_server(f"{base}/api/status?token={token}", process, log)
        yield base, token, f"notebooks/{NOTEBOOK.name}"
    finally:
        stop(process)


# The execution prompts ("[ ]:", "[*]:", "[3]:") of the notebook's code cells.
_STDERR = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"   # errors, warnings
# A folded solution cell (source_hidden) shows JupyterLab's placeholder, whose own empty prompt never gets a number.
_PROMPTS_JS = ("Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt:not(.jp-Placeholder-prompt)'))"
               ".map(p => p.textContent)")


def _menu(page, menu: str, item: str) -> None:
    """Click ``menu`` in JupyterLab's menu bar, then its entry ``item`` (exact text)."""
    page.locator(".lm-MenuBar-itemLabel").get_by_text(menu, exact=True).click()
    page.locator(".lm-Menu-itemLabel").get_by_text(item, exact=True).click()


def _image_digest(page) -> tuple[int, str]:
    image = page.locator(".selfattn-explorer .selfattn-heatmap").first
    return tuple(image.evaluate(IMAGE_DIGEST_JS))


def _click_and_expect_new_image(page, control: str, before: tuple[int, str]) -> tuple[str, tuple[int, str]]:
    """Click a button of the explorer control ``control`` that is not selected; wait for a new image.

    Returns the clicked button's label and the new image's digest.
    """
    buttons = page.locator(f".selfattn-explorer .{control}").first.locator("button")
    button = next(b for b in buttons.all() if "mod-active" not in (b.get_attribute("class") or ""))
    label = button.inner_text().strip()
    button.click()
    deadline = time.monotonic() + REDRAW_S
    while time.monotonic() < deadline:
        after = _image_digest(page)
        if after != before:
            return label, after
        page.wait_for_timeout(200)
    raise AssertionError(f"the heatmap image did not change within {REDRAW_S} s after clicking {control} {label}")


@pytest.fixture
def browser_path():
    return browser_or_skip()


@pytest.mark.slow
def test_explorer_in_jupyterlab(browser_path, lab):
    from playwright.sync_api import sync_playwright

    base, token, name = lab
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox"], headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("pageerror", lambda error: errors.append(f"pageerror: {error}"))
            page.on("console", lambda msg: errors.append(f"console.{msg.type}: {msg.text} ({msg.location.get('url')})")
                    if msg.type == "error" else None)
            page.goto(f"{base}/lab/tree/{name}?token={token}", timeout=SERVER_START_S * 1000)
            page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=SERVER_START_S * 1000)
            page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(
                timeout=SERVER_START_S * 1000)

            # Edit > Clear Outputs of All Cells, then Run > Run All Cells, as a learner would.
            page.locator(".jp-NotebookPanel .jp-InputPrompt").first.click()   # focus the notebook
            _menu(page, "Edit", "Clear Outputs of All Cells")
            page.wait_for_function(f"() => {_PROMPTS_JS}.every(p => !/[0-9]/.test(p))", timeout=30_000)
            _menu(page, "Run", "Run All Cells")
            page.wait_for_function(f"() => {_PROMPTS_JS}.every(p => /[0-9]/.test(p)) || "
                                   f"document.querySelector(\"{_STDERR}\") !== null",
                                   timeout=RUN_ALL_S * 1000, polling=500)
            failures = page.locator(_STDERR)
            assert failures.count() == 0, f"cells wrote errors: {failures.all_inner_texts()}"

            explorer = page.locator(".selfattn-explorer").first
            explorer.scroll_into_view_if_needed()
            explorer.locator(".selfattn-heatmap").wait_for(timeout=REDRAW_S * 1000)
            first = _image_digest(page)
            assert first[0] > 1000, f"the heatmap image is nearly empty ({first[0]} bytes)"

            layer, second = _click_and_expect_new_image(page, "selfattn-layer", first)
            head, third = _click_and_expect_new_image(page, "selfattn-head", second)
            assert len({first, second, third}) == 3
            header = explorer.locator(".widget-html").first.inner_text()
            assert f"layer {layer}" in header and f"head {head}" in header, header

            # Type your own sentence and press Enter: the model re-runs and the image changes again.
            text_box = explorer.locator(".widget-text input").first
            text_box.fill("The trophy did not fit in the suitcase because it was too big")
            text_box.press("Enter")
            deadline = time.monotonic() + REDRAW_S
            while _image_digest(page) == third and time.monotonic() < deadline:
                page.wait_for_timeout(200)
            assert _image_digest(page) != third, "typing a sentence did not change the heatmap"
            options = explorer.locator(".widget-dropdown select option").all_inner_texts()
            assert any(o.endswith("trophy") for o in options) and any(o.endswith("suitcase") for o in options), options
            if SCREENSHOT:
                explorer.screenshot(path=SCREENSHOT)
        finally:
            browser.close()
    assert not errors, "the page logged JavaScript errors:\n" + "\n".join(errors)


# Finding a browser: fake executables in a temporary folder stand in for real ones.

def _fake_executable(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def nowhere(monkeypatch, tmp_path):
    """No macOS app and an empty Playwright cache, whatever this machine has."""
    monkeypatch.setattr(helpers, "MACOS_APPS", (str(tmp_path / "no.app"),))
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(tmp_path / "empty-playwright-cache"))
    return tmp_path


@pytest.mark.parametrize("name", helpers.BROWSER_NAMES)
def test_find_browser_on_path(nowhere, name):
    fake = _fake_executable(nowhere / "bin", name)
    assert find_browser({"PATH": str(nowhere / "bin")}) == str(fake)


def test_find_browser_prefers_the_variable(nowhere):
    _fake_executable(nowhere / "bin", "chromium")
    named = _fake_executable(nowhere / "elsewhere", "my-chrome")
    assert find_browser({"PATH": str(nowhere / "bin"), "SELFATTN_BROWSER": str(named)}) == str(named)
    with pytest.raises(FileNotFoundError, match="SELFATTN_BROWSER"):
        find_browser({"PATH": str(nowhere / "bin"), "SELFATTN_BROWSER": str(nowhere / "missing")})


def test_find_browser_macos_app(nowhere, monkeypatch):
    app = _fake_executable(nowhere / "Google Chrome.app" / "Contents" / "MacOS", "Google Chrome")
    monkeypatch.setattr(helpers, "MACOS_APPS", (str(app),))
    assert find_browser({"PATH": str(nowhere / "empty")}) == str(app)


def test_find_browser_none(nowhere):
    assert find_browser({"PATH": str(nowhere / "empty")}) is None


def test_no_browser_skips_with_instructions_or_fails_in_ci(nowhere, monkeypatch):
    """With no browser and no way to download one: skip saying how to get one; fail when CI requires it."""
    monkeypatch.setenv("PATH", str(nowhere / "empty") + os.pathsep + str(Path(sys.executable).parent))
    monkeypatch.delenv("SELFATTN_BROWSER", raising=False)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(OSError("offline")))
    monkeypatch.delenv("SELFATTN_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception, match="playwright install chromium"):
        browser_or_skip()
    monkeypatch.setenv("SELFATTN_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="SELFATTN_REQUIRE_BROWSER is set"):
        browser_or_skip()
