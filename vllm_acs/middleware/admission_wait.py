"""Waiting in a key's queue while watching for the client to go away.

API server process, used by AdmissionMiddleware for a ticket that got a queue place, not a slot.
The body was already read upstream, so `receive()` now completes only on a disconnect (or with a
replayed body, which is kept for the app). Either way nothing is lost for the app.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..storage.counters import Counters, Ticket
from .asgi import Message, Receive


class ClientGone(Exception):
    """The client disconnected while its request waited for a slot."""


async def wait_watching_disconnect(counters: Counters, ticket: Ticket, receive: Receive) -> Receive:
    """Returns once the ticket runs, with a `receive` for the app that replays what was read.

    Raises ClientGone if the client disconnected first; the caller settles the ticket, which
    gives the queue place back.
    """
    kept: list[Message] = []
    watcher: asyncio.Future[Any] = asyncio.ensure_future(receive())
    waiter = asyncio.ensure_future(counters.wait_for_slot(ticket))
    try:
        while not waiter.done():
            await asyncio.wait({watcher, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if watcher.done():
                message = watcher.result()
                if message["type"] == "http.disconnect":
                    raise ClientGone
                kept.append(message)
                watcher = asyncio.ensure_future(receive())
        waiter.result()  # LeaseLost surfaces here
    except BaseException:
        waiter.cancel()
        watcher.cancel()
        raise
    pending = watcher

    async def receive_after_wait() -> Message:
        nonlocal pending
        if kept:
            return kept.pop(0)
        if pending is not None:
            # The receive() started while waiting is the app's next message; reuse it once.
            future, pending = pending, None
            return await future
        return await receive()

    return receive_after_wait
