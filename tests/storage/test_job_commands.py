"""`vllm-acs jobs list|show|cancel|sweep` on both databases: jobs made through JobRepository with
an explicit clock, then the CLI's main() in this process (one subprocess for the entry point)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.storage.helpers import approved_key, settings_for
from vllm_acs.cli import main
from vllm_acs.storage import open_storage
from vllm_acs.storage.jobs import NewJob

# A minute ago, so the CLI's own clock (cancel) comes after every time the test gives.
T0 = (datetime.now(timezone.utc) - timedelta(minutes=1)).replace(microsecond=0)
REQUEST = {"prompt": "hello", "max_tokens": 4}
BODY = '{"choices":[{"text":" world"}]}'


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def cli(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> Any:
    """Runs `vllm-acs ARGS` in process against `database_url`: JSON (with --json), stdout, or
    with ok=False the stderr of a refusal (exit 1)."""
    monkeypatch.setenv("VLLM_ACS_DATABASE_URL", database_url)
    monkeypatch.setenv("VLLM_ACS_HOME", str(tmp_path))
    monkeypatch.delenv("VLLM_ACS_REDIS_URL", raising=False)

    def run(*args: str, ok: bool = True) -> Any:
        code = main(["jobs", *args])
        done = capsys.readouterr()
        if not ok:
            assert code == 1, done
            return done.err
        assert code == 0, done.err
        return json.loads(done.out) if "--json" in args else done.out

    return run


def _make_jobs(url: str) -> dict[str, Any]:
    """Two keys' jobs: queued (two), succeeded, running. Returns their ids and the keys."""

    async def make() -> dict[str, Any]:
        storage = await open_storage(settings_for(url), upgrade_schema=True)
        try:
            first, _ = await approved_key(storage)
            second, _ = await approved_key(storage)
            repo = storage.jobs

            def new(key: Any) -> NewJob:
                return NewJob("completion", key.id, key.account_id, "tiny", REQUEST)

            queued = await repo.submit(new(first), at(0))
            done = await repo.submit(new(first), at(1))
            running = await repo.submit(new(second), at(2))
            waiting = await repo.submit(new(second), at(3))
            # Claims take the oldest due job: park `queued` (handed back until later), finish
            # `done`, keep `running` under its lease.
            claimed = await repo.claim("node-a", {"tiny"}, at(10), 30.0)
            assert claimed is not None and claimed.id == queued.id
            assert await repo.hand_back(queued.id, 0, "node-a", at(10), not_before=at(3600))
            claimed = await repo.claim("node-a", {"tiny"}, at(11), 30.0)
            assert claimed is not None and claimed.id == done.id
            assert await repo.finish(
                done.id, 0, "node-a", "succeeded", at(12), result_status=200, result_body=BODY
            )
            claimed = await repo.claim("node-a", {"tiny"}, at(13), 30.0)
            assert claimed is not None and claimed.id == running.id
            return {
                "first": first,
                "second": second,
                "queued": queued.id,
                "done": done.id,
                "running": running.id,
                "waiting": waiting.id,
            }
        finally:
            await storage.close()

    return asyncio.run(make())


def test_list_show_cancel_and_sweep(database_url: str, cli: Any):
    ids = _make_jobs(database_url)
    first, second = ids["first"], ids["second"]
    everything = cli("list", "--json")
    assert [j["id"] for j in everything] == [
        ids["waiting"],
        ids["running"],
        ids["done"],
        ids["queued"],
    ]
    assert [j["status"] for j in everything] == ["queued", "running", "succeeded", "queued"]
    assert all("request" not in j and "result_body" not in j for j in everything)
    assert [j["id"] for j in cli("list", "--key", first.prefix, "--json")] == [
        ids["done"],
        ids["queued"],
    ]
    assert [j["id"] for j in cli("list", "--key", second.id, "--status", "queued", "--json")] == [
        ids["waiting"]
    ]
    assert [j["id"] for j in cli("list", "--status", "running", "--json")] == [ids["running"]]
    assert [j["id"] for j in cli("list", "--limit", "1", "--json")] == [ids["waiting"]]
    assert cli("list", "--status", "failed", "--json") == []
    assert cli("list", "--status", "failed") == "no jobs\n"
    assert "no key 'acs-bm-nope'" in cli("list", "--key", "acs-bm-nope", ok=False)
    table = cli("list").splitlines()
    assert table[0].split() == [
        "id",
        "kind",
        "status",
        "model",
        "key",
        "attempt",
        "created",
        "finished",
    ]
    assert table[1].split()[:5] == [ids["waiting"], "completion", "queued", "tiny", second.id]
    assert table[3].split()[-1] == at(12).strftime("%Y-%m-%dT%H:%M:%SZ")

    shown = cli("show", ids["done"], "--json")
    assert shown == {
        "id": ids["done"],
        "kind": "completion",
        "key_id": first.id,
        "account_id": first.account_id,
        "model": "tiny",
        "status": "succeeded",
        "attempt": 0,
        "max_attempts": 3,
        "owner": "node-a",
        "lease_expires_at": None,
        "not_before": None,
        "created_at": at(1).isoformat(),
        "started_at": at(11).isoformat(),
        "finished_at": at(12).isoformat(),
        "updated_at": at(12).isoformat(),
        "result_status": 200,
        "error_code": None,
        "parent_id": None,  # not a harvest's part
        "progress": None,
        "request_bytes": len(json.dumps(REQUEST, separators=(",", ":"))),
        "result_bytes": len(BODY),
    }
    human = cli("show", ids["done"])
    assert f"result_bytes      {len(BODY)}" in human and "lease_expires_at  -" in human
    assert "no job 'job_nope'" in cli("show", "job_nope", ok=False)

    cancelled = cli("cancel", ids["queued"], "--json")
    assert cancelled["status"] == "cancelled" and cancelled["finished_at"] is not None
    assert "cancelled (its node aborts" in cli("cancel", ids["running"])
    assert cli("show", ids["running"], "--json")["status"] == "cancelled"
    assert "already ended: succeeded" in cli("cancel", ids["done"], ok=False)
    assert "already ended: cancelled" in cli("cancel", ids["queued"], "--json", ok=False)
    assert "no job 'job_nope'" in cli("cancel", "job_nope", ok=False)

    # 25 hours on: the queued job expires; the ended ones lose request and result.
    day = cli("sweep", "--now", (T0 + timedelta(hours=25)).isoformat(), "--json")
    assert day == {
        "now": (T0 + timedelta(hours=25)).isoformat(),
        "expired": 1,
        "emptied": 3,
        "deleted": 0,
        "idempotency_deleted": 0,
        "harvest_files": 0,
    }
    expired = cli("show", ids["waiting"], "--json")
    assert expired["status"] == "expired" and expired["request_bytes"] == len(
        json.dumps(REQUEST, separators=(",", ":"))
    )
    emptied = cli("show", ids["done"], "--json")
    assert (emptied["request_bytes"], emptied["result_bytes"]) == (None, None)
    assert emptied["result_status"] == 200 and emptied["status"] == "succeeded"
    assert "already ended: expired" in cli("cancel", ids["waiting"], ok=False)

    # 8 days on: the jobs ended on day 0 are gone; the one expired on day 1 is only emptied.
    week = T0 + timedelta(days=8)
    human = cli("sweep", "--now", week.strftime("%Y-%m-%dT%H:%M:%SZ"))
    assert "0 queued jobs expired, 1 ended jobs emptied" in human and "3 jobs deleted" in human
    (left,) = cli("list", "--json")
    assert (left["id"], left["status"], left["request_bytes"]) == (ids["waiting"], "expired", None)
    assert "no job" in cli("show", ids["done"], ok=False)
    # A naive time is UTC; nothing is left to do on day 8.
    again = cli("sweep", "--now", week.replace(tzinfo=None).isoformat(), "--json")
    assert again["now"] == week.isoformat() and again["deleted"] == again["emptied"] == 0


@pytest.mark.parametrize(
    "args", [["sweep", "--now", "yesterday"], ["list", "--limit", "0"], ["list", "--status", "x"]]
)
def test_bad_arguments_are_refused_by_the_parser(args: list[str], capsys: Any):
    with pytest.raises(SystemExit) as refused:  # before any database is opened
        main(["jobs", *args])
    assert refused.value.code == 2
    assert args[-1] in capsys.readouterr().err


def test_the_entry_point_lists_jobs(database_url: str, tmp_path: Path):
    ids = _make_jobs(database_url)
    env = {**os.environ, "VLLM_ACS_DATABASE_URL": database_url, "VLLM_ACS_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "vllm_acs.cli", "jobs", "list", "--status", "running", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert [j["id"] for j in json.loads(done.stdout)] == [ids["running"]]
