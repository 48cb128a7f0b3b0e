"""Session fixtures: the tiny model, generated once, one real vLLM server for e2e tests, and a
real S3-compatible server (SeaweedFS) for the object-store tests, started on first use; a failed
test's report carries the log tails of the servers it started itself."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import httpx
import pytest

from tests import harness
from tests.harness import CHECKPOINT, MODEL_ID, ServerProcess, running_server
from tests.seaweedfs import SeaweedFS, running_seaweedfs

_STARTED_BY_TEST = pytest.StashKey[list[ServerProcess]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    first = len(harness.STARTED)
    yield
    item.stash[_STARTED_BY_TEST] = harness.STARTED[first:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo
) -> Generator[None, None, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for server in item.stash.get(_STARTED_BY_TEST, []):
            report.sections.append((f"log of {server.log_path}", server.log_tail(80)))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vllm_acs.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def acs_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    # Eager: the suite's timing tests (a slot held by a stream, the request window) and its
    # batched-versus-solo capture comparisons were made against eager speed and numerics. The
    # compiled engine is covered by test_hooks_engine.py (both modes) and test_readme.py (`make
    # serve` as printed: completions, jobs, a harvest, Looms).
    with running_server(
        tiny_model_dir, tmp_path_factory.mktemp("acs-home"), env={"VLLM_ACS_GPU_SHAPE": "cpu-test"}
    ) as server:
        yield server


@pytest.fixture(scope="session")
def api_key(acs_server: ServerProcess) -> str:
    """A key with default limits on an approved account, made with the operator CLI."""
    return acs_server.create_key()


@pytest.fixture(scope="session")
def auth(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"}


@pytest.fixture(scope="session")
def api(acs_server: ServerProcess, auth: dict[str, str]) -> Iterator[httpx.Client]:
    """httpx against the server, with the key."""
    with httpx.Client(base_url=acs_server.base_url, headers=auth, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def openai_client(acs_server: ServerProcess, api_key: str):
    from openai import OpenAI

    return OpenAI(base_url=f"{acs_server.base_url}/v1", api_key=api_key, max_retries=0)


@pytest.fixture(scope="session")
def model_id() -> str:
    return MODEL_ID


@pytest.fixture(scope="session")
def checkpoint() -> str:
    return CHECKPOINT


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """SeaweedFS's S3 gateway with one bucket (`seaweedfs.bucket`); give each store its own
    `seaweedfs.prefix()`."""
    with running_seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server
