"""How fast the Workbench's Loom view draws a 764-node socketteer/loom file, in headless Chromium.

A real node of the tiny model (benchmarks/_node.py); the file (tests/browser/socketteer_fixture.py)
imported through the API; Debian's Chromium driven by Playwright, as the browser tests launch it.
Measured in the page, from the action to the second animation frame after it (the DOM built,
styled, laid out and painted):
  open    #/loom/<id> from the list: the Loom read (GET, ~1 MB) and its List view drawn
  graph   List -> Graph: the layout and one SVG box per Node
  list    Graph -> List
  key     one hotkey (→ or ←) moving the selection: the path, the centre panel, the view's marks
Each figure is over ROUNDS tries (VLLM_ACS_BENCH_RENDER_ROUNDS, default 7; keys 4x that).
Run: `python -m benchmarks.workbench_render`.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

import httpx

from benchmarks._node import tiny_node, unlimited_key
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, VIEWPORT
from tests.browser.socketteer_fixture import NODES, socketteer_file

ROUNDS = int(os.environ.get("VLLM_ACS_BENCH_RENDER_ROUNDS", "7"))

# In the page: run ACTION, then wait until DONE holds and two frames have been drawn. Built as
# one script (the page's CSP forbids eval; DevTools' own evaluation is not bound by it).
_TIMED = """async () => {
    const frame = () => new Promise((resolve) => requestAnimationFrame(resolve));
    const started = performance.now();
    ACTION;
    while (!(DONE)()) await frame();
    await frame();
    await frame();
    return performance.now() - started;
}"""
_ROWS = f"() => document.querySelectorAll('.tree-row').length === {NODES}"
_BOXES = f"() => document.querySelectorAll('.gnode').length === {NODES}"
_KEY = "document.dispatchEvent(new KeyboardEvent('keydown', {key: 'KEY', bubbles: true}))"


def _timed(page, action: str, done: str = "() => true") -> float:
    return page.evaluate(_TIMED.replace("ACTION", action).replace("DONE", done))


def _summary(name: str, values: list[float]) -> str:
    ordered = sorted(values)
    return (
        f"{name:<6} median {statistics.median(ordered):7.1f} ms   "
        f"min {ordered[0]:7.1f}   max {ordered[-1]:7.1f}   (n={len(ordered)})"
    )


def measure(base_url: str, key: str, loom_id: str) -> dict[str, list[float]]:
    from playwright.sync_api import sync_playwright

    figures: dict[str, list[float]] = {"open": [], "graph": [], "list": [], "key": []}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport=VIEWPORT).new_page()
            page.set_default_timeout(120_000)
            page.goto(f"{base_url}/workbench")
            page.evaluate("() => localStorage.setItem('vllm-acs.loom.view', 'list')")
            page.get_by_label("API key").fill(key)
            page.get_by_role("button", name="Sign in").click()
            page.get_by_role("navigation", name="Main").wait_for()
            for _ in range(ROUNDS):
                page.evaluate("() => { location.hash = '#/loom'; }")
                page.get_by_role("button", name="＋ New loom").wait_for()
                figures["open"].append(_timed(page, f"location.hash = '#/loom/{loom_id}'", _ROWS))
            page.locator(".tree-row").first.click()
            for _ in range(ROUNDS):
                graph = "document.querySelector('.segmented button:last-child').click()"
                figures["graph"].append(_timed(page, graph, _BOXES))
                figures["key"] += _keys(page, ROUNDS * 2)
                plain = "document.querySelector('.segmented button:first-child').click()"
                figures["list"].append(_timed(page, plain, _ROWS))
                figures["key"] += _keys(page, ROUNDS * 2)
        finally:
            browser.close()
    return figures


def _keys(page, count: int) -> list[float]:
    """Down the first chain and back up again: → then ←, `count` presses in all."""
    half = count // 2
    keys = ["ArrowRight"] * half + ["ArrowLeft"] * half
    return [_timed(page, _KEY.replace("KEY", key)) for key in keys]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        node = tiny_node(Path(tmp))
        node.start()
        try:
            key = unlimited_key(node)
            headers = {"Authorization": f"Bearer {key}"}
            with httpx.Client(base_url=node.base_url, headers=headers, timeout=120) as client:
                answer = client.post("/v1/looms/import", json=socketteer_file())
                answer.raise_for_status()
                loom_id = answer.json()["id"]
            figures = measure(node.base_url, key, loom_id)
        finally:
            node.stop()
    print(f"Loom view, {NODES}-node socketteer/loom file, headless Chromium ({CHROMIUM})")
    for name, values in figures.items():
        print(_summary(name, values))


if __name__ == "__main__":
    main()
