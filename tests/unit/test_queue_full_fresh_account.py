"""A key made by another process while the node runs: its first stream holds its only slot.

The e2e `test_queue_full_when_running_and_waiting_are_taken` once failed on its first, new account
only. This pins the server's side of that path in process: the account and each key are created
through a second storage handle (as `vllm-acs accounts/keys create` does) after the node's
storage is open, and the node's very first request for them must still count against the key's
`max_running 1 / max_waiting 0` while it streams.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from tests.unit.access_stack import EngineControl, access_stack
from vllm_acs.settings import Settings
from vllm_acs.storage import open_storage


async def _new_key_from_another_process(home: Path, account: str) -> tuple[str, str]:
    """(key id, secret), written by a storage handle of its own, like the operator CLI."""
    cli = await open_storage(Settings(home=home))
    try:
        names = {a.name for a in await cli.accounts.list()}
        if account not in names:
            await cli.accounts.create(account, approved=True)
        found = await cli.accounts.get(account)
        key, secret = await cli.keys.create(found.id, max_running=1, max_waiting=0)
        return key.id, secret
    finally:
        await cli.close()


def test_first_stream_of_a_new_account_holds_the_only_slot(tmp_path: Path):
    async def main() -> None:
        node = await open_storage(Settings(home=tmp_path))
        try:
            app = access_stack(node, EngineControl())
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                for attempt in range(2):  # a new account, then a new key on that account
                    key_id, secret = await _new_key_from_another_process(tmp_path, "queue-lab")
                    headers = {"Authorization": f"Bearer {secret}"}
                    streaming = asyncio.create_task(
                        client.post(
                            "/v1/completions",
                            headers=headers,
                            json={"prompt": "a", "max_tokens": 200, "stream": True, "delay": 0.01},
                        )
                    )
                    while await node.counters.slots(key_id) != (1, 0):
                        assert not streaming.done(), streaming.result().text
                        await asyncio.sleep(0.005)
                    second = await client.post(
                        "/v1/completions", headers=headers, json={"prompt": "a", "max_tokens": 2}
                    )
                    assert second.status_code == 429, (attempt, second.text)
                    assert second.json()["error"]["code"] == "queue_full"
                    assert not streaming.done()  # refused while the first one still ran
                    assert (await streaming).status_code == 200
                    assert await node.counters.slots(key_id) == (0, 0)
        finally:
            await node.close()

    asyncio.run(main())
