"""In-process news of running branches: the route that submitted a branch listens to its job.

API server process. The branch job publishes events (`started` with the children, `delta` as a
child's text grows, then `done`, `refused` or `stopped`); a listener that subscribed before the
job started sees all of them. A branch with no listener (its client left) publishes to nobody.
"""

from __future__ import annotations

import asyncio
from typing import Any

Event = dict[str, Any]
ENDS = frozenset({"done", "refused", "stopped"})


class BranchProgress:
    def __init__(self) -> None:
        self._listeners: dict[str, list[asyncio.Queue[Event]]] = {}

    def subscribe(self, job_id: str) -> asyncio.Queue[Event]:
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._listeners.setdefault(job_id, []).append(queue)
        return queue

    def unsubscribe(self, job_id: str, queue: asyncio.Queue[Event]) -> None:
        queues = self._listeners.get(job_id, [])
        if queue in queues:
            queues.remove(queue)
        if not queues:
            self._listeners.pop(job_id, None)

    def publish(self, job_id: str, event: Event) -> None:
        for queue in self._listeners.get(job_id, ()):
            queue.put_nowait(event)
