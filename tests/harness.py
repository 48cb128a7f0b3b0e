"""Starts and stops a real `vllm-acs serve` on a free loopback port, for tests and benchmarks.

The server runs in its own process group, so stopping it also stops vLLM's EngineCore and
workers: no orphan is left behind, whatever the tests did.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

MODEL_ID = "tiny-llama"
CHECKPOINT = "vllm-acs/tiny-llama"
# A node starts in ~35 s here (eager; compiled ~50 s), two at once in ~120 s, and CI's slowest host
# was over twice as slow. A node that dies is seen at once (the process has exited), so a long
# deadline costs nothing when a start goes well.
STARTUP_TIMEOUT_S = 480.0


# Every server started in this test process, in order: a failed test's report carries the log
# tails of those it started (tests/conftest.py), since a node that dropped a connection or died
# says why only there.
STARTED: list[ServerProcess] = []


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(
    condition: Callable[[], Any], what: str, timeout_s: float = 30.0, every_s: float = 0.2
) -> Any:
    """`condition()`'s first truthy value, polled every `every_s`; an AssertionError naming
    `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what}: not after {timeout_s:.0f} s"
        time.sleep(every_s)
    return value


def sigkill_group(pgid: int, timeout_s: float = 15.0) -> None:
    """SIGKILL to process group `pgid` (a node: its API server, EngineCore and workers), then
    until none of it is left."""
    os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert group_members(pgid) == [], "processes of the killed node survived SIGKILL"


@contextlib.contextmanager
def frozen_groups(pgids: list[int]) -> Iterator[None]:
    """Process groups stopped (SIGSTOP) for the block, then continued (SIGCONT): what they
    wrote can be read while none of it moves on. A group killed meanwhile stays dead."""
    for pgid in pgids:
        os.killpg(pgid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pgid in pgids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGCONT)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group `pgid`, read from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state, ppid, pgrp, ...
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members.append(int(entry.name))
    return members


def group_cpu_seconds(pgid: int) -> float:
    """CPU time (user and system) used so far by the live processes of group `pgid`."""
    ticks = 0
    for pid in group_members(pgid):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass
class ServerProcess:
    model_dir: Path
    log_path: Path
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # vLLM's default compilation (inductor on this build), as `make serve` runs; eager (the
    # default here) starts ~25 s sooner, for the many nodes that test other things.
    compiled: bool = False
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def serve_args(self) -> list[str]:
        """What follows `vllm-acs serve`."""
        return [
            str(self.model_dir),
            "--served-model-name",
            CHECKPOINT,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *([] if self.compiled else ["--enforce-eager"]),
            "--max-model-len",
            "2048",
            *self.extra_args,
        ]

    @property
    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "VLLM_ACS_MODEL_ID": MODEL_ID,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            # vLLM binds a CPU worker's threads to the first cores of its NUMA node: every node
            # of a test on the same core, one fast stream starving the others and the test's
            # own process for seconds. Unbound, the kernel spreads them.
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            # A process that crashes in native code (a worker that "died unexpectedly") leaves
            # its Python stack in the node's log.
            "PYTHONFAULTHANDLER": "1",
            **self.env,
        }

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "vllm_acs.cli", "serve", *self.serve_args]

    def start(self) -> ServerProcess:
        env, command = self.environment, self.command
        self._log = open(self.log_path, "wb")  # noqa: SIM115  # closed in stop()
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        atexit.register(self.stop)
        STARTED.append(self)
        self._wait_healthy()
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                self.stop()  # forgets the process
                raise RuntimeError(f"server exited with {code}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"server not healthy after {STARTUP_TIMEOUT_S}s:\n{self.log_tail()}")

    def cli(self, *args: str) -> Any:
        """Runs `vllm-acs ARGS --json` against this server's database; returns the parsed JSON."""
        env = {**os.environ, **self.env}
        done = subprocess.run(
            [sys.executable, "-m", "vllm_acs.cli", *args, "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"vllm-acs {' '.join(args)} failed: {done.stderr[-2000:]}")
        return json.loads(done.stdout)

    def create_key(self, account: str = "e2e", *key_args: str) -> str:
        """A new key's secret, on an approved account, created while the server runs."""
        return self.create_key_record(account, *key_args)["key"]

    def create_key_record(self, account: str = "e2e", *key_args: str) -> dict[str, Any]:
        """`keys create --json` (key, id, prefix...), making the account approved if it is new."""
        accounts = {a["name"] for a in self.cli("accounts", "list")}
        if account not in accounts:
            self.cli("accounts", "create", account, "--approved")
        return self.cli("keys", "create", "--account", account, *key_args)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples called `name` in the node's `/metrics` (0 when it has none);
        with `labels`, of those samples whose labels have these values."""
        from prometheus_client.parser import text_string_to_metric_families

        response = httpx.get(f"{self.base_url}/metrics", timeout=30, trust_env=False)
        response.raise_for_status()
        return sum(
            sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )

    def wait_for_metric(self, name: str, value: float, timeout_s: float = 30.0) -> None:
        """Until the node's `name` reads `value`; an AssertionError with the log tail if never."""
        deadline = time.monotonic() + timeout_s
        while (seen := self.metric(name)) != value:
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} is {seen}, not {value}:\n{self.log_tail()}")
            time.sleep(0.2)

    def wait_until_quiet(self, busy_share: float = 0.2, timeout_s: float = 15.0) -> None:
        """Until the node uses under `busy_share` of one core over half a second.

        After each step vLLM's worker busy-loops (sched_yield) for about 1 s before it sleeps on
        its queue; on two cores a node doing that slows its neighbour's next request several
        times over (a 5-token answer took 0.84 s instead of 0.1 s). A test that times a request
        waits for the other nodes to be quiet first."""
        assert self.process is not None, "the node is not running"
        deadline = time.monotonic() + timeout_s
        while True:
            used = group_cpu_seconds(self.process.pid)
            time.sleep(0.5)
            if group_cpu_seconds(self.process.pid) - used < busy_share * 0.5:
                return
            assert time.monotonic() < deadline, f"the node is still busy after {timeout_s:.0f} s"

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to the whole group, SIGKILL after a grace period; waits until none is left."""
        if self.process is None:
            return
        pgid = self.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30)
        deadline = time.monotonic() + 10
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self._log.close()
        self.process = None


@contextlib.contextmanager
def running_server(
    model_dir: Path,
    home: Path,
    env: dict[str, str] | None = None,
    extra_args: Sequence[str] = (),
    compiled: bool = False,
) -> Iterator[ServerProcess]:
    """A started server with its own home (database, log), stopped at the end however it ends."""
    server = ServerProcess(
        model_dir=model_dir,
        log_path=home / "server.log",
        env={"VLLM_ACS_HOME": str(home), **(env or {})},
        extra_args=list(extra_args),
        compiled=compiled,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def started(server: ServerProcess) -> Iterator[ServerProcess]:
    """`server` started, and stopped at the end however it ends (a server made by the test)."""
    server.start()
    try:
        yield server
    finally:
        server.stop()
