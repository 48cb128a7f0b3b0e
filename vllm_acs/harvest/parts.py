"""A harvest's parts: consecutive ranges of its shards that any node serving its model claims and
runs, and the files each part keeps while it runs (its own manifest and statistics state).

API server process (the harvest's kinds and its route). The plan is a pure function of the
harvest's request, so every node, and a restarted harvest, cuts the same parts; shard numbers
stay those of a one-node harvest (shard k holds prompts k * shard_size onwards), so the merged
result cannot tell how many nodes ran it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .manifest import ShardEntry
from .retention import job_prefix

PART_KIND = "harvest_part"
# At most this many parts per harvest: a corpus of many shards gets longer parts, not more rows.
MAX_PARTS = 256


@dataclass(frozen=True)
class PartPlan:
    """Part `index` of a harvest: shards first_shard.. first_shard + n_shards - 1, which hold
    prompts first_prompt .. end_prompt - 1."""

    index: int
    first_shard: int
    n_shards: int
    first_prompt: int
    end_prompt: int

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PartPlan:
        return cls(**{name: int(raw[name]) for name in cls.__dataclass_fields__})


def plan_parts(n_prompts: int, shard_size: int, part_shards: int) -> list[PartPlan]:
    """The parts of a harvest of `n_prompts` in shards of `shard_size`: `part_shards` shards each
    (more when that would make more than MAX_PARTS parts), the last one shorter."""
    if n_prompts < 1 or shard_size < 1:
        raise ValueError(f"need n_prompts >= 1 and shard_size >= 1, got {n_prompts}, {shard_size}")
    n_shards = math.ceil(n_prompts / shard_size)
    per_part = max(1, part_shards, math.ceil(n_shards / MAX_PARTS))
    plans = []
    for index, first in enumerate(range(0, n_shards, per_part)):
        count = min(per_part, n_shards - first)
        plans.append(
            PartPlan(
                index=index,
                first_shard=first,
                n_shards=count,
                first_prompt=first * shard_size,
                end_prompt=min(n_prompts, (first + count) * shard_size),
            )
        )
    return plans


def part_id(harvest_id: str, index: int) -> str:
    """The part's job id: the same on every node and every restart, so adding parts twice adds
    nothing."""
    return f"{harvest_id}-p{index:04d}"


def part_manifest_name(harvest_id: str, index: int) -> str:
    return f"{job_prefix(harvest_id)}/_parts/part_{index:04d}.json"


def part_state_name(harvest_id: str, index: int, shards_done: int) -> str:
    """The part's statistics state after `shards_done` of its shards (where a resume starts)."""
    return f"{job_prefix(harvest_id)}/_parts/state_{index:04d}_{shards_done:05d}.safetensors"


@dataclass
class PartManifest:
    """What one part has written: its complete shards (rewritten after each), so a resumed part
    continues after the last one and the merge lists them in order."""

    part: int
    first_shard: int
    n_shards: int
    first_prompt: int
    end_prompt: int
    shards: list[ShardEntry] = field(default_factory=list)
    complete: bool = False

    @classmethod
    def of(cls, plan: PartPlan) -> PartManifest:
        return cls(
            part=plan.index,
            first_shard=plan.first_shard,
            n_shards=plan.n_shards,
            first_prompt=plan.first_prompt,
            end_prompt=plan.end_prompt,
        )

    @property
    def prompts_done(self) -> int:
        """The first prompt of this part not yet in a listed shard."""
        return self.shards[-1].last_prompt + 1 if self.shards else self.first_prompt

    @property
    def next_shard(self) -> int:
        return self.first_shard + len(self.shards)

    def progress(self) -> dict[str, int]:
        """What the harvest's progress adds up over its parts (jobs.progress of the part)."""
        return {
            "shards_done": len(self.shards),
            "prompts_done": sum(s.last_prompt - s.first_prompt + 1 for s in self.shards),
            "rows_done": sum(s.n_tokens for s in self.shards),
        }

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), indent=2).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> PartManifest:
        raw: dict[str, Any] = json.loads(data)
        raw["shards"] = [ShardEntry(**entry) for entry in raw.get("shards", [])]
        return cls(**raw)
