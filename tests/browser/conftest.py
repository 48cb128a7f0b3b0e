"""The Workbench's browser harness: Debian's Chromium, headless, driven by Playwright for Python
(launched at /usr/bin/chromium: nothing is downloaded), against the session's real node.

Every page opened through `open_page` is watched: a request to another origin, a page error, or a
console error (a CSP violation is one) fails the test at teardown. Screenshots go to
`test-artifacts/workbench/` (or `$ACS_TEST_ARTIFACTS/workbench/`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import expect

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("ACS_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "workbench"
CHROMIUM = "/usr/bin/chromium"
AXE = Path(__file__).with_name("vendor") / "axe-core" / "axe.min.js"
# As the machine's probe starts it: no sandbox (root), no GPU, no calls home.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DEFAULT_TIMEOUT_MS = 60_000
# Runs stream from a CPU node that other tests share, and a Loom branch on a busy two-core machine
# takes longer than expect()'s default 5 s: every assertion waits as long as a page's own timeout.
expect.set_options(timeout=DEFAULT_TIMEOUT_MS)
VIEWPORT = {"width": 1360, "height": 860}


@dataclass
class WatchedPage:
    """A page and what it did that a test must not allow."""

    page: object
    origin: str
    foreign_requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    requests: list[object] = field(default_factory=list)

    def problems(self) -> list[str]:
        return [f"request to another origin: {u}" for u in self.foreign_requests] + self.errors


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    # One per module, not per session: Playwright's sync API keeps an asyncio loop running in
    # this thread while it is started, and later test modules call asyncio.run().
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="session")
def workbench_url(acs_server) -> str:
    return f"{acs_server.base_url}/workbench"


@pytest.fixture
def page_origin(acs_server) -> str:
    """The node the pages talk to; a module with a node of its own overrides this fixture."""
    return acs_server.base_url


@pytest.fixture
def open_page(browser, page_origin) -> Iterator[Callable[..., WatchedPage]]:
    """open_page(context=None) -> a watched page in a new browser context (or in `context`)."""
    opened: list[tuple[object, WatchedPage]] = []
    origin = page_origin

    def open_one(context: object | None = None, **context_options: object) -> WatchedPage:
        own = context is None
        if own:
            context = browser.new_context(viewport=VIEWPORT, **context_options)
        page = context.new_page()
        page.set_default_timeout(DEFAULT_TIMEOUT_MS)
        watched = WatchedPage(page, origin)

        def on_request(request: object) -> None:
            watched.requests.append(request)
            url = request.url
            if not (url.startswith(origin) or url.startswith(("data:", "blob:", "about:"))):
                watched.foreign_requests.append(url)

        page.on("request", on_request)
        page.on("pageerror", lambda error: watched.errors.append(f"page error: {error}"))
        page.on(
            "console",
            lambda message: (
                watched.errors.append(f"console error: {message.text}")
                if message.type == "error" and not _expected_console_error(message.text)
                else None
            ),
        )
        opened.append((context if own else None, watched))
        return watched

    yield open_one
    problems = [p for _, watched in opened for p in watched.problems()]
    for context, _ in opened:
        if context is not None:
            context.close()
    assert problems == [], problems


def _expected_console_error(text: str) -> bool:
    # Chromium logs every non-2xx fetch as a console error; the page shows those itself, and the
    # tests assert what it shows. Anything else (a CSP violation, an exception) is a failure.
    return "Failed to load resource: the server responded with a status of" in text


def sign_in(watched: WatchedPage, url: str, key: str, *, remember: bool = False) -> None:
    """Signs in as a person does: the API key field, the checkbox, the button."""
    page = watched.page
    page.goto(url)
    page.get_by_label("API key").fill(key)
    if remember:
        page.get_by_label("Remember on this device").check()
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("navigation", name="Main").wait_for()


def screenshot(watched: WatchedPage, name: str, *, full_page: bool = False) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    watched.page.screenshot(path=str(path), full_page=full_page)
    return path


@contextlib.contextmanager
def slow_downloads(watched: WatchedPage, bytes_per_s: int = 8 * 1024) -> Iterator[None]:
    """The page's downloads throttled (Chromium's network emulation, through the DevTools
    protocol) while the block runs: a long run then still streams when the test clicks Stop,
    however fast the engine (2,000 tokens with 5 logprobs each are ~1 MB of events)."""
    page = watched.page
    session = page.context.new_cdp_session(page)
    conditions = {"offline": False, "latency": 0, "uploadThroughput": -1}
    session.send("Network.enable")
    session.send(
        "Network.emulateNetworkConditions", {**conditions, "downloadThroughput": bytes_per_s}
    )
    try:
        yield
    finally:
        session.send("Network.emulateNetworkConditions", {**conditions, "downloadThroughput": -1})
        session.detach()


def axe_violations(watched: WatchedPage) -> list[dict]:
    """axe-core's serious and critical violations on the page as it stands."""
    page = watched.page
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        # Run through the DevTools protocol, so the page's CSP (no inline script) does not apply.
        page.evaluate(AXE.read_text(encoding="utf-8") + "\n;undefined")
    results = page.evaluate(
        """async () => {
            const r = await window.axe.run(document, {resultTypes: ['violations']});
            return r.violations.map(v => ({
                id: v.id, impact: v.impact, help: v.help,
                nodes: v.nodes.slice(0, 5).map(n => n.target.join(' ')),
            }));
        }"""
    )
    return [v for v in results if v["impact"] in ("serious", "critical")]
