"""A harvest's result from its parts: the manifest listing every part's shards in order, and
`stats.safetensors` from their statistics merged (Chan et al.'s parallel formula, so equal to a
one-node run's within float rounding; bit-identical when the harvest was one part).

API server process (the harvest kind, once its last part has ended). Reading the parts' files
again gives the same result, so a harvest that crashed mid-merge merges again; once the manifest
is written the merge is done, and its parts' statistics states are deleted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ..errors import InternalError
from ..storage.files import FileStore
from .context import HarvestFailed
from .manifest import Manifest
from .parts import PartManifest, PartPlan, part_manifest_name, part_state_name
from .retention import job_prefix
from .shards import state_from_bytes, stats_bytes
from .stats import LayerStats

MANIFEST = "manifest.json"
STATS = "stats.safetensors"


async def merge_parts(
    files: FileStore, harvest_id: str, plans: Sequence[PartPlan], manifest: Manifest
) -> Manifest:
    """Writes stats.safetensors, then manifest.json (complete, every shard listed): the manifest
    last, so a complete manifest always has its statistics beside it. Then the parts'
    statistics states go: a merge run again (its harvest's node died before the harvest's end
    was recorded) finds the complete manifest and returns it."""
    prefix = job_prefix(harvest_id)
    written = await _merged_before(files, prefix)
    if written is not None:
        return written
    merged: LayerStats | None = None
    states = []
    for plan in plans:
        part = await _complete_part(files, harvest_id, plan)
        states.append(part_state_name(harvest_id, plan.index, len(part.shards)))
        saved = await files.read(states[-1])
        stats = LayerStats.from_state(await asyncio.to_thread(state_from_bytes, saved))
        if merged is None:
            merged = stats
        else:
            merged.merge(stats)
        manifest.shards.extend(part.shards)
    assert merged is not None, "a harvest has at least one part"
    final = await asyncio.to_thread(stats_bytes, merged.final(), manifest.layer_indices)
    await files.write(f"{prefix}/{STATS}", final)
    manifest.complete = True
    await files.write(f"{prefix}/{MANIFEST}", manifest.to_bytes())
    for name in states:
        await files.delete(name)
    return manifest


async def _merged_before(files: FileStore, prefix: str) -> Manifest | None:
    try:
        manifest = Manifest.from_bytes(await files.read(f"{prefix}/{MANIFEST}"))
    except FileNotFoundError:
        return None
    return manifest if manifest.complete else None


async def _complete_part(files: FileStore, harvest_id: str, plan: PartPlan) -> PartManifest:
    try:
        part = PartManifest.from_bytes(await files.read(part_manifest_name(harvest_id, plan.index)))
    except FileNotFoundError:
        part = None
    if part is None or not part.complete or len(part.shards) != plan.n_shards:
        raise HarvestFailed(
            InternalError(
                f"Part {plan.index} of the harvest ended without all of its shards written; "
                "retry the harvest."
            )
        )
    return part
