"""A Loom write refused by storage (`LoomLimitReached`) as the client's error, naming the limit.

Pure (API server process): the Loom routes and the branch job answer the same refusals.
"""

from __future__ import annotations

from ..errors import AcsError, LoomCapacity, LoomNodeLimit
from ..storage.errors import LoomLimitReached


def loom_limit_error(error: LoomLimitReached, doing: str = "") -> AcsError:
    """409 `loom_node_limit` for one Loom's Nodes or bytes; 429 `loom_capacity` for the key's
    Looms or their bytes. `doing` ends the message (e.g. "; this branch would pass it")."""
    value = error.value
    if error.limit == "nodes":
        return LoomNodeLimit(f"A Loom holds at most {value} Nodes{doing or '; delete some'}.")
    if error.limit == "bytes":
        return LoomNodeLimit(
            f"A Loom holds at most {value} bytes of text and records (loom_max_bytes)"
            f"{doing or '; delete or shorten some Nodes'}."
        )
    if error.limit == "key_bytes":
        return LoomCapacity(
            f"This API key's Looms hold at most {value} bytes of text and records together "
            f"(loom_bytes_per_key){doing or '; delete some'}."
        )
    return LoomCapacity(f"This API key has {value} Looms, the most it may have; delete some.")
