"""The README's first run, as a reader does it: `make serve` itself in a fresh HOME, on a machine
whose memory another process holds in part; the key and the curl it prints; the README's marked
snippets (`<!-- readme-test: shell|python -->`) run as printed against that node; `/docs` in
headless Chromium with no request to another origin; a second `make serve` prints the same key.

The one change made to the snippets: the node listens on a free port, not 8000.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from tests.harness import free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GIB = 1024**3
STARTUP_S = 300
SNIPPET = re.compile(r"<!-- readme-test: (shell|python) -->\n```\w*\n(.*?)```", re.S)
KEY = re.compile(r"^    (acs-bm-[A-Za-z0-9_-]{43})$", re.M)
ARTIFACTS = Path(os.environ.get("ACS_TEST_ARTIFACTS", ROOT / "test-artifacts"))


@dataclass
class FirstRun:
    home: Path
    port: int
    process: subprocess.Popen
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def environment(self) -> dict[str, str]:
        return reader_environment(self.home)


def reader_environment(home: Path) -> dict[str, str]:
    """The test's environment as a reader's shell would have it: a fresh HOME, and none of the
    settings the suite's own nodes use (the README's command must work without them)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VLLM_ACS_", "VLLM_CPU_KVCACHE")) and k != "MAKEFLAGS"
    }
    # Every node of the suite runs unbound (tests/harness.py says why); the command is the same.
    return {**env, "HOME": str(home), "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


@contextlib.contextmanager
def memory_held() -> Iterator[int]:
    """A process that holds several GiB, as a busy machine's other programs do (vLLM's CPU
    default reserves 92% of the machine's memory, far more than is free then)."""
    available = psutil.virtual_memory().available
    hold = max(0, min(3 * GIB, available - 6 * GIB))
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import time; b = b'1' * {hold}; print('held', flush=True); "
         "time.sleep(900)"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield hold
    finally:
        holder.kill()
        holder.wait()


def start_make_serve(home: Path, port: int, log: Path) -> subprocess.Popen:
    handle = open(log, "wb")  # noqa: SIM115  # kept by the process; closed when the test ends
    return subprocess.Popen(
        ["make", "--no-print-directory", "serve", f"PORT={port}"],
        cwd=ROOT,
        env=reader_environment(home),
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def wait_for(condition, what: str, process: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if process.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"{what}; make serve said:\n{log.read_text(errors='replace')[-6000:]}")


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FirstRun]:
    home = tmp_path_factory.mktemp("reader-home")
    log = home / "make-serve.log"
    port = free_port()
    with memory_held():
        process = start_make_serve(home, port, log)
        run = FirstRun(home, port, process, log)
        try:

            def healthy() -> bool:
                with contextlib.suppress(httpx.HTTPError):
                    return httpx.get(f"{run.base_url}/health", timeout=2).status_code == 200
                return False

            wait_for(healthy, "the node never became healthy", process, log, STARTUP_S)
            yield run
        finally:
            stop(process)


def test_make_serve_starts_on_a_busy_machine_and_prints_a_key_whose_curl_answers(first_run):
    output = first_run.output()
    assert "CPU KV cache" in output  # sized for the model, and said so
    (secret,) = KEY.findall(output)
    key_file = first_run.home / ".local/share/vllm-acs/local-key"
    assert key_file.read_text().strip() == secret
    assert key_file.stat().st_mode & 0o777 == 0o600
    printed = [line.strip() for line in output.splitlines() if line.strip().startswith("curl ")]
    models = next(line for line in printed if "/v1/models" in line)
    done = subprocess.run(
        ["bash", "-c", f"{models} --fail -sS -o /dev/null -w '%{{http_code}}'"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout == "200", done.stderr


def _snippets(kind: str) -> list[str]:
    return [code for found, code in SNIPPET.findall(README.read_text()) if found == kind]


def _on_port(code: str, port: int) -> str:
    return code.replace("127.0.0.1:8000", f"127.0.0.1:{port}")


def test_the_readme_shell_snippets_run_as_printed(first_run):
    (shell,) = _snippets("shell")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _on_port(shell, first_run.port)],
        capture_output=True,
        text=True,
        env=first_run.environment(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert '"error"' not in done.stdout, done.stdout
    assert '"object":"list"' in done.stdout.replace(" ", "")
    assert '"object":"text_completion"' in done.stdout.replace(" ", "")


def test_the_readme_python_snippets_run_in_order(first_run, tmp_path: Path):
    """The quick start, a completion job, a harvest trained into an SAE, and a Loom: one
    script, in the README's order (later snippets use the names earlier ones define)."""
    snippets = _snippets("python")
    assert len(snippets) == 4
    script = tmp_path / "readme_snippets.py"
    script.write_text("\n\n".join(_on_port(code, first_run.port) for code in snippets))
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env={**first_run.environment(), "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    assert (tmp_path / "harvest-files" / "manifest.json").exists()


def test_the_api_pages_render_offline_in_chromium(first_run):
    from playwright.sync_api import sync_playwright

    origin = first_run.base_url
    requested: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            page = browser.new_page()
            page.on("request", lambda request: requested.append(request.url))
            page.goto(f"{origin}/docs")
            operations = page.locator(".opblock-summary-path")
            operations.first.wait_for(timeout=30_000)
            paths = set(operations.all_inner_texts())
            assert {"/v1/completions", "/v1/models"} <= {p.replace("\u200b", "") for p in paths}
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "docs.png"), full_page=False)
        finally:
            browser.close()
    others = [url for url in requested if not url.startswith(origin)]
    assert others == [], others


def test_a_second_make_serve_prints_the_same_key(first_run, tmp_path: Path):
    (secret,) = KEY.findall(first_run.output())
    log = tmp_path / "second.log"
    process = start_make_serve(first_run.home, free_port(), log)
    try:
        wait_for(lambda: KEY.search(log.read_text()) is not None, "no key", process, log, 120)
    finally:
        stop(process)
    assert KEY.findall(log.read_text()) == [secret]
    assert "made local API key" not in log.read_text()
