"""What a harvest's two job kinds share on one node: the engine, the stores, the settings, the
model, and the node's one gate on harvest prompts in the engine.

API server process (built once by `_entry`, used by the harvest kind and the harvest part kind).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import AcsError
from ..jobs.batch_share import BatchGate, BatchScheduling
from ..settings import Settings
from ..storage.counters import Counters
from ..storage.files import FileStore
from ..storage.jobs import JobRepository
from ..storage.usage import UsageRepository, UsageRow
from .inputs import HarvestInput, input_name, load_input


@dataclass(frozen=True)
class HarvestModel:
    """What a harvest needs to know of the model this node serves."""

    id: str
    checkpoint: str
    hidden_size: int
    n_layers: int
    bos_token_id: int | None
    vllm_version: str
    vllm_acs_version: str


class HarvestFailed(Exception):
    def __init__(self, error: AcsError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass
class HarvestContext:
    engine: Any
    files: FileStore
    counters: Counters
    usage: UsageRepository
    settings: Settings
    model: Callable[[], HarvestModel]
    # The submitter now (a key revoked since the submit stops its harvest): an awaitable.
    principal_now: Callable[..., Any]
    jobs: JobRepository
    batch: BatchScheduling = field(default_factory=lambda: BatchScheduling(priority_policy=False))
    # Told of each shard's usage row once it is written (the plugins' acs_usage_recorded).
    on_charged: Callable[[UsageRow], None] | None = None
    # Wakes this node's job runner (parts were queued: claim them now, not at the next poll).
    wake_runner: Callable[[], None] = lambda: None
    # Waits until a job ends (the runner's watch: at once for a job this node ends), or None.
    wait_ended: Callable[[str, float], Awaitable[bool]] | None = None
    _gate: BatchGate | None = None
    _input: tuple[str, HarvestInput] | None = None

    @property
    def gate(self) -> BatchGate:
        """This node's harvest prompts in the engine, whatever part they belong to: all
        `harvest_prompts_in_flight` on a quiet node, fewer beside live traffic. One gate for
        every part run here, so two parts on one node load the engine as one harvest does."""
        if self._gate is None:
            self._gate = self.batch.gate(max(1, self.settings.harvest_prompts_in_flight))
        return self._gate

    async def inputs(self, harvest_id: str) -> HarvestInput:
        """The harvest's prompts, read once per harvest on this node (its parts share them)."""
        if self._input is not None and self._input[0] == harvest_id:
            return self._input[1]
        loaded = await load_input(self.files, input_name(harvest_id))
        self._input = (harvest_id, loaded)
        return loaded
