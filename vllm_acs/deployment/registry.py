"""NodeRegistry: this node in the deployment's model registry, and the live nodes of the others.

API server process, one per process. It announces this node's model and address, beats a
heartbeat every `registry_heartbeat_ms`, and reads the live nodes (heartbeat younger than
`registry_node_ttl_ms`) at most every half beat. A node that refused a forwarded connection is
ejected at once, until it beats again after the ejection: no request waits out its TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import Callable
from datetime import datetime

from ..served_model import ServedModel
from ..storage.registry import NodeVersions, RegisteredNode, RegistryRepository

logger = logging.getLogger(__name__)
# A node's row is deleted after it was silent this many TTLs (it is long gone).
FORGET_AFTER_TTLS = 30


class NodeRegistry:
    def __init__(
        self,
        repository: RegistryRepository,
        node_id: str,
        address: str,
        model: Callable[[], ServedModel | None],
        *,
        heartbeat_s: float,
        ttl_s: float,
        clock: Callable[[], datetime],
        default_model: str | None = None,
        versions: NodeVersions | None = None,
    ) -> None:
        self.repository = repository
        # What this node runs (the plugin's and vLLM's versions), shown in the console's Nodes.
        self.versions = versions
        self.node_id = node_id
        self.address = address
        self.model = model
        # The deployment's default model (settings.default_model): None, this node's own.
        self.default_model = default_model
        self.heartbeat_s = heartbeat_s
        self.ttl_s = ttl_s
        self.clock = clock
        self._live: list[RegisteredNode] = []
        self._read_at = float("-inf")
        self._ejected: dict[str, datetime] = {}
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._turns = itertools.count()

    async def start(self) -> None:
        await self._announce()
        self._task = asyncio.create_task(self._beat_loop(), name="acs-registry-heartbeat")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self.repository.leave(self.node_id)

    async def _announce(self) -> None:
        served = self.model()
        if served is not None:
            await self.repository.announce(
                self.node_id, self.address, served, self.clock(), versions=self.versions
            )

    async def _beat_loop(self) -> None:
        beats = 0
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                if not await self.repository.beat(self.node_id, self.clock()):
                    await self._announce()
                beats += 1
                if beats % 30 == 0:
                    await self.repository.forget_older_than(
                        self.clock(), self.ttl_s * FORGET_AFTER_TTLS
                    )
            except Exception:
                logger.exception("registry heartbeat failed; retrying")

    async def live(self) -> list[RegisteredNode]:
        """The live nodes of the deployment (this one included), ejected ones left out."""
        loop = asyncio.get_running_loop()
        async with self._lock:
            if loop.time() - self._read_at >= self.heartbeat_s / 2:
                try:
                    self._live = await self.repository.live(self.clock(), self.ttl_s)
                    self._read_at = loop.time()
                except Exception:
                    logger.exception("reading the model registry failed; using the last read")
        return [node for node in self._live if not self._is_ejected(node)]

    def _is_ejected(self, node: RegisteredNode) -> bool:
        since = self._ejected.get(node.id)
        if since is None:
            return False
        if node.heartbeat_at > since:  # it beat after the ejection: back in
            del self._ejected[node.id]
            return False
        return True

    def eject(self, node_id: str) -> None:
        """A connection to this node failed: leave it out until it beats again."""
        logger.warning("ejecting node %s from forwarding: its connection failed", node_id)
        self._ejected[node_id] = self.clock()

    async def nodes_for(self, model_id: str) -> list[RegisteredNode]:
        """Other live nodes serving `model_id`, in turns (each call starts at the next one)."""
        found = [n for n in await self.live() if n.model.id == model_id and n.id != self.node_id]
        if len(found) > 1:
            turn = next(self._turns) % len(found)
            found = found[turn:] + found[:turn]
        return found

    async def models(self) -> list[ServedModel]:
        """Every live model of the deployment once: this node's own first."""
        own = self.model()
        seen: dict[str, ServedModel] = {}
        if own is not None:
            seen[own.id] = own
        for node in await self.live():
            # Another node's model is the default only when the deployment names it so.
            default = node.model.id == self.default_model
            seen.setdefault(node.model.id, dataclasses.replace(node.model, default=default))
        return list(seen.values())

    async def serving(self, model_id: str) -> int | None:
        """How many live nodes serve `model_id`: this one always while it serves it (it is
        answering, so its engine is up, whatever its last heartbeat), the others by heartbeat.
        0 when only silent nodes still in the registry served it; None for a model no node did.
        """
        own = self.model()
        count = int(own is not None and own.id == model_id)
        others = [n for n in await self.live() if n.id != self.node_id]
        count += sum(1 for node in others if node.model.id == model_id)
        if count or model_id in await self.repository.model_ids():
            return count
        return None
