"""What several test modules share: the repository's paths, the notebooks, small assertions, and the browser.

The browser tests (JupyterLab, the website, Voila) need the ``playwright`` package and a Chromium-family
browser. ``find_browser`` looks, in order, at ``$SELFATTN_BROWSER`` (a path to the executable),
``chromium`` / ``chromium-browser`` / ``google-chrome`` / ``google-chrome-stable`` on PATH, the macOS
Chrome and Chromium apps, and Playwright's own browser cache. ``browser_or_skip`` runs ``python -m
playwright install chromium`` once where none is found, and skips with instructions where that fails too
(offline); ``SELFATTN_REQUIRE_BROWSER=1`` (set by ``.ci/run``) turns that skip into a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from selfattn_lite.exercises import ExerciseError

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def tags(cell) -> list[str]:
    """A notebook cell's tags."""
    return cell.get("metadata", {}).get("tags", [])


def tiny_model(seed: int = 0, **config):
    """A small random ``TinyDecoder`` (vocab 11, d 16, 2 layers, 4 heads, max_len 32) in eval mode."""
    import torch

    from selfattn_lite.models import DecoderConfig, TinyDecoder

    torch.manual_seed(seed)
    return TinyDecoder(DecoderConfig(**{**dict(vocab_size=11, d_model=16, n_layers=2, n_heads=4, max_len=32),
                                        **config})).eval()


def stop(process: subprocess.Popen) -> None:
    """Terminate a server process, and kill it if it has not stopped after 20 s."""
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def expect_error(check, fn, fragment: str) -> None:
    """An exercise checker rejects ``fn`` with a message that names the mistake (contains ``fragment``)."""
    with pytest.raises(ExerciseError) as info:
        check(fn)
    assert fragment in str(info.value), str(info.value)


def expect_correct(check, answer, capsys, *args) -> str:
    """``check(answer, *args)`` accepts the answer: it prints one line, "Correct: ...", returned for more asserts."""
    check(answer, *args)
    out = capsys.readouterr().out
    assert out.startswith("Correct: ") and out.count("\n") == 1, out
    return out


def expect_not_attempted(check, stub, capsys, *args) -> None:
    """``check(stub, *args)`` reports a stub (it raises NotImplementedError) in one line, "Not attempted yet: ..."."""
    check(stub, *args)
    out = capsys.readouterr().out
    assert out.startswith("Not attempted yet: ") and out.count("\n") == 1, out


def right_and_not_attempted_test(right: dict, stub):
    """A test parametrized over ``right`` (test id -> (checker, a right answer)).

    Each case: the checker accepts the answer (``expect_correct``) and calls ``stub`` not attempted
    (``expect_not_attempted``). Bind it to a ``test_`` name at the end of the test module, after the last entry
    of ``right``, for pytest to collect it.
    """
    @pytest.mark.parametrize("checker, answer", list(right.values()), ids=list(right))
    def test(checker, answer, capsys):
        expect_correct(checker, answer, capsys)
        expect_not_attempted(checker, stub, capsys)

    return test


# ----------------------------------------------------------------------------- the browser
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
MACOS_APPS = ("/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
              "/Applications/Chromium.app/Contents/MacOS/Chromium")
INSTALL_S = 300          # `playwright install chromium`, when there is a network
HOW_TO_GET_ONE = (
    "no Chromium-family browser found for the browser test. Get one with any of: "
    "`python -m playwright install chromium` (downloads Playwright's Chromium; needs network), "
    "`sudo apt-get install chromium` (Debian/Ubuntu), `brew install --cask chromium` or Google Chrome (macOS); "
    "or point SELFATTN_BROWSER at a Chrome/Chromium executable.")

def _playwright_cache_browser() -> str | None:
    """The Chromium in Playwright's own cache (``playwright install chromium``), if it is there."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    with sync_playwright() as p:
        path = p.chromium.executable_path
    return path if path and Path(path).is_file() else None


def find_browser(env: dict | None = None) -> str | None:
    """The path of a Chromium-family browser, or None.

    Looks at $SELFATTN_BROWSER, then chromium / chromium-browser / google-chrome(-stable) on PATH,
    then the macOS apps, then Playwright's browser cache.
    """
    env = os.environ if env is None else env
    named = env.get("SELFATTN_BROWSER")
    if named:
        found = shutil.which(named, path=env.get("PATH")) or (named if Path(named).is_file() else None)
        if found is None:
            raise FileNotFoundError(f"SELFATTN_BROWSER={named!r} is not an executable file")
        return found
    for name in BROWSER_NAMES:
        found = shutil.which(name, path=env.get("PATH"))
        if found:
            return found
    for app in MACOS_APPS:
        if Path(app).is_file():
            return app
    return _playwright_cache_browser()


def browser_or_skip() -> str:
    """find_browser(), else try `playwright install chromium`, else skip (or fail under SELFATTN_REQUIRE_BROWSER)."""
    required = bool(os.environ.get("SELFATTN_REQUIRE_BROWSER"))
    try:
        import playwright  # noqa: F401
    except ImportError:
        message = "the browser test needs the playwright package: `pip install playwright`"
        if required:
            pytest.fail(f"SELFATTN_REQUIRE_BROWSER is set and {message}", pytrace=False)
        pytest.skip(message)
    found = find_browser()
    if found is None:
        try:
            subprocess.run([sys.executable, "-m", "playwright", "install", "chromium"], check=True,
                           timeout=INSTALL_S, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except (subprocess.SubprocessError, OSError):
            pass
        found = find_browser()
    if found is None:
        if required:
            pytest.fail(f"SELFATTN_REQUIRE_BROWSER is set and {HOW_TO_GET_ONE}", pytrace=False)
        pytest.skip(HOW_TO_GET_ONE)
    return found


def free_port() -> int:
    """A TCP port on the loopback interface that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
